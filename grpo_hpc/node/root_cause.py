"""Which process of a job died first, from torchrun's own report (pure).

When a worker dies of a signal (SIGKILL from the kernel's OOM killer or a user, a segfault)
it records nothing itself: progress.json would say only "job FAILED exit 1". torchrun's
agent prints a "Root Cause (first observed failure)" block naming the rank, its pid, host
and exit code; the per-node launcher (grpo_hpc.node.launch) keeps the tail of torchrun's
output, reads that block here, and puts the rank's death into the record's reason.
"""

from __future__ import annotations

import dataclasses
import re
import signal
from dataclasses import dataclass

from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.progress import ProgressRecord, TrainState

_BLOCK = "Root Cause (first observed failure):"
_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:\s*(.*?)\s*$")


@dataclass(frozen=True)
class RootCause:
    """The first failure torchrun observed on this node."""

    rank: int
    host: str
    exitcode: int
    pid: int | None

    @property
    def signal_name(self) -> str | None:
        """SIGKILL etc. when the process died of a signal (torchrun: negative exit code)."""
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"


def parse(text: str) -> RootCause | None:
    """The last root-cause block of torchrun's output, None without one."""
    at = text.rfind(_BLOCK)
    if at < 0:
        return None
    fields: dict[str, str] = {}
    for line in text[at + len(_BLOCK) :].splitlines()[1:12]:
        m = _FIELD.match(line)
        if m:
            fields.setdefault(m.group(1), m.group(2))
    try:
        rank = int(fields["rank"].split()[0])
        code = fields["exitcode"].split()
        exitcode = int(code[0])
    except (KeyError, ValueError, IndexError):
        return None
    pid = re.search(r"pid:\s*(\d+)", fields.get("exitcode", ""))
    return RootCause(rank, fields.get("host", "?"), exitcode, int(pid.group(1)) if pid else None)


def death_line(cause: RootCause, step: int, role: str | None = None) -> str | None:
    """The reason a death by signal gets (None for an ordinary non-zero exit, whose rank
    printed its own error); ``role``: what the rank did where the job's ranks differ
    (``generator (rank 1, pid ... on ...)``; None: ``rank 1 (pid ... on ...)``)."""
    sig = cause.signal_name
    if sig is None:
        return None
    pid = f"pid {cause.pid} " if cause.pid is not None else ""
    who = f"{role} (rank {cause.rank}, " if role else f"rank {cause.rank} ("
    hint = " (the kernel's out-of-memory killer sends SIGKILL too: check the node's memory)"
    return f"{who}{pid}on {cause.host}) was killed by {sig} at step {step}" + (
        hint if sig == "SIGKILL" else ""
    )


STOP_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM")
"""The signals a trainer answers by saving and exiting 5 (train/supervision/signals.py):
a process ended by one of them was stopped, not killed."""


def _saved_after_a_kill(rec: ProgressRecord, cause: RootCause) -> bool:
    """The trainer saved and exited 5 after another process was killed (pure): torchrun
    ends the survivors of a death with SIGTERM, which a trainer that can save alone (a
    split run's, its generator killed) answers as a stop signal. The job ended by the
    death, not by a stop: no preemption. Rank 0 is the one that records (trainer 0): its
    own death after its checkpoint's record leaves the record as it is."""
    stopped = rec.state is TrainState.INTERRUPTED or rec.exit_code == int(ExitCode.CHECKPOINTED)
    return stopped and cause.rank != 0 and cause.signal_name not in (None, *STOP_SIGNALS)


def explained(
    rec: ProgressRecord | None, cause: RootCause, started: float, role: str | None = None
) -> ProgressRecord | None:
    """The record with the death in its reason, or None when it needs no change: a record
    of an earlier attempt is replaced only when this one wrote none; a failure the trainer
    classified itself (stalled, out of memory, a stop signal's checkpoint...) keeps its
    reason; a crash it recorded (a peer's death seen as a broken collective), or a
    checkpoint it saved on the SIGTERM torchrun sent after the death (a split run's
    trainer, its generator killed), gets the death in front and becomes a crash."""
    if rec is None or rec.heartbeat < started:
        return None  # this attempt wrote no record: the trainer never started
    line = death_line(cause, rec.step, role)
    if line is None or rec.state is TrainState.FINISHED:
        return None
    kept = rec.state.terminal and rec.exit_code not in (None, int(ExitCode.CRASH))
    if kept and not _saved_after_a_kill(rec, cause):
        return None
    reason = f"{line}; then: {rec.reason}" if rec.state.terminal and rec.reason else line
    return dataclasses.replace(
        rec, state=TrainState.FAILED, exit_code=int(ExitCode.CRASH), reason=reason
    )
