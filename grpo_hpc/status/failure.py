"""Why a run ended badly, in words (pure): the class of the trainer's exit, the FLAG
column's words and the one-run view's lines, and what the monitor did or would do. Read by
grpo-status's table and run view (:mod:`grpo_hpc.status.view`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from grpo_hpc.core.progress import TrainState
from grpo_hpc.core.runs import RUNNING_STATES
from grpo_hpc.core.slurm import ACTIVE_STATES
from grpo_hpc.status.termviz import cut

if TYPE_CHECKING:
    from grpo_hpc.status.view import RunRow

EXIT_CLASSES = {
    1: "crash",
    2: "config error",
    3: "circuit breaker",
    4: "stalled",
    5: "checkpointed, resubmit me",
    6: "out of GPU memory",
}
"""What each trainer exit code means (docs/exit-codes.md, grpo_hpc.core.errors.ExitCode)."""
REASON_WIDTH = 40
"""Characters of the reason the table's FLAG column shows (the run view shows it whole)."""
MONITOR_DID = {
    "STOP": "stopped",
    "RESUBMIT": "resubmitted",
    "CANCEL_AND_RESUBMIT": "cancelled and resubmitted",
    "WAIT": "resubmits after a backoff",
    "NONE": "nothing yet",
    "DONE": "done",
}
"""What a logged monitor decision did (or, for WAIT, will do), in words."""
MONITOR_WOULD = {
    "STOP": "stop",
    "RESUBMIT": "resubmit",
    "CANCEL_AND_RESUBMIT": "cancel and resubmit",
    "WAIT": "resubmit after a backoff",
    "NONE": "nothing",
    "DONE": "nothing (done)",
}
"""What ``grpo-monitor`` would do, where it has logged no decision, in words."""


def exit_class(
    exit_code: int | None, state: str | None, collapsed: bool = False, before_training: bool = False
) -> str | None:
    """The class of a trainer's exit (pure; docs/exit-codes.md): its code's meaning, a
    circuit breaker that was a collapse stop (``collapsed``: the trainer's collapse STOP
    event) as ``collapse``, a signal before the attempt's first step (``before_training``)
    as ``stopped before training``; a failed record without a code as a crash. None for a
    run still going or finished."""
    if exit_code == 3 and collapsed:
        return "collapse"
    if exit_code == 5 and before_training:
        return "stopped before training"
    if exit_code in EXIT_CLASSES:
        return EXIT_CLASSES[exit_code]
    return "crash" if state == TrainState.FAILED.value else None


def ended_badly(row: RunRow) -> bool:
    """The trainer ended without finishing (pure): failed, or interrupted while its job is
    no longer queued or running (a job Slurm requeued is not an end)."""
    if row.train_state == TrainState.FAILED.value:
        return True
    gone = row.slurm_state not in RUNNING_STATES and row.slurm_state not in ACTIVE_STATES
    return row.train_state == TrainState.INTERRUPTED.value and gone


def monitor_answer(row: RunRow, whole: bool = False) -> str | None:
    """What the monitor did about the run's newest job (its logged decision), else what it
    would do (``monitor_next_*``), in words (pure); ``whole`` adds the decision's reason.
    None where neither is known (no job recorded)."""
    if row.monitor_action is not None:
        words = MONITOR_DID.get(row.monitor_action, row.monitor_action)
        text = f"monitor: {words}" + (f" ({row.monitor_class})" if row.monitor_class else "")
        return text + (f": {row.monitor_reason}" if whole and row.monitor_reason else "")
    if row.monitor_next_action is not None:
        words = MONITOR_WOULD.get(row.monitor_next_action, row.monitor_next_action)
        text = f"monitor would {words}"
        if whole:
            text = f"no monitor decision logged; grpo-monitor would {words}"
            text += f": {row.monitor_next_reason}" if row.monitor_next_reason else ""
        return text
    return None


def failure_flags(row: RunRow, width: int = REASON_WIDTH) -> list[str]:
    """The FLAG column's words for a run that ended badly (pure): ``failed (crash):
    <reason cut to width>``, and what the monitor would do where it logged nothing (a
    logged decision has its own flag: stopped, backoff, budget exhausted). A failed run
    the monitor stopped shows its reason too."""
    reason = " ".join((row.end_reason or "").split())
    if not ended_badly(row) or (row.monitor_action == "STOP" and not (reason or row.exit_class)):
        return []  # a bare "failed" beside "stopped: ..." would add nothing
    head = "failed" if row.train_state == TrainState.FAILED.value else "interrupted"
    head += f" ({row.exit_class})" if row.exit_class else ""
    flags = [head + (f": {cut(reason, width)}" if reason else "")]
    if row.monitor_action is None and row.monitor_next_action is not None:
        flags.append(monitor_answer(row) or "")
    return flags


def failure_lines(row: RunRow) -> list[str]:
    """The one-run view's account of a run that ended badly (pure): how it ended, the whole
    reason, and the monitor's answer; none for a run that did not."""
    if not ended_badly(row):
        return []
    code = f", exit {row.exit_code}" if row.exit_code is not None else ""
    cls = f" ({row.exit_class})" if row.exit_class else ""
    at = f" at step {row.step}/{row.max_steps}" if row.step is not None else ""
    lines = [f"ended: {row.train_state}{code}{cls}{at}"]
    lines.append(f"reason: {row.end_reason or 'none recorded (progress.json has no reason)'}")
    answer = monitor_answer(row, whole=True)
    lines.append(answer or "monitor: no job recorded for this run (jobs.jsonl): not watched")
    return lines
