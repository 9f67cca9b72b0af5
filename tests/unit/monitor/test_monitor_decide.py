"""The monitor: decide() row by row with a fake clock, then the shell's idempotence."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from grpo_hpc.cli.monitor import main
from grpo_hpc.core.errors import ConfigError, GrpoError
from grpo_hpc.core.fsutil import append_jsonl, read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import ProgressRecord, TrainState, write_progress
from grpo_hpc.core.runs import JobView, running_since
from grpo_hpc.core.slurm import ACTIVE_STATES, JobRecord
from grpo_hpc.monitor.decision import (
    ActionKind,
    FailureClass,
    MonitorPolicy,
    RunHistory,
    decide,
    history_from,
    pending_intent,
)
from grpo_hpc.monitor.loop import Backend, monitor_pass, monitor_run

NOW = 1_000_000.0
MIN = 60.0
K = ActionKind
C = FailureClass


def rec(**kw: object) -> ProgressRecord:
    base: dict = dict(
        run="r",
        job_id="100",
        state=TrainState.TRAINING,
        step=10,
        max_steps=100,
        heartbeat=NOW - 10,
        started_at=NOW - 10 * MIN,
    )
    base.update(kw)
    return ProgressRecord(**base)


def job(state: str = "RUNNING", **kw: object) -> JobView:
    base: dict = dict(job_id="100", state=state, submitted_at=NOW - 60 * MIN)
    base["started_at"] = NOW - 10 * MIN if state in ("RUNNING", "LOCAL_RUNNING") else None
    base.update(kw)
    return JobView(**base)


def run(progress: ProgressRecord | None, j: JobView, h: RunHistory | None = None, **pol: object):
    return decide(progress, j, h or RunHistory(), NOW, MonitorPolicy(**pol))


# ------------------------------------------------------------------------ running jobs


def test_pending_and_healthy_running_do_nothing() -> None:
    assert run(None, job("PENDING")).kind is K.NONE
    a = run(rec(), job())
    assert a.kind is K.NONE and a.failure_class is None and "step 10/100" in a.reason


def test_step0_stall_from_progress_started_at() -> None:
    a = run(rec(step=0, started_at=NOW - 31 * MIN, heartbeat=NOW - 5), job())
    assert (a.kind, a.failure_class, a.cancel) == (K.CANCEL_AND_RESUBMIT, C.STALLED_STEP0, True)
    assert a.reason.startswith("step 0 for 31 min > step0_timeout 30 min")
    assert "retry stalled 1/3" in a.reason
    assert run(rec(step=0, started_at=NOW - 29 * MIN), job()).kind is K.NONE


def test_no_step_after_resume_is_a_step0_stall() -> None:
    stuck = rec(step=40, start_step=40, started_at=NOW - 31 * MIN, heartbeat=NOW - 5)
    a = run(stuck, job())
    assert (a.kind, a.failure_class) == (K.CANCEL_AND_RESUBMIT, C.STALLED_STEP0)
    assert a.reason.startswith("no step since resuming at step 40 for 31 min")
    moving = rec(step=41, start_step=40, started_at=NOW - 31 * MIN, heartbeat=NOW - 5)
    assert run(moving, job()).kind is K.NONE


def test_step0_stall_without_progress_uses_job_start() -> None:
    assert run(None, job(started_at=NOW - 5 * MIN)).kind is K.NONE
    assert run(None, job(started_at=None)).kind is K.NONE  # cannot judge yet
    a = run(None, job(started_at=NOW - 31 * MIN))
    assert (a.kind, a.failure_class) == (K.CANCEL_AND_RESUBMIT, C.STALLED_STEP0)
    assert "no progress record from job 100" in a.reason


def test_progress_of_previous_job_counts_as_no_progress() -> None:
    old = rec(job_id="99", step=40, heartbeat=NOW - 5 * 3600, state=TrainState.INTERRUPTED)
    assert run(old, job(started_at=NOW - 2 * MIN)).kind is K.NONE  # not a heartbeat stall
    a = run(old, job(started_at=NOW - 40 * MIN))
    assert a.failure_class is C.STALLED_STEP0
    finished_old = rec(job_id="99", state=TrainState.FINISHED, step=100, exit_code=0)
    assert run(finished_old, job("COMPLETED")).failure_class is C.CRASH  # not DONE: not ours


def test_requeued_same_job_id_judged_from_its_restart() -> None:
    saved = rec(state=TrainState.INTERRUPTED, exit_code=5, heartbeat=NOW - 2 * MIN)
    assert run(saved, job(started_at=NOW - 3 * 3600)).kind is K.NONE
    stale = rec(state=TrainState.INTERRUPTED, exit_code=5, heartbeat=NOW - 45 * MIN)
    assert run(stale, job(started_at=NOW - 3 * 3600)).failure_class is C.STALLED_STEP0


def test_heartbeat_stall_at_any_step() -> None:
    a = run(rec(step=40, heartbeat=NOW - 11 * MIN, state=TrainState.GENERATING), job())
    assert (a.kind, a.failure_class) == (K.CANCEL_AND_RESUBMIT, C.STALLED_HEARTBEAT)
    assert "no heartbeat for 11 min > heartbeat_timeout 10 min (generating, step 40)" in a.reason
    assert run(rec(step=40, heartbeat=NOW - 9 * MIN), job()).kind is K.NONE


def test_trainer_failed_but_job_still_running() -> None:
    failed = rec(state=TrainState.FAILED, exit_code=1, reason="boom", heartbeat=NOW - MIN)
    assert run(failed, job()).kind is K.NONE
    hung = rec(state=TrainState.FAILED, exit_code=1, reason="boom", heartbeat=NOW - 20 * MIN)
    a = run(hung, job())
    assert (a.kind, a.failure_class, a.cancel) == (K.CANCEL_AND_RESUBMIT, C.CRASH, True)


# ------------------------------------------------------------------------- ended jobs


@pytest.mark.parametrize(
    ("state", "cls"),
    [
        ("TIMEOUT", C.TIMEOUT),
        ("PREEMPTED", C.PREEMPTED),
        ("CANCELLED", C.PREEMPTED),
        ("DEADLINE", C.TIMEOUT),
    ],
)
def test_progress_classes_resubmit_at_once(state: str, cls: FailureClass) -> None:
    a = run(rec(last_checkpoint=10), job(state))
    assert (a.kind, a.failure_class, a.cancel) == (K.RESUBMIT, cls, False)
    assert "retry preempted 1/20" in a.reason


def test_checkpointed_exit_resubmits_without_backoff() -> None:
    saved = rec(state=TrainState.INTERRUPTED, exit_code=5, reason="SIGUSR1")
    a = run(saved, job("FAILED", exit_code=5))
    assert (a.kind, a.failure_class) == (K.RESUBMIT, C.CHECKPOINTED)


@pytest.mark.parametrize("state", ["PENDING", "REQUEUED", "RUNNING"])
def test_job_that_requeued_itself_is_left_alone(state: str) -> None:
    saved = rec(state=TrainState.INTERRUPTED, exit_code=5, heartbeat=NOW - MIN)
    assert run(saved, job(state)).kind is K.NONE


def test_crash_waits_for_exponential_backoff() -> None:
    crashed = rec(state=TrainState.FAILED, exit_code=1, reason="CUDA error")
    a = run(crashed, job("FAILED", exit_code=1))  # first sight: the backoff starts now
    assert (a.kind, a.failure_class) == (K.WAIT, C.CRASH) and a.wait_s == 30
    assert "CUDA error" in a.reason and "retry crash 1/3 in 30 s" in a.reason
    a = run(crashed, job("FAILED"), RunHistory(last_failure_time=NOW - 31))
    assert (a.kind, a.failure_class) == (K.RESUBMIT, C.CRASH) and "retry crash 1/3" in a.reason
    second = RunHistory(retries={"crash": 1}, last_failure_time=NOW - 31)  # now 60 s
    a = run(crashed, job("FAILED"), second)
    assert a.kind is K.WAIT and a.wait_s == pytest.approx(29)
    assert run(crashed, job("FAILED"), second, backoff_base_s=0).kind is K.RESUBMIT
    assert MonitorPolicy().backoff_s(10) == 900


def test_node_fail_lost_and_stalled_phase_are_failures_with_backoff() -> None:
    h = RunHistory(last_failure_time=NOW - 3600)
    assert run(rec(), job("NODE_FAIL"), h).failure_class is C.NODE_FAIL
    assert "retry lost 1/3" in run(rec(), job("NODE_FAIL"), h).reason
    stalled = rec(state=TrainState.FAILED, exit_code=4, reason="generation > 900 s")
    a = run(stalled, job("FAILED"), h)
    assert (a.kind, a.failure_class) == (K.RESUBMIT, C.STALLED_PHASE)
    crashed = rec(state=TrainState.FAILED, exit_code=1)  # Slurm's OOM kill: never retried
    assert run(crashed, job("OUT_OF_MEMORY"), h).failure_class is C.OUT_OF_MEMORY


@pytest.mark.parametrize(("code", "cls"), [(3, C.CIRCUIT_BREAKER), (2, C.CONFIG_ERROR)])
def test_circuit_breaker_and_config_error_stop(code: int, cls: FailureClass) -> None:
    bad = rec(state=TrainState.FAILED, exit_code=code, reason="reward 0 for 20 steps")
    for state in ("FAILED", "COMPLETED", "RUNNING", "MISSING"):
        a = run(bad, job(state))
        assert (a.kind, a.failure_class) == (K.STOP, cls)
        assert "reward 0 for 20 steps" in a.reason and "never resubmitted" in a.reason


def test_finished_is_done() -> None:
    done = rec(state=TrainState.FINISHED, step=100, exit_code=0)
    a = run(done, job("COMPLETED", exit_code=0))
    assert (a.kind, a.failure_class) == (K.DONE, C.FINISHED)
    assert run(done, job("MISSING")).kind is K.DONE
    assert run(done, job("LOCAL_EXITED")).kind is K.DONE
    early = rec(state=TrainState.TRAINING, step=50)
    a = run(early, job("COMPLETED", exit_code=0), RunHistory(last_failure_time=NOW - 60))
    assert (a.kind, a.failure_class) == (K.RESUBMIT, C.CRASH)


def test_missing_job_is_lost_after_grace() -> None:
    just = job("MISSING", submitted_at=NOW - 30)
    assert run(None, just).kind is K.NONE
    a = run(rec(), job("MISSING"), RunHistory(last_failure_time=NOW - 60))
    assert (a.kind, a.failure_class) == (K.RESUBMIT, C.LOST)
    assert "vanished from squeue and sacct" in a.reason
    assert run(None, job("MISSING")).failure_class is C.LOST


def test_local_executor_states() -> None:
    assert run(rec(job_id="4242"), job("LOCAL_RUNNING", job_id="4242")).kind is K.NONE
    a = run(None, job("LOCAL_EXITED", job_id="4242"))
    assert (a.kind, a.failure_class) == (K.WAIT, C.CRASH)


# ------------------------------------------------------------------------------ budget


def test_class_budget_exhausted_stops() -> None:
    crashed = rec(state=TrainState.FAILED, exit_code=1)
    a = run(crashed, job("FAILED"), RunHistory(retries={"crash": 3}))
    assert (a.kind, a.failure_class) == (K.STOP, C.BUDGET_EXHAUSTED)
    assert a.reason.startswith("retry budget exhausted (crash 3/3)")


def test_total_budget_and_stalled_stop_cancels() -> None:
    h = RunHistory(retries={"crash": 2, "lost": 2, "stalled": 1, "preempted": 7})
    a = run(rec(heartbeat=NOW - 3600), job(), h)
    assert (a.kind, a.cancel) == (K.STOP, True)
    assert "retry budget exhausted (total 5/5)" in a.reason
    assert run(rec(), job("TIMEOUT"), h).kind is K.RESUBMIT  # progress is not a failure
    assert run(rec(), job("TIMEOUT"), RunHistory(retries={"preempted": 20})).kind is K.STOP


def test_stopped_or_done_run_is_left_alone() -> None:
    h = RunHistory(final=K.STOP, final_reason="circuit_breaker")
    assert run(rec(heartbeat=0), job(), h).kind is K.NONE


def test_policy_validation() -> None:
    with pytest.raises(ConfigError):
        MonitorPolicy(heartbeat_timeout_s=-1)
    with pytest.raises(ConfigError, match="unknown retry classes"):
        MonitorPolicy(max_retries_per_class={"oops": 1})


# ------------------------------------------------------------------- history from events


def ev(t: float, job_id: str, action: str, phase: str, cls: str | None = None, **kw) -> dict:
    return {"time": t, "job_id": job_id, "action": action, "phase": phase, "class": cls, **kw}


def test_history_from_events() -> None:
    jobs = [{"job_id": j, "submitted_at": float(i)} for i, j in enumerate(["1", "2", "3"])]
    events = [
        ev(10, "1", "WAIT", "decision", "crash"),
        ev(20, "1", "RESUBMIT", "decision", "crash"),
        ev(20, "1", "RESUBMIT", "intent", "crash"),
        ev(20, "1", "RESUBMIT", "intent", "crash"),  # a restarted monitor: still one retry
        ev(21, "1", "RESUBMIT", "done", "crash", new_job_id="2"),
        ev(30, "2", "RESUBMIT", "intent", "timeout"),
        ev(40, "3", "WAIT", "decision", "lost"),
        ev(50, "3", "WAIT", "decision", "lost"),
        ev(60, "3", "RESUBMIT", "intent", "lost"),  # current job: not counted yet
    ]
    h = history_from(events, jobs)
    assert h.retries == {"crash": 1, "preempted": 1} and h.failures == 1
    assert (h.attempts, h.last_submit_time, h.last_failure_time) == (3, 2.0, 40.0)
    assert h.final is None
    h = history_from([*events, ev(70, "3", "STOP", "decision", "budget_exhausted")], jobs)
    assert h.final is K.STOP
    assert history_from([*events, ev(70, "2", "DONE", "decision")], jobs).final is None
    assert pending_intent(events, "3")["class"] == "lost"
    assert pending_intent(events, "1") is None


def test_running_since_restarts_after_requeue() -> None:
    events = [
        {"time": 1, "job_id": "7", "phase": "decision", "slurm_state": "PENDING"},
        {"time": 2, "job_id": "7", "phase": "decision", "slurm_state": "RUNNING"},
        {"time": 3, "job_id": "7", "phase": "decision", "slurm_state": "RUNNING"},
        {"time": 4, "job_id": "8", "phase": "decision", "slurm_state": "PENDING"},
    ]
    assert running_since(events, "7") == 2
    events.append({"time": 5, "job_id": "7", "phase": "decision", "slurm_state": "REQUEUED"})
    events.append({"time": 6, "job_id": "7", "phase": "decision", "slurm_state": "RUNNING"})
    assert running_since(events, "7") == 6
    assert running_since(events, "9") is None


# ---------------------------------------------------------------------- the shell (fakes)


class Killed(BaseException):
    """Stands in for SIGKILL of the monitor in the middle of an action."""


class FakeSlurm:
    """sacct/squeue/scancel/sbatch stand-ins; resubmit appends to jobs.jsonl like submit.py."""

    def __init__(self) -> None:
        self.states: dict[str, str] = {}
        self.sacct_calls: list[list[str]] = []
        self.cancelled: list[str] = []
        self.next_id = 200
        self.fail_submit: BaseException | None = None
        self.kill_after_submit = False
        self.kill_before_record = False
        self.submitted: list[str] = []
        self.slow_cancel = False

    def job_records(self, ids: Iterable[str]) -> dict[str, JobRecord]:
        ids = list(ids)
        self.sacct_calls.append(ids)
        return {j: JobRecord(j, self.states[j]) for j in ids if j in self.states}

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)
        if job_id in self.states and not self.slow_cancel:
            self.states[job_id] = "CANCELLED"

    def queued(self) -> set[str]:
        """Like squeue: only jobs that have not ended (a slow cancel keeps its job listed)."""
        return {j for j, st in self.states.items() if st in ACTIVE_STATES}

    def resubmit(self, paths: RunPaths, reason: str) -> str:
        if self.fail_submit is not None:
            raise self.fail_submit
        self.next_id += 1
        jid = str(self.next_id)
        self.states[jid] = "PENDING"
        self.submitted.append(jid)
        if self.kill_before_record:  # sbatch went through, jobs.jsonl was never written
            raise Killed()
        n = len(read_jsonl(paths.jobs))
        append_jsonl(
            paths.jobs,
            {
                "job_id": jid,
                "attempt": n,
                "submitted_at": 0.0,
                "reason": reason,
                "executor": "slurm",
            },
        )
        if self.kill_after_submit:
            raise Killed()
        return jid

    def backend(self) -> Backend:
        return Backend(
            job_records=self.job_records,
            queued_job_ids=self.queued,
            cancel_slurm=self.cancel,
            resubmit=self.resubmit,
            submitted_jobs=lambda paths, since: list(self.submitted),
            adopt=lambda paths, jid, reason, nodes: append_jsonl(
                paths.jobs, {"job_id": jid, "reason": reason, "executor": "slurm"}
            ),
            sleep=lambda s: None,
        )


def make_run(
    root: Path,
    name: str,
    job_id: str,
    state: str,
    slurm: FakeSlurm,
    executor: str = "slurm",
    progress: ProgressRecord | None = None,
) -> RunPaths:
    paths = RunPaths(root / name)
    paths.root.mkdir(parents=True)
    append_jsonl(
        paths.jobs,
        {
            "job_id": job_id,
            "attempt": 0,
            "submitted_at": NOW - 3600,
            "reason": "initial submission",
            "executor": executor,
        },
    )
    slurm.states[job_id] = state
    if progress is not None:
        write_progress(paths.progress, progress)
    return paths


def jobs_of(paths: RunPaths) -> list[str]:
    return [str(j["job_id"]) for j in read_jsonl(paths.jobs)]


FAST = MonitorPolicy(backoff_base_s=0)


def test_one_sacct_call_per_pass_and_events_logged(tmp_path: Path) -> None:
    s = FakeSlurm()
    a = make_run(tmp_path, "a", "100", "TIMEOUT", s, progress=rec(run="a", job_id="100"))
    b = make_run(tmp_path, "b", "110", "RUNNING", s, progress=rec(run="b", job_id="110"))
    c = make_run(tmp_path, "c", "120", "PENDING", s)
    outs = monitor_pass([a, b, c], FAST, lambda: NOW, s.backend())
    assert s.sacct_calls == [["100", "110", "120"]]
    by_run = {o.run: o for o in outs}
    assert by_run["a"].action.kind is K.RESUBMIT and by_run["a"].new_job_id == "201"
    assert by_run["b"].action.kind is K.NONE and by_run["c"].action.kind is K.NONE
    assert jobs_of(a) == ["100", "201"]
    phases = [(e["phase"], e["action"], e["class"]) for e in read_jsonl(a.events)]
    assert phases == [
        ("decision", "RESUBMIT", "timeout"),
        ("intent", "RESUBMIT", "timeout"),
        ("done", "RESUBMIT", "timeout"),
    ]
    assert read_jsonl(a.events)[-1]["new_job_id"] == "201"
    monitor_pass([a, b, c], FAST, lambda: NOW, s.backend())  # unchanged decisions: not relogged
    assert len(read_jsonl(b.events)) == 1 and len(read_jsonl(a.events)) == 4


def test_stalled_job_is_cancelled_then_resubmitted(tmp_path: Path) -> None:
    s = FakeSlurm()
    p = make_run(tmp_path, "r", "100", "RUNNING", s, progress=rec(heartbeat=NOW - 3600))
    out = monitor_run(p, FAST, lambda: NOW, s.backend())
    assert out.action.failure_class is C.STALLED_HEARTBEAT
    assert s.cancelled == ["100"] and jobs_of(p) == ["100", "201"]


def test_killed_before_submit_resumes_the_intent_once(tmp_path: Path) -> None:
    s = FakeSlurm()
    p = make_run(tmp_path, "r", "100", "TIMEOUT", s, progress=rec())
    s.fail_submit = Killed()
    with pytest.raises(Killed):
        monitor_run(p, FAST, lambda: NOW, s.backend())
    assert jobs_of(p) == ["100"] and read_jsonl(p.events)[-1]["phase"] == "intent"
    s.fail_submit = None
    s.states["100"] = "CANCELLED"  # the world moved on; the intent (timeout) is finished as is
    out = monitor_run(p, FAST, lambda: NOW + 60, s.backend())
    assert out.new_job_id == "201" and out.action.failure_class is C.TIMEOUT
    for _ in range(3):
        monitor_run(p, FAST, lambda: NOW + 120, s.backend())
    assert jobs_of(p) == ["100", "201"]
    assert history_from(read_jsonl(p.events), read_jsonl(p.jobs)).retries == {"preempted": 1}


def test_killed_after_submit_never_submits_twice(tmp_path: Path) -> None:
    s = FakeSlurm()
    p = make_run(tmp_path, "r", "100", "FAILED", s, progress=rec(state=TrainState.FAILED))
    s.kill_after_submit = True
    with pytest.raises(Killed):
        monitor_run(p, FAST, lambda: NOW, s.backend())
    s.kill_after_submit = False
    for _ in range(3):
        monitor_run(p, FAST, lambda: NOW + 60, s.backend())
    assert jobs_of(p) == ["100", "201"]
    done = [e for e in read_jsonl(p.events) if e["phase"] == "done"]
    assert len(done) == 1 and done[0]["note"] == "superseded" and done[0]["new_job_id"] == "201"


def test_killed_between_sbatch_and_record_adopts_the_job(tmp_path: Path) -> None:
    s = FakeSlurm()
    p = make_run(tmp_path, "r", "100", "TIMEOUT", s, progress=rec())
    s.kill_before_record = True
    with pytest.raises(Killed):
        monitor_run(p, FAST, lambda: NOW, s.backend())
    assert jobs_of(p) == ["100"] and s.submitted == ["201"]  # an orphan in Slurm
    s.kill_before_record = False
    out = monitor_run(p, FAST, lambda: NOW + 60, s.backend())
    assert out.new_job_id == "201" and s.submitted == ["201"]  # adopted, not submitted again
    assert jobs_of(p) == ["100", "201"] and "adopted" in read_jsonl(p.jobs)[-1]["reason"]
    assert read_jsonl(p.events)[-1]["note"] == "adopted"
    monitor_run(p, FAST, lambda: NOW + 120, s.backend())
    assert s.submitted == ["201"]


def test_resubmits_only_once_the_cancelled_job_has_ended(tmp_path: Path) -> None:
    s = FakeSlurm()
    p = make_run(tmp_path, "r", "100", "RUNNING", s, progress=rec(heartbeat=NOW - 3600))
    s.slow_cancel = True  # scancel sent, the job's processes are still being killed
    out = monitor_run(p, FAST, lambda: NOW, s.backend())
    assert out.new_job_id is None and "still ending" in (out.error or "")
    assert jobs_of(p) == ["100"] and read_jsonl(p.events)[-1]["phase"] == "intent"
    s.states["100"] = "CANCELLED"
    out = monitor_run(p, FAST, lambda: NOW + 30, s.backend())
    assert out.new_job_id == "201" and out.action.failure_class is C.STALLED_HEARTBEAT
    assert jobs_of(p) == ["100", "201"] and s.cancelled == ["100", "100"]


def test_budget_survives_restarts_and_stop_sticks(tmp_path: Path) -> None:
    s = FakeSlurm()
    p = make_run(tmp_path, "r", "100", "FAILED", s)
    for _ in range(3):  # every attempt crashes; each pass is a freshly started monitor
        monitor_run(p, FAST, lambda: NOW, s.backend())
        s.states[jobs_of(p)[-1]] = "FAILED"
    out = monitor_run(p, FAST, lambda: NOW, s.backend())
    assert out.action.kind is K.STOP and "retry budget exhausted (crash 3/3)" in out.action.reason
    assert len(jobs_of(p)) == 4
    s.sacct_calls.clear()
    assert monitor_pass([p], FAST, lambda: NOW, s.backend()) == []
    assert s.sacct_calls == [] and len(jobs_of(p)) == 4
    append_jsonl(p.jobs, {"job_id": "300", "executor": "slurm"})  # grpo-submit --resume
    s.states["300"] = "RUNNING"
    assert monitor_run(p, FAST, lambda: NOW, s.backend()).action.kind is K.NONE


def test_circuit_breaker_stops_without_resubmitting(tmp_path: Path) -> None:
    s = FakeSlurm()
    bad = rec(state=TrainState.FAILED, exit_code=3, reason="reward 0 for 20 steps")
    p = make_run(tmp_path, "r", "100", "FAILED", s, progress=bad)
    assert monitor_run(p, FAST, lambda: NOW, s.backend()).action.kind is K.STOP
    assert monitor_run(p, FAST, lambda: NOW, s.backend()) is None and jobs_of(p) == ["100"]


def test_locked_run_is_skipped(tmp_path: Path) -> None:
    s = FakeSlurm()
    p = make_run(tmp_path, "r", "100", "TIMEOUT", s, progress=rec())
    with open(p.monitor_lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert monitor_run(p, FAST, lambda: NOW, s.backend()) is None
    assert jobs_of(p) == ["100"]


def test_config_error_on_resubmit_stops(tmp_path: Path) -> None:
    s = FakeSlurm()
    p = make_run(tmp_path, "r", "100", "TIMEOUT", s, progress=rec())
    s.fail_submit = ConfigError("no config.yaml")
    out = monitor_run(p, FAST, lambda: NOW, s.backend())
    assert out.error == "no config.yaml" and out.new_job_id is None
    assert monitor_run(p, FAST, lambda: NOW, s.backend()) is None  # stopped
    s2 = FakeSlurm()
    q = make_run(tmp_path, "q", "100", "TIMEOUT", s2, progress=rec())
    s2.fail_submit = GrpoError("sbatch: transient")
    for i in range(5):  # five failures over SUBMIT_ERROR_WINDOW_S (600 s)
        out = monitor_run(q, FAST, lambda i=i: NOW + 150 * i, s2.backend())
        assert out.error == "sbatch: transient"
    assert monitor_run(q, FAST, lambda: NOW + 750, s2.backend()) is None  # gave up


def test_local_executor_pid_checks(tmp_path: Path) -> None:
    s = FakeSlurm()
    proc = subprocess.Popen(["true"])
    proc.wait()
    dead = make_run(tmp_path, "dead", str(proc.pid), "", s, executor="local")
    me = str(os.getpid())
    live = make_run(tmp_path, "live", me, "", s, executor="local", progress=rec(job_id=me))
    outs = {o.run: o for o in monitor_pass([dead, live], FAST, lambda: NOW, s.backend())}
    assert s.sacct_calls == []  # no Slurm for local runs
    assert outs["dead"].action.failure_class is C.CRASH and outs["dead"].new_job_id == "201"
    assert outs["live"].action.kind is K.NONE
    assert read_jsonl(live.events)[0]["slurm_state"] == "LOCAL_RUNNING"


def test_main_loop_ends_when_all_runs_done(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    s = FakeSlurm()
    proc = subprocess.Popen(["true"])
    proc.wait()
    done = rec(job_id=str(proc.pid), state=TrainState.FINISHED, step=100, exit_code=0)
    make_run(tmp_path, "fin", str(proc.pid), "", s, executor="local", progress=done)
    assert main(["--logs", str(tmp_path), "--interval", "0"]) == 0
    out = capsys.readouterr().out
    assert "fin job" in out and "DONE finished: finished 100/100 steps" in out
    assert json.loads(RunPaths(tmp_path / "fin").events.read_text().splitlines()[0])["action"]
    assert main(["--logs", str(tmp_path / "nothing"), "--once"]) == 2
    assert main(["nope", "--logs", str(tmp_path)]) == 2
