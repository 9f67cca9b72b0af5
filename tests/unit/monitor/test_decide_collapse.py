"""The monitor's row for a run the trainer stopped for collapse (training.on_collapse=stop):
the collapse STOP event of this job plus exit 3 is STOP collapsed, never resubmitted; the
same event of an earlier job, or a FLAG, changes nothing."""

from __future__ import annotations

from grpo_hpc.core.progress import ProgressRecord, TrainState
from grpo_hpc.core.runs import JobView
from grpo_hpc.monitor.decision import (
    ActionKind,
    FailureClass,
    MonitorPolicy,
    decide,
    history_from,
)

NOW = 1_000_000.0
REASON = "collapse (no_signal) at step 10: 8 of the last 10 steps trained nothing"


def _event(job_id: str, action: str) -> dict:
    return {"time": NOW - 5, "job_id": job_id, "slurm_state": None, "phase": "collapse",
            "action": action, "class": "collapsed", "reason": REASON, "step": 10}  # fmt: skip


def _decide(events: list[dict], exit_code: int | None, state: str = "FAILED"):
    jobs = [
        {"job_id": "99", "submitted_at": NOW - 900},
        {"job_id": "100", "submitted_at": NOW - 600},
    ]
    progress = ProgressRecord(
        run="r", job_id="100", state=TrainState.FAILED, step=10, max_steps=40,
        heartbeat=NOW - 5, started_at=NOW - 500, exit_code=exit_code, reason=REASON,
    )  # fmt: skip
    job = JobView(job_id="100", state=state, submitted_at=NOW - 600)
    return decide(progress, job, history_from(events, jobs), NOW, MonitorPolicy())


def test_a_collapse_stop_is_final_and_says_why() -> None:
    for state in ("FAILED", "COMPLETED", "RUNNING"):
        a = _decide([_event("100", "STOP")], exit_code=3, state=state)
        assert (a.kind, a.failure_class) == (ActionKind.STOP, FailureClass.COLLAPSED)
        assert REASON in a.reason and "never resubmitted" in a.reason


def test_a_flag_or_an_earlier_jobs_stop_leaves_the_usual_rows() -> None:
    flagged = _decide([_event("100", "FLAG")], exit_code=3)
    assert flagged.failure_class is FailureClass.CIRCUIT_BREAKER  # exit 3 of another cause
    earlier = _decide([_event("99", "STOP")], exit_code=None, state="TIMEOUT")
    assert earlier.kind is ActionKind.RESUBMIT  # a new job: the old collapse is history
    assert history_from([_event("100", "STOP")], [{"job_id": "100"}]).collapse_stop == REASON
