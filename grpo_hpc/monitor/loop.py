"""grpo-monitor: watch runs; requeue, resubmit or stop them.

The decision is :func:`grpo_hpc.monitor.decision.decide` (pure, its table is in that module's
docstring); this module is the thin shell around it: lock the run, read its files, ask
Slurm (one ``sacct`` + one ``squeue`` per pass for all runs), decide, apply, log.

Crash safety: before acting, an ``intent`` event goes to events.jsonl; after, ``done``
(or ``error``). A monitor killed between the two finds the open intent on restart and
finishes it. Starting the next attempt (superseded check, adoption of a job a killed
submitter left unrecorded, the live-job check, submission) is grpo_hpc.monitor.attempts', the same
code ``grpo-submit --resume`` runs, so a restart never submits twice. A cancelled job is
resubmitted only once it has left the queue, so two trainers never share a run directory.
Retry counts and the sticky STOP/DONE are derived from events.jsonl, so a restarted
monitor continues the budget.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from grpo_hpc.core import events as event_log
from grpo_hpc.core import slurm as slurm_query
from grpo_hpc.core.errors import ConfigError, GrpoError, SlurmUnavailableError
from grpo_hpc.core.events import Event, Phase
from grpo_hpc.core.fsutil import read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import read_progress
from grpo_hpc.core.runs import COMPLETING, SlurmView, job_view, pid_alive, query_slurm, slurm_ids
from grpo_hpc.core.slurm import JobRecord
from grpo_hpc.monitor.attempts import (
    Effects,
    close_superseded,
    poll_delays,
    record_adopted,
    run_lock,
    slurm_submitted_jobs,
    start_next_attempt,
    submit_next,
)
from grpo_hpc.monitor.decision import (
    RESUBMIT_KINDS,
    Action,
    ActionKind,
    FailureClass,
    JobView,
    MonitorPolicy,
    decide,
    history_from,
    pending_intent,
)
from grpo_hpc.monitor.node_loss import on_nodes_left

MAX_SUBMIT_ERRORS = 5
SUBMIT_ERROR_WINDOW_S = 600.0
"""Failed resubmissions STOP a run only when they persisted this long (and at least
MAX_SUBMIT_ERRORS times): a disk full for a few passes must not end it (bench/faults/run.py)."""
CANCEL_WAIT_S = 30.0
"""How long one pass waits for a cancelled job to leave the queue before resubmitting
(Slurm's KillWait); a job still ending after that keeps its intent open for the next pass,
so an old and a new trainer never write one run directory at the same time."""


def cancel_local(pid: int) -> None:
    """Terminate a local-executor job (its process group when it leads one). Never init or
    this process: a hand-edited or corrupt jobs.jsonl must not take the machine down."""
    if pid <= 1 or pid == os.getpid():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGTERM)
        else:
            os.kill(pid, signal.SIGTERM)


@dataclass
class Backend:
    """The monitor's side effects; tests swap in fakes."""

    job_records: Callable[[Iterable[str]], dict[str, JobRecord]] = slurm_query.job_records
    """One sacct call for many job ids."""
    queued_job_ids: Callable[[], set[str]] = slurm_query.queued_job_ids
    """Job ids squeue lists."""
    cancel_slurm: Callable[[str], None] = slurm_query.cancel
    """scancel."""
    cancel_local: Callable[[int], None] = cancel_local
    """Stop a local-executor job by pid."""
    pid_alive: Callable[[int], bool] = pid_alive
    """Is a local-executor job alive."""
    resubmit: Callable[[RunPaths, str], object] = submit_next
    """Submit the next attempt: a submit.SubmitResult, or just the new job id."""
    submitted_jobs: Callable[[RunPaths, float], list[str]] = slurm_submitted_jobs
    """Slurm jobs of the run submitted since a time (recorded in jobs.jsonl or not)."""
    adopt: Callable[[RunPaths, str, str, int | None], None] = record_adopted
    """Record in jobs.jsonl a job that was submitted but never recorded, on the nodes its
    intent asked for (None: the profile's)."""
    sleep: Callable[[float], None] = time.sleep
    """Pause between polls for a cancelled job to end."""
    up_nodes: Callable[[str | None], int] = slurm_query.up_nodes
    """Nodes of a partition in service (sinfo): asked only about multi-node runs with
    ``nodes_wait_s`` (grpo_hpc/monitor/node_loss.py)."""
    resubmit_on: Callable[[RunPaths, str, int], object] = submit_next
    """Submit the next attempt on this many nodes (the nodes left after a loss)."""

    def effects(self, nodes: int | None = None) -> Effects:
        """The part grpo_hpc.monitor.attempts uses to start the next attempt (on ``nodes``
        nodes where given)."""
        submit = (
            self.resubmit if nodes is None else functools.partial(self.resubmit_on, nodes=nodes)
        )
        return Effects(
            queued_job_ids=self.queued_job_ids,
            pid_alive=self.pid_alive,
            submit=submit,
            submitted_jobs=self.submitted_jobs,
            cancel_slurm=self.cancel_slurm,
            adopt=self.adopt,
            sleep=self.sleep,
        )


@dataclass
class Outcome:
    """What a pass did to one run (for the one-line report)."""

    run: str
    """Run name."""
    job_id: str
    """The job the decision was about."""
    action: Action
    """The decision."""
    logged: bool = False
    """Whether the decision was new (written to events.jsonl)."""
    new_job_id: str | None = None
    """The resubmitted job, if any."""
    error: str | None = None
    """Why applying the action failed."""
    slurm_state: str | None = None
    """The job's state as the decision saw it (COMPLETING: waited for, and said so)."""


def worth_saying(o: Outcome) -> bool:
    """Whether grpo-monitor prints an outcome (pure): a new decision that acts, or one that
    waits for a COMPLETING job's nodes to be released; not a plain NONE (a run going on)."""
    return o.logged and (o.action.kind is not ActionKind.NONE or o.slurm_state == COMPLETING)


def _event(now: float, job: JobView, action: Action, phase: Phase, **extra: Any) -> Event:
    cls = action.failure_class.value if action.failure_class else None
    return Event(now, job.job_id, phase, action.kind.value, cls, action.reason, job.state, extra)


def _action_of(intent: dict[str, Any]) -> Action:
    ev = Event.parse(intent)
    cls = FailureClass(ev.cls) if ev.cls else None
    return Action(ActionKind(ev.action), cls, ev.reason, bool(ev.extra.get("cancel")))


def _is_new(events: list[dict[str, Any]], ev: Event) -> bool:
    last = next((e for e in reversed(events) if e.get("phase") == Phase.DECISION), None)
    row = ev.row()
    keys = ("job_id", "slurm_state", "action", "class")
    return last is None or any(str(last.get(k)) != str(row.get(k)) for k in keys)


def is_final(paths: RunPaths) -> ActionKind | None:
    """STOP/DONE if a pass ended the run's newest job (sticky until someone resubmits)
    and left no unfinished intent (e.g. the cancel of a stalled job it stopped)."""
    jobs, events = read_jsonl(paths.jobs), event_log.read(paths.events)
    if not jobs or pending_intent(events, str(jobs[-1]["job_id"])) is not None:
        return None
    return history_from(events, jobs).final


def monitor_run(
    paths: RunPaths,
    policy: MonitorPolicy,
    now: Callable[[], float] = time.time,
    backend: Backend | None = None,
    view: SlurmView | None = None,
) -> Outcome | None:
    """One pass over one run: decide and apply. None when skipped (locked, no job, final)."""
    backend = backend or Backend()
    with run_lock(paths) as locked:
        jobs = read_jsonl(paths.jobs)
        if not locked or not jobs:
            return None
        events, entry = event_log.read(paths.events), jobs[-1]
        close_superseded(paths, events, jobs, now())
        history = history_from(events, jobs)
        intent = pending_intent(events, str(entry["job_id"]))
        if history.final is not None and intent is None:
            return None
        if view is None:
            view = query_slurm(slurm_ids([entry]), backend.job_records, backend.queued_job_ids)
        job, t = job_view(entry, view, events, backend.pid_alive), now()
        if intent is not None:  # a monitor died mid-action: finish what it started
            action = _action_of(intent)
            out = Outcome(paths.name, job.job_id, action)
            return _apply(paths, job, action, t, backend, out, intent, since=float(intent["time"]))
        action = decide(read_progress(paths.progress), job, history, t, policy)
        action, nodes = on_nodes_left(paths, job, action, jobs, events, t, backend.up_nodes)
        ev = _event(t, job, action, Phase.DECISION)
        out = Outcome(paths.name, job.job_id, action, logged=_is_new(events, ev))
        out.slurm_state = job.state
        if out.logged:
            event_log.append(paths.events, ev)
        if action.kind in RESUBMIT_KINDS or action.cancel:
            extra = {} if nodes is None else {"nodes": nodes}
            # on disk before the cancel or the submission: a monitor killed in between
            # finds it open and finishes it (core/events.py)
            intent = event_log.append(
                paths.events, _event(t, job, action, Phase.INTENT, cancel=action.cancel, **extra)
            )
            return _apply(paths, job, action, t, backend, out, intent)
        return out


def _apply(
    paths: RunPaths,
    job: JobView,
    action: Action,
    t: float,
    backend: Backend,
    out: Outcome,
    intent: dict[str, Any],
    since: float | None = None,
) -> Outcome:
    """Cancel and/or resubmit for an intent already written; the intent is closed with
    done/error. Starting the next attempt (superseded, adoption, live-job check, submit)
    is grpo_hpc.monitor.attempts'; ``since``: re-applying the open intent of a killed monitor
    (its time), whose unrecorded job is adopted instead of submitting again."""
    out.logged = True
    if since is not None and action.cancel and job.state == COMPLETING:
        # An earlier pass sent this intent's cancel and Slurm is still ending the job (an
        # unkillable step, a slow epilog): another scancel changes nothing, and waiting
        # CANCEL_WAIT_S here again would hold up every other run's pass, each pass.
        out.error = f"job {job.job_id} still COMPLETING after the cancel; resubmit once it is gone"
        return out  # the intent stays open for the pass that finds the job gone
    if action.cancel and job.state not in ("LOCAL_EXITED", "MISSING"):
        _cancel(job, backend)
        if action.kind in RESUBMIT_KINDS and not _wait_gone(job, backend):
            out.error = f"job {job.job_id} is still ending after the cancel; resubmit next pass"
            return out  # the intent stays open: a later pass cancels again and goes on
    if action.kind not in RESUBMIT_KINDS:
        event_log.append(paths.events, _event(t, job, action, Phase.DONE))
        return out
    reason = f"monitor: {action.failure_class.value}"
    nodes = intent.get("nodes")  # the nodes left after a loss (an intent keeps them)
    reason += f" (on {nodes} node(s))" if nodes is not None else ""
    try:
        fx = backend.effects(nodes)
        started = start_next_attempt(
            paths, reason, intent=intent, since=since, effects=fx, lock_held=True
        )
    except GrpoError as e:
        out.error = str(e)
        if pending_intent(event_log.read(paths.events), job.job_id) is not None:
            event_log.append(paths.events, _event(t, job, action, Phase.ERROR, error=str(e)))
        _maybe_give_up(paths, job, t, e)
        return out
    out.new_job_id = started.job_id
    return out


def _cancel(job: JobView, backend: Backend) -> None:
    if job.state.startswith("LOCAL_"):
        backend.cancel_local(int(job.job_id))
    else:
        backend.cancel_slurm(job.job_id)


def _wait_gone(job: JobView, backend: Backend, timeout_s: float = CANCEL_WAIT_S) -> bool:
    """Whether the cancelled job has left the queue (its processes are gone) in time;
    polled at growing intervals (attempts.poll_delays), each poll one squeue."""
    for pause in [*poll_delays(timeout_s), None]:
        if job.state.startswith("LOCAL_"):
            alive = job.job_id.isdigit() and backend.pid_alive(int(job.job_id))
        else:
            alive = job.job_id in backend.queued_job_ids()
        if not alive:
            return True
        if pause is None:
            return False
        backend.sleep(pause)
    return False


def _maybe_give_up(paths: RunPaths, job: JobView, t: float, err: GrpoError) -> None:
    """A config error (not Slurm being away) or repeated failures: STOP the run."""
    events = event_log.read(paths.events)
    errors = [e for e in events if e.get("phase") == Phase.ERROR and e.get("job_id") == job.job_id]
    config = isinstance(err, ConfigError) and not isinstance(err, SlurmUnavailableError)
    tries = [e for e in events if e.get("phase") == Phase.INTENT and e.get("job_id") == job.job_id]
    first = min((float(e.get("time", t)) for e in tries), default=t)  # the pass's own clock
    persistent = len(errors) >= MAX_SUBMIT_ERRORS and t - first >= SUBMIT_ERROR_WINDOW_S
    if config or persistent:
        why = f"resubmission failed ({len(errors)}x): {err}"
        cls = FailureClass.CONFIG_ERROR if config else FailureClass.BUDGET_EXHAUSTED
        stop = Action(ActionKind.STOP, cls, why)
        event_log.append(paths.events, _event(t, job, stop, Phase.DECISION))


def monitor_pass(
    runs: list[RunPaths],
    policy: MonitorPolicy,
    now: Callable[[], float] = time.time,
    backend: Backend | None = None,
) -> list[Outcome]:
    """One pass over many runs with one sacct and one squeue call for all of them."""
    backend = backend or Backend()
    # at most one sinfo per partition per pass, whatever the number of multi-node runs
    backend = dataclasses.replace(backend, up_nodes=functools.lru_cache(backend.up_nodes))
    live = [p for p in runs if not is_final(p)]
    ids = slurm_ids(next(iter(read_jsonl(p.jobs)[-1:]), None) for p in live)
    view = query_slurm(ids, backend.job_records, backend.queued_job_ids)
    outcomes = [monitor_run(p, policy, now, backend, view) for p in live]
    return [o for o in outcomes if o is not None]


# ------------------------------------------------------------------------------ command line


def format_outcome(o: Outcome, now: float) -> str:
    """One line per action, e.g. ``12:00:01 gsm8k-a job 123: RESUBMIT timeout ... -> job 124``."""
    cls = f" {o.action.failure_class.value}" if o.action.failure_class else ""
    line = f"{time.strftime('%H:%M:%S', time.localtime(now))} {o.run} job {o.job_id}: "
    line += f"{o.action.kind.value}{cls}: {o.action.reason}"
    if o.new_job_id:
        line += f" -> job {o.new_job_id}"
    return line + (f" [error: {o.error}]" if o.error else "")
