"""Which stall limit judges a live trainer in which state: a slow model load (LOADING) is
judged by step0_timeout only, a trainer past it by its heartbeat too; grpo-status's
STALLED flag follows the same rule."""

from __future__ import annotations

import pytest

from grpo_hpc.core.progress import ProgressRecord, TrainState
from grpo_hpc.core.runs import JobView
from grpo_hpc.monitor.decision import (
    ActionKind,
    FailureClass,
    MonitorPolicy,
    RunHistory,
    StallLimit,
    decide,
    stall_limits,
)
from grpo_hpc.status.view import RunRow, row_flags

NOW = 1_000_000.0
POLICY = MonitorPolicy(step0_timeout_s=1800, heartbeat_timeout_s=600)


def live(state: TrainState, age_s: float, heartbeat_age_s: float, **kw: object) -> ProgressRecord:
    """This job's record of an attempt started ``age_s`` ago, last beating
    ``heartbeat_age_s`` ago."""
    base: dict = dict(run="r", job_id="100", state=state, max_steps=100)
    base.update(kw)
    return ProgressRecord(heartbeat=NOW - heartbeat_age_s, started_at=NOW - age_s, **base)


def judge(progress: ProgressRecord):
    j = JobView(job_id="100", state="RUNNING", submitted_at=NOW - 3600, started_at=NOW - 3600)
    return decide(progress, j, RunHistory(), NOW, POLICY)


@pytest.mark.parametrize(
    ("state", "trained", "limits"),
    [
        (TrainState.LOADING, False, (StallLimit.STEP0,)),
        (TrainState.LOADING, True, (StallLimit.HEARTBEAT,)),  # no live state goes unjudged
        (TrainState.GENERATING, False, (StallLimit.STEP0, StallLimit.HEARTBEAT)),
        (TrainState.EVALUATING, False, (StallLimit.STEP0, StallLimit.HEARTBEAT)),
        (TrainState.TRAINING, True, (StallLimit.HEARTBEAT,)),
        (TrainState.CHECKPOINTING, True, (StallLimit.HEARTBEAT,)),
        (TrainState.FINISHED, True, ()),
        (TrainState.FAILED, False, ()),
    ],
)
def test_stall_limits_by_state(state: TrainState, trained: bool, limits: tuple) -> None:
    assert stall_limits(state, trained) == limits


def test_a_slow_load_is_not_a_heartbeat_stall() -> None:
    """15 minutes loading, the heartbeat as old: under step0_timeout 30 min, no cancel."""
    a = judge(live(TrainState.LOADING, age_s=900, heartbeat_age_s=900))
    assert (a.kind, a.failure_class, a.cancel) == (ActionKind.NONE, None, False)
    assert a.reason == "loading for 15 min (judged by step0_timeout 30 min)"


def test_a_resumed_attempt_loading_its_checkpoint_is_not_a_heartbeat_stall() -> None:
    progress = live(TrainState.LOADING, 900, 900, step=40, start_step=40, restarts=1)
    assert judge(progress).kind is ActionKind.NONE


def test_a_trainer_past_loading_with_an_old_heartbeat_is_stalled() -> None:
    a = judge(live(TrainState.TRAINING, age_s=3600, heartbeat_age_s=900, step=12))
    assert (a.kind, a.failure_class, a.cancel) == (
        ActionKind.CANCEL_AND_RESUBMIT,
        FailureClass.STALLED_HEARTBEAT,
        True,
    )
    assert "no heartbeat for 15 min > heartbeat_timeout 10 min (training, step 12)" in a.reason
    # at step 0 too, once generating: the engine beats every few tokens
    a = judge(live(TrainState.GENERATING, age_s=900, heartbeat_age_s=900))
    assert a.failure_class is FailureClass.STALLED_HEARTBEAT


def test_a_load_past_step0_timeout_is_a_step0_stall() -> None:
    a = judge(live(TrainState.LOADING, age_s=1860, heartbeat_age_s=5))
    assert (a.kind, a.failure_class, a.cancel) == (
        ActionKind.CANCEL_AND_RESUBMIT,
        FailureClass.STALLED_STEP0,
        True,
    )
    assert a.reason.startswith("step 0 for 31 min > step0_timeout 30 min (loading)")


def test_status_flags_no_stall_while_loading() -> None:
    """grpo-status's STALLED flag follows the monitor: not for an old heartbeat of a load."""
    row = dict(run="r", slurm_state="RUNNING", heartbeat=NOW - 900)
    assert row_flags(RunRow(**row, train_state="loading"), NOW) == []
    assert row_flags(RunRow(**row, train_state="generating"), NOW) == ["stalled 15m"]
