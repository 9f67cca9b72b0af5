"""decide(): a run that ran out of memory stops instead of failing again (pure table rows)."""

from __future__ import annotations

from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.progress import ProgressRecord, TrainState
from grpo_hpc.core.runs import JobView
from grpo_hpc.monitor.decision import ActionKind, FailureClass, RunHistory, decide

NOW = 1_000_000.0


def _rec(**kw: object) -> ProgressRecord:
    base: dict = dict(run="r", job_id="7", step=3, max_steps=10, heartbeat=NOW - 5)
    return ProgressRecord(**{**base, **kw})


def test_trainer_oom_stops_with_its_reason() -> None:
    why = "CUDA out of memory while training at step 3 (peak 31.2 GiB allocated of 32 GiB); x"
    rec = _rec(state=TrainState.FAILED, exit_code=int(ExitCode.OUT_OF_MEMORY), reason=why)
    for state in ("FAILED", "LOCAL_EXITED", "COMPLETED"):
        a = decide(rec, JobView("7", state), RunHistory(), NOW)
        assert a.kind is ActionKind.STOP and a.failure_class is FailureClass.OUT_OF_MEMORY
        assert why in a.reason and "never resubmitted unchanged" in a.reason


def test_slurm_out_of_memory_stops() -> None:
    a = decide(_rec(state=TrainState.TRAINING), JobView("7", "OUT_OF_MEMORY"), RunHistory(), NOW)
    assert a.kind is ActionKind.STOP and a.failure_class is FailureClass.OUT_OF_MEMORY
    assert "host memory" in a.reason and "mem_gb" in a.reason and "step 3/10" in a.reason


def test_other_failures_still_retry() -> None:
    rec = _rec(state=TrainState.FAILED, exit_code=int(ExitCode.CRASH), reason="boom")
    a = decide(rec, JobView("7", "FAILED"), RunHistory(), NOW)
    assert a.kind in (ActionKind.RESUBMIT, ActionKind.WAIT)
    assert a.failure_class is FailureClass.CRASH
