"""The monitor's decision for one run, as a pure function, and the history it rests on.

:func:`decide` is pure: (progress, job, history, now, policy) -> Action. Its table, first
match wins (``own`` = the progress record written by *this* job; a record left by an
earlier job counts as "no progress yet"; RUNNING includes LOCAL_RUNNING, a live pid of the
local executor, and "ended" includes LOCAL_EXITED):

===========================================  =====================  =====================
situation                                    action                 class
===========================================  =====================  =====================
run already STOPPED/DONE (events.jsonl)      NONE                   -
own exit_code 3 after this job's collapse    STOP (never resubmit)  collapsed
  STOP event (training.on_collapse)
own exit_code 3 / 2                          STOP (never resubmit)  circuit_breaker /
                                                                    config_error
own exit_code 6, or ended OUT_OF_MEMORY      STOP (never resubmit   out_of_memory
                                             unchanged)
own state finished and step >= max_steps     DONE                   finished
RUNNING, own live, step 0, started > step0   CANCEL_AND_RESUBMIT    stalled_step0
RUNNING, own live past LOADING, heartbeat >  CANCEL_AND_RESUBMIT    stalled_heartbeat
  hb timeout
RUNNING, own live otherwise                  NONE                   -
RUNNING, own failed, heartbeat > hb timeout  CANCEL_AND_RESUBMIT    crash (hung teardown)
RUNNING, no own record, start > step0        CANCEL_AND_RESUBMIT    stalled_step0
COMPLETING (ended, still in squeue: its      NONE (wait for Slurm   -
  allocation holds its nodes)                to release them)
PENDING / REQUEUED / other active state      NONE (Slurm requeued)  -
MISSING within lost_grace_s of submission    NONE                   -
ended TIMEOUT / DEADLINE                     RESUBMIT               timeout
ended PREEMPTED / CANCELLED                  RESUBMIT               preempted
ended NODE_FAIL / BOOT_FAIL                  RESUBMIT (backoff)     node_fail
ended, own interrupted or exit 5             RESUBMIT               checkpointed
ended, own exit 4                            RESUBMIT (backoff)     stalled_phase
MISSING, own record not terminal             RESUBMIT (backoff)     lost
ended otherwise (FAILED, OOM, COMPLETED      RESUBMIT (backoff)     crash
  before max_steps, LOCAL_EXITED)
===========================================  =====================  =====================

Which stall limit watches a live trainer is :func:`stall_limits` (pure), by its state:

==================================  ======================================================
trainer state (own, live)           limits that apply
==================================  ======================================================
LOADING                             ``step0_timeout`` only: loading a 7B-70B model from a
                                    busy shared filesystem can take longer than
                                    ``heartbeat_timeout`` and is not a stall; a dead
                                    process is caught by the job ending
GENERATING ... EVALUATING           ``heartbeat_timeout``, and ``step0_timeout`` while no
                                    step was trained in this attempt (step <= start_step)
==================================  ======================================================

The trainer beats while it loads (``Tracker.beat_while_loading`` in
grpo_hpc.train.measure.tracking), but from a thread: that beat proves the process alive, not
the load moving (a read stuck on the filesystem leaves threads running), which is why only
``step0_timeout`` judges LOADING.

Every resubmission first passes the retry budget: classes fall into buckets (crash,
stalled, lost, preempted); a bucket at its limit, or failure buckets (all but preempted)
at ``max_retries`` in total, give STOP budget_exhausted (cancelling a stalled job).
Failure retries of an ended job wait ``backoff_base_s * 2**failures`` (capped) after the
monitor first saw the failure (WAIT). The shell writes an *intent* event before acting
and a *done* event after; events.jsonl is the
source of truth for retry counts and for the sticky STOP/DONE (:func:`history_from`).
The I/O shell that applies actions is grpo_hpc.monitor.loop.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from grpo_hpc.core.errors import ConfigError, ExitCode
from grpo_hpc.core.events import CLOSING, Phase
from grpo_hpc.core.progress import ProgressRecord, TrainState
from grpo_hpc.core.runs import COMPLETING, RUNNING_STATES, JobView
from grpo_hpc.core.slurm import ACTIVE_STATES


class ActionKind(str, enum.Enum):
    """What the monitor does about a run."""

    NONE = "NONE"
    WAIT = "WAIT"
    CANCEL_AND_RESUBMIT = "CANCEL_AND_RESUBMIT"
    RESUBMIT = "RESUBMIT"
    STOP = "STOP"
    DONE = "DONE"


class FailureClass(str, enum.Enum):
    """Why: the class of outcome behind an action."""

    STALLED_STEP0 = "stalled_step0"
    STALLED_HEARTBEAT = "stalled_heartbeat"
    STALLED_PHASE = "stalled_phase"
    TIMEOUT = "timeout"
    PREEMPTED = "preempted"
    NODE_FAIL = "node_fail"
    CHECKPOINTED = "checkpointed"
    CRASH = "crash"
    LOST = "lost"
    CIRCUIT_BREAKER = "circuit_breaker"
    CONFIG_ERROR = "config_error"
    BUDGET_EXHAUSTED = "budget_exhausted"
    FINISHED = "finished"
    OUT_OF_MEMORY = "out_of_memory"
    """CUDA out-of-memory (trainer exit 6) or Slurm's OUT_OF_MEMORY: the same settings
    would fail again."""
    COLLAPSED = "collapsed"
    """The trainer stopped the run because it had stopped learning (a ``collapse`` event
    with action STOP in events.jsonl, exit 3): resubmitting would go on from the same
    collapsed state."""
    NODES_BACK = "nodes_back"
    """A run on fewer nodes than its profile's (a node was lost, ``nodes_wait_s``) whose
    nodes are up again: checkpointed and resubmitted on all of them (monitor/nodes.py)."""
    MANUAL = "manual"
    """A person resubmitted (grpo-submit --resume): no retry budget is spent."""


C = FailureClass
RETRY_BUCKET: dict[FailureClass, str] = {
    C.STALLED_STEP0: "stalled", C.STALLED_HEARTBEAT: "stalled", C.STALLED_PHASE: "stalled",
    C.TIMEOUT: "preempted", C.PREEMPTED: "preempted", C.CHECKPOINTED: "preempted",
    C.NODE_FAIL: "lost", C.LOST: "lost", C.CRASH: "crash", C.NODES_BACK: "preempted",
}  # fmt: skip
RETRY_BUCKET_BY_VALUE = {c.value: b for c, b in RETRY_BUCKET.items()}
PROGRESS_BUCKETS = frozenset({"preempted"})
"""Resubmissions that continue progress rather than retry a failure: no backoff, and
they do not count against ``max_retries``."""
RESUBMIT_KINDS = (ActionKind.RESUBMIT, ActionKind.CANCEL_AND_RESUBMIT)
FINAL_KINDS = (ActionKind.STOP, ActionKind.DONE)
ENDED_CLASS = {
    "TIMEOUT": C.TIMEOUT, "DEADLINE": C.TIMEOUT, "PREEMPTED": C.PREEMPTED,
    "CANCELLED": C.PREEMPTED, "NODE_FAIL": C.NODE_FAIL, "BOOT_FAIL": C.NODE_FAIL,
}  # fmt: skip


@dataclass
class MonitorPolicy:
    """When the monitor steps in, and how often it may retry."""

    step0_timeout_s: float = 1800.0
    """An attempt that completes no step within this many seconds of starting is stalled."""
    heartbeat_timeout_s: float = 600.0
    """A running trainer whose heartbeat is older than this is stalled, once it has loaded
    (a LOADING trainer answers to ``step0_timeout_s`` only: :func:`stall_limits`)."""
    max_retries: int = 5
    """Total failure resubmissions (crash, stalled, lost buckets) over the run's life."""
    max_retries_per_class: dict[str, int] = field(
        default_factory=lambda: {"crash": 3, "stalled": 3, "lost": 3, "preempted": 20}
    )
    """Resubmissions per bucket (see RETRY_BUCKET); preempted covers timeout/checkpointed."""
    backoff_base_s: float = 30.0
    """Wait before the first failure retry; doubles with each failure so far."""
    backoff_max_s: float = 900.0
    """Cap of the exponential backoff."""
    lost_grace_s: float = 300.0
    """A job unknown to squeue and sacct is only declared lost this long after submission."""

    def __post_init__(self) -> None:
        for name in ("step0_timeout_s", "heartbeat_timeout_s", "backoff_base_s", "backoff_max_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"monitor policy: {name} must be >= 0")
        if self.max_retries < 0:
            raise ConfigError("monitor policy: max_retries must be >= 0")
        unknown = set(self.max_retries_per_class) - set(RETRY_BUCKET.values())
        if unknown:
            raise ConfigError(f"monitor policy: unknown retry classes {sorted(unknown)}")

    def backoff_s(self, failures: int) -> float:
        """Backoff before the next failure retry, given the failure retries so far."""
        return min(self.backoff_max_s, self.backoff_base_s * 2 ** min(failures, 30))


@dataclass
class RunHistory:
    """What earlier passes did to the run (derived from events.jsonl and jobs.jsonl)."""

    attempts: int = 0
    """Jobs submitted so far."""
    retries: dict[str, int] = field(default_factory=dict)
    """Resubmissions per retry bucket, not counting the current job's."""
    last_submit_time: float | None = None
    """When the newest job was submitted."""
    last_failure_time: float | None = None
    """When a monitor first saw the current job fail (start of its backoff)."""
    final: ActionKind | None = None
    """STOP or DONE if a pass ended the run for the current job (sticky)."""
    final_reason: str = ""
    """The reason logged with ``final``."""
    collapse_stop: str | None = None
    """The reason of the current job's collapse STOP event (the trainer's), if any."""

    @property
    def failures(self) -> int:
        """Failure resubmissions so far (all buckets but the progress ones)."""
        return sum(n for b, n in self.retries.items() if b not in PROGRESS_BUCKETS)


@dataclass(frozen=True)
class Action:
    """The decision for one run."""

    kind: ActionKind
    """What to do."""
    failure_class: FailureClass | None = None
    """Why (None for plain NONE)."""
    reason: str = ""
    """One human line."""
    cancel: bool = False
    """Cancel the current job first (stalled jobs, also when the budget says STOP)."""
    wait_s: float = 0.0
    """For WAIT: seconds of backoff left."""


def fmt_duration(seconds: float) -> str:
    """45 s, 31 min, 2.5 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class StallLimit(str, enum.Enum):
    """A limit that makes a live trainer stalled (the MonitorPolicy field named)."""

    STEP0 = "step0_timeout"
    """No step trained in this attempt within ``step0_timeout_s`` of its start."""
    HEARTBEAT = "heartbeat_timeout"
    """No heartbeat for ``heartbeat_timeout_s``."""


def heartbeat_watched(state: TrainState) -> bool:
    """Whether ``heartbeat_timeout`` judges a trainer in ``state`` (pure): not while it
    loads (its only beat then is a thread's, which proves it alive, not loading; a slow
    load is judged by ``step0_timeout``), nor once it ended (terminal states)."""
    return state is not TrainState.LOADING and not state.terminal


def stall_limits(state: TrainState, trained: bool) -> tuple[StallLimit, ...]:
    """The limits that apply to a trainer in ``state`` (pure; the table in the module
    docstring). ``trained``: a step was trained in this attempt (step > start_step). The
    trainer is LOADING only before its attempt's first step; should a record say LOADING
    after one, the heartbeat judges it: no live trainer goes without a limit."""
    if state.terminal:
        return ()
    step0 = () if trained else (StallLimit.STEP0,)
    beat = (StallLimit.HEARTBEAT,) if heartbeat_watched(state) or trained else ()
    return step0 + beat


def own_progress(progress: ProgressRecord | None, job: JobView) -> ProgressRecord | None:
    """The record if this job wrote it (a trainer that never sets job_id: trust it)."""
    if progress is None or (progress.job_id is not None and str(progress.job_id) != job.job_id):
        return None
    return progress


def decide(
    progress: ProgressRecord | None,
    job: JobView,
    history: RunHistory,
    now: float,
    policy: MonitorPolicy | None = None,
) -> Action:
    """The monitor's decision for one run (pure; table in the module docstring)."""
    policy = policy or MonitorPolicy()
    if history.final is not None:
        return Action(ActionKind.NONE, reason=f"run already {history.final.value}")
    own = own_progress(progress, job)
    if own is not None and own.exit_code == ExitCode.CIRCUIT_BREAKER and history.collapse_stop:
        why = f"{history.collapse_stop}; never resubmitted (the best checkpoint is kept)"
        return Action(ActionKind.STOP, C.COLLAPSED, why)
    if own is not None and own.exit_code in (ExitCode.CIRCUIT_BREAKER, ExitCode.CONFIG_ERROR):
        cls = C.CIRCUIT_BREAKER if own.exit_code == ExitCode.CIRCUIT_BREAKER else C.CONFIG_ERROR
        why = f"{cls.value} at step {own.step}: {own.reason or 'no reason given'}"
        fix = "never resubmitted (fix the cause, then grpo-submit --resume)"
        return Action(ActionKind.STOP, cls, f"{why}; {fix}")
    oom = _out_of_memory(own, job)
    if oom is not None:
        return oom
    if own is not None and own.state is TrainState.FINISHED and own.step >= own.max_steps:
        return Action(ActionKind.DONE, C.FINISHED, f"finished {own.step}/{own.max_steps} steps")
    if job.state in RUNNING_STATES:
        return _judge_running(own, job, history, now, policy)
    if job.state == COMPLETING:
        return Action(ActionKind.NONE, reason=completing_reason(job))
    if job.state in ACTIVE_STATES:
        saved = own is not None and own.state is TrainState.INTERRUPTED
        return Action(ActionKind.NONE, reason=f"{job.state}" + (" (requeued)" if saved else ""))
    if job.state == "MISSING" and now - (job.submitted_at or 0.0) < policy.lost_grace_s:
        return Action(ActionKind.NONE, reason="just submitted; not in squeue/sacct yet")
    cls, why = classify_end(own, job)
    return _retry(cls, why, history, now, policy, cancel=False)


def completing_reason(job: JobView) -> str:
    """Why a COMPLETING job is waited for (pure): its allocation holds its nodes, and a job
    started meanwhile could meet the old trainer. Slurm bounds it (UnkillableStepTimeout)."""
    why = "Slurm has not released its nodes yet; nothing is cancelled or resubmitted"
    return f"job {job.job_id} COMPLETING: {why} until it leaves the queue"


def _out_of_memory(own: ProgressRecord | None, job: JobView) -> Action | None:
    """STOP for a run that ran out of memory: resubmitting it unchanged fails again."""
    fix = "never resubmitted unchanged"
    if own is not None and own.exit_code == ExitCode.OUT_OF_MEMORY:
        return Action(ActionKind.STOP, C.OUT_OF_MEMORY, f"out of memory: {own.reason}; {fix}")
    if job.state == "OUT_OF_MEMORY":  # Slurm's cgroup killed it: host memory, not the GPU
        where = f"at step {own.step}/{own.max_steps}" if own else "with no progress record"
        why = (
            f"Slurm killed job {job.job_id} for host memory (OUT_OF_MEMORY) {where}: raise "
            "the profile's mem_gb (dist.cpu_offload needs ~16 bytes per parameter)"
        )
        return Action(ActionKind.STOP, C.OUT_OF_MEMORY, f"{why}; {fix}")
    return None


def classify_end(own: ProgressRecord | None, job: JobView) -> tuple[FailureClass, str]:
    """Class and reason for a job that ended without finishing the run (pure)."""
    where = f"at step {own.step}/{own.max_steps}" if own else "with no progress record"
    if job.state in ENDED_CLASS:
        return ENDED_CLASS[job.state], f"job {job.state} {where}"
    if own is not None and (
        own.state is TrainState.INTERRUPTED or own.exit_code == ExitCode.CHECKPOINTED
    ):
        return C.CHECKPOINTED, f"trainer checkpointed and exited {where}"
    if own is not None and own.exit_code == ExitCode.STALLED:
        return C.STALLED_PHASE, f"trainer stalled {where}: {own.reason or '?'}"
    if job.state == "MISSING" and (own is None or not own.state.terminal):
        return C.LOST, f"job {job.job_id} vanished from squeue and sacct {where}"
    code = f" exit {job.exit_code}" if job.exit_code is not None else ""
    detail = f": {own.reason}" if own is not None and own.reason else ""
    return C.CRASH, f"job {job.state}{code} {where}{detail}"


def _judge_running(
    own: ProgressRecord | None, job: JobView, history: RunHistory, now: float, p: MonitorPolicy
) -> Action:
    if own is not None and not own.state.terminal:
        age = now - own.started_at
        # "Step 0" of this attempt: no step completed since it started (a resumed attempt
        # starts at its checkpoint's step, so a hang after a resume is caught too).
        limits = stall_limits(own.state, trained=own.step > own.start_step)
        if StallLimit.STEP0 in limits and age > p.step0_timeout_s:
            what = (
                f"step {own.step}"
                if own.start_step == 0
                else (f"no step since resuming at step {own.start_step}")
            )
            why = (
                f"{what} for {fmt_duration(age)} > step0_timeout {fmt_duration(p.step0_timeout_s)}"
                f" ({own.state.value})"
            )
            return _retry(C.STALLED_STEP0, why, history, now, p, cancel=True)
        hb = own.heartbeat_age(now)
        if StallLimit.HEARTBEAT in limits and hb > p.heartbeat_timeout_s:
            limit = fmt_duration(p.heartbeat_timeout_s)
            why = f"no heartbeat for {fmt_duration(hb)} > heartbeat_timeout {limit}"
            why += f" ({own.state.value}, step {own.step})"
            return _retry(C.STALLED_HEARTBEAT, why, history, now, p, cancel=True)
        if StallLimit.HEARTBEAT not in limits:  # say which limit judges a slow load
            limit = fmt_duration(p.step0_timeout_s)
            why = f"{own.state.value} for {fmt_duration(age)} (judged by step0_timeout {limit})"
            return Action(ActionKind.NONE, reason=why)
        return Action(ActionKind.NONE, reason=f"{own.state.value} step {own.step}/{own.max_steps}")
    if own is not None and own.state is TrainState.FAILED:
        hb = own.heartbeat_age(now)
        if hb <= p.heartbeat_timeout_s:
            return Action(ActionKind.NONE, reason="trainer failed; waiting for the job to end")
        cls, why = classify_end(own, job)
        why += f"; job still {job.state} {fmt_duration(hb)} later"
        return _retry(cls, why, history, now, p, cancel=True)
    # no record of this (re)start yet: a requeued job may still show its previous record
    starts = [t for t in (job.started_at, own.heartbeat if own else None) if t is not None]
    if not starts:
        return Action(ActionKind.NONE, reason="running; waiting for the first progress record")
    age = now - max(starts)
    if age > p.step0_timeout_s:
        why = f"step 0 for {fmt_duration(age)} > step0_timeout {fmt_duration(p.step0_timeout_s)}"
        why += f" (no progress record from job {job.job_id})"
        return _retry(C.STALLED_STEP0, why, history, now, p, cancel=True)
    return Action(ActionKind.NONE, reason=f"running {fmt_duration(age)}; no progress record yet")


def _retry(
    cls: FailureClass, why: str, h: RunHistory, now: float, p: MonitorPolicy, cancel: bool
) -> Action:
    """RESUBMIT (or CANCEL_AND_RESUBMIT), WAIT for backoff, or STOP when the budget is spent."""
    bucket = RETRY_BUCKET[cls]
    used = h.retries.get(bucket, 0)
    limit = p.max_retries_per_class.get(bucket, p.max_retries)
    failure = bucket not in PROGRESS_BUCKETS
    if used >= limit or (failure and h.failures >= p.max_retries):
        spent = (
            f"{bucket} {used}/{limit}" if used >= limit else f"total {h.failures}/{p.max_retries}"
        )
        why = f"retry budget exhausted ({spent}): {cls.value}: {why}"
        return Action(ActionKind.STOP, C.BUDGET_EXHAUSTED, why, cancel=cancel)
    tag = f"retry {bucket} {used + 1}/{limit}"
    if failure and not cancel:
        seen = h.last_failure_time if h.last_failure_time is not None else now
        left = seen + p.backoff_s(h.failures) - now
        if left > 0:
            return Action(
                ActionKind.WAIT, cls, f"{why}; {tag} in {fmt_duration(left)}", wait_s=left
            )
    kind = ActionKind.CANCEL_AND_RESUBMIT if cancel else ActionKind.RESUBMIT
    return Action(kind, cls, f"{why}; {tag}", cancel=cancel)


# ------------------------------------------------------------ history from the logs (pure)


def history_from(events: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> RunHistory:
    """RunHistory of the newest job in ``jobs`` from the run's events (pure)."""
    current = str(jobs[-1]["job_id"]) if jobs else None
    h = RunHistory(attempts=len(jobs))
    h.last_submit_time = jobs[-1].get("submitted_at") if jobs else None
    counted: set[str] = set()
    for ev in events:
        job, kind = str(ev.get("job_id")), ev.get("action")
        if ev.get("phase") == Phase.INTENT and kind in (k.value for k in RESUBMIT_KINDS):
            if job != current and job not in counted and ev.get("class") in RETRY_BUCKET_BY_VALUE:
                counted.add(job)
                bucket = RETRY_BUCKET_BY_VALUE[ev["class"]]
                h.retries[bucket] = h.retries.get(bucket, 0) + 1
        elif ev.get("phase") == Phase.COLLAPSE and job == current and kind == "STOP":
            h.collapse_stop = str(ev.get("reason", ""))
        elif ev.get("phase") == Phase.DECISION and job == current:
            if kind == ActionKind.WAIT.value and h.last_failure_time is None:
                h.last_failure_time = float(ev["time"])
            if kind in (k.value for k in FINAL_KINDS):
                h.final, h.final_reason = ActionKind(kind), str(ev.get("reason", ""))
    return h


def pending_intent(events: list[dict[str, Any]], job_id: str) -> dict[str, Any] | None:
    """The last intent about ``job_id`` that no done/error event closed (a killed monitor)."""
    open_intent = None
    for ev in events:
        if str(ev.get("job_id")) != job_id:
            continue
        if ev.get("phase") == Phase.INTENT:
            open_intent = ev
        elif ev.get("phase") in CLOSING:
            open_intent = None
    return open_intent
