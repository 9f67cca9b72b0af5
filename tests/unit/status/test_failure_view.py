"""grpo-status says why a run ended badly: the trainer's reason, the exit class and what the
monitor did or would do, cut to fit in the table and whole in the one-run view."""

from __future__ import annotations

import dataclasses
import io
import time
from pathlib import Path

import pytest
from rich.console import Console

from grpo_hpc.core.fsutil import append_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import ProgressRecord, TrainState, write_progress
from grpo_hpc.status.report import collect_detail, collect_rows
from grpo_hpc.status.view import (
    REASON_WIDTH,
    RunDetail,
    RunRow,
    build_details,
    build_table,
    ended_badly,
    exit_class,
    failure_flags,
    failure_lines,
    row_flags,
)

NOW = 1_700_000_000.0
REASON = (
    "NotImplementedError: OptimState8bit dispatch: attempting to run unimplemented operator/"
    "function: func=<OpOverload(op='aten._foreach_lerp_', overload='Scalar')>"
)
CRASHED = RunRow(
    run="crashed", job_id="4711", slurm_state="LOCAL_EXITED", train_state="failed", step=3,
    max_steps=20, exit_code=1, end_reason=REASON, exit_class="crash",
    monitor_next_action="WAIT",
    monitor_next_reason="job LOCAL_EXITED at step 3/20: NotImplementedError: ...; retry crash "
    "1/3 in 30 s",
)  # fmt: skip


def render(renderable: object, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


@pytest.mark.parametrize(
    ("code", "state", "collapsed", "before", "cls"),
    [
        (1, "failed", False, False, "crash"),
        (2, "failed", False, False, "config error"),
        (3, "failed", False, False, "circuit breaker"),
        (3, "failed", True, False, "collapse"),
        (4, "failed", False, False, "stalled"),
        (5, "interrupted", False, False, "checkpointed, resubmit me"),
        (5, "interrupted", False, True, "stopped before training"),
        (6, "failed", False, False, "out of GPU memory"),
        (None, "failed", False, False, "crash"),  # failed with no code recorded
        (0, "finished", False, False, None),
        (None, "training", False, False, None),
    ],
)
def test_exit_class_follows_the_documented_codes(
    code: int | None, state: str, collapsed: bool, before: bool, cls: str | None
) -> None:
    assert exit_class(code, state, collapsed, before) == cls


def test_ended_badly_is_failed_or_interrupted_with_its_job_gone() -> None:
    assert ended_badly(CRASHED)
    stopped = RunRow(run="r", train_state="interrupted", slurm_state="LOCAL_EXITED")
    assert ended_badly(stopped)
    for state in ("PENDING", "REQUEUED", "RUNNING", "LOCAL_RUNNING"):  # still its job's
        assert not ended_badly(dataclasses.replace(stopped, slurm_state=state)), state
    assert not ended_badly(RunRow(run="r", train_state="finished"))
    assert not ended_badly(RunRow(run="r", train_state="training"))


def test_flag_gives_the_class_the_cut_reason_and_the_monitors_answer() -> None:
    flags = row_flags(CRASHED, NOW)
    assert flags == [
        f"failed (crash): {REASON[: REASON_WIDTH - 3]}...",
        "monitor would resubmit after a backoff",
    ]
    # a logged decision is the monitor's answer: its own flag, no guess beside it
    stopped = dataclasses.replace(
        CRASHED, monitor_action="STOP", monitor_class="budget_exhausted", exit_code=1
    )
    assert row_flags(stopped, NOW) == ["budget exhausted", flags[0]]
    config = dataclasses.replace(
        CRASHED, exit_class="config error", end_reason="bad.jsonl:2: not valid JSON",
        monitor_action="STOP", monitor_class="config_error",
    )  # fmt: skip
    assert row_flags(config, NOW) == [
        "stopped: config_error",
        "failed (config error): bad.jsonl:2: not valid JSON",
    ]
    assert failure_flags(RunRow(run="r", train_state="training")) == []


def test_one_run_view_has_the_whole_reason_and_the_monitors_reason() -> None:
    lines = failure_lines(CRASHED)
    assert lines == [
        "ended: failed, exit 1 (crash) at step 3/20",
        f"reason: {REASON}",
        f"no monitor decision logged; grpo-monitor would resubmit after a backoff: "
        f"{CRASHED.monitor_next_reason}",
    ]
    logged = dataclasses.replace(
        CRASHED, monitor_action="STOP", monitor_class="budget_exhausted",
        monitor_reason="retry budget exhausted (crash 3/3)",
    )  # fmt: skip
    assert failure_lines(logged)[-1] == (
        "monitor: stopped (budget_exhausted): retry budget exhausted (crash 3/3)"
    )
    unwatched = dataclasses.replace(CRASHED, monitor_next_action=None, end_reason=None)
    assert failure_lines(unwatched)[1:] == [
        "reason: none recorded (progress.json has no reason)",
        "monitor: no job recorded for this run (jobs.jsonl): not watched",
    ]
    text = render(build_details(RunDetail(CRASHED, [], [], [], []), NOW), 400)
    assert REASON in text and "ended: failed, exit 1 (crash)" in text


@pytest.mark.parametrize("width", [80, 120, 160])
def test_the_table_keeps_within_the_terminal(width: int) -> None:
    slurm = dataclasses.replace(CRASHED, run="gsm8k-a", slurm_state="FAILED")
    text = render(
        build_table([slurm, dataclasses.replace(slurm, run="gsm8k-b")], NOW, width=width), width
    )
    assert max(len(line) for line in text.splitlines()) <= width
    words = " ".join(text.split())
    # the FLAG column wraps; an exception's name longer than it folds, it is not cut
    assert "failed (crash):" in words and "monitor would" in words
    assert "NotImplementedError" in text.replace("\n", "").replace(" ", "")
    assert REASON not in words  # cut in the table: whole in the run view


def _crashed_run(root: Path, name: str, executor: str, decision: dict | None = None) -> RunPaths:
    paths = RunPaths(root / name)
    paths.root.mkdir(parents=True)
    job = {"job_id": "999999999", "attempt": 0, "submitted_at": time.time() - 60,
           "reason": "initial submission", "profile": "local", "executor": executor}  # fmt: skip
    append_jsonl(paths.jobs, job)
    rec = ProgressRecord(
        run=name, state=TrainState.FAILED, step=3, max_steps=20, exit_code=1, reason=REASON,
        heartbeat=time.time() - 30,
    )  # fmt: skip
    write_progress(paths.progress, rec)
    if decision is not None:
        append_jsonl(paths.events, {"time": time.time(), "job_id": "999999999", **decision})
    return paths


def test_rows_read_the_reason_and_ask_the_monitors_rule(tmp_path: Path) -> None:
    _crashed_run(tmp_path, "a-unwatched", "local")
    stop = {"phase": "decision", "action": "STOP", "class": "budget_exhausted",
            "reason": "retry budget exhausted (crash 3/3)"}  # fmt: skip
    _crashed_run(tmp_path, "b-stopped", "local", stop)
    unwatched, stopped = collect_rows(tmp_path)
    assert (unwatched.exit_code, unwatched.exit_class, unwatched.end_reason) == (1, "crash", REASON)
    # decide(): a crash of an ended job is retried after the first backoff
    assert unwatched.monitor_next_action == "WAIT"
    assert "retry crash 1/3 in 30 s" in (unwatched.monitor_next_reason or "")
    assert stopped.monitor_action == "STOP" and stopped.monitor_next_action is None
    detail = collect_detail(RunPaths(tmp_path / "a-unwatched"))
    assert failure_lines(detail.row)[0] == "ended: failed, exit 1 (crash) at step 3/20"
