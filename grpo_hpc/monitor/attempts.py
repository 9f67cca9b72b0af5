"""Starting the next attempt of a run: the one place that does it.

``grpo-submit --resume`` and the monitor both call :func:`start_next_attempt`. In order,
under the run's lock (``monitor.lock``; a monitor pass holds it already):

1. **superseded**: the intent being finished is about a job that is no longer the newest
   (someone resubmitted meanwhile): nothing to do.
2. **adoption**: an intent left open by a submitter killed between sbatch and the write to
   jobs.jsonl: a job of the run Slurm accepted since that intent is recorded (adopted)
   instead of submitting a second one (extra orphans are cancelled).
3. **live job**: a job of the run still queued or running in Slurm, or a live local
   process, refuses (:class:`LiveJobError`, exit 2): a run has at most one live job, ever;
   two trainers on one run directory log every step twice and delete each other's
   checkpoint files. ``--resume`` checks this before it writes anything (the lock file
   included).
4. **intent**: an ``intent`` event in events.jsonl before sbatch (a person's has class
   ``manual``: it spends no retry budget; the monitor writes its own before it cancels).
5. **submission** (``--from-step`` first sets newer checkpoints aside), recorded in
   jobs.jsonl; the intent closed with ``done`` (or ``error`` when refused). Anything else
   leaves it open, so whoever comes next looks for the job in Slurm before submitting.

:func:`decision.decide` stays pure; the monitor decides, this module acts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_hpc.core import events as event_log
from grpo_hpc.core import slurm as slurm_query
from grpo_hpc.core.errors import ConfigError, ExitCode, GrpoError
from grpo_hpc.core.events import Event, Phase
from grpo_hpc.core.fsutil import read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import read_progress
from grpo_hpc.core.runs import pid_alive
from grpo_hpc.monitor.decision import ActionKind, FailureClass, pending_intent

LOCK_WAIT_S = 60
"""How long a --resume waits for a monitor pass that holds the run's lock."""
ENDING_WAIT_S = 60.0
"""How long to wait for a job whose trainer already recorded its outcome (progress.json)
to leave the queue (Slurm's epilog and KillWait; ``--wait`` returns on the outcome, so a
``--resume`` typed right after it meets the job still COMPLETING)."""
POLL_S = 0.5
POLL_CAP_S = 5.0
"""Polls of the queue while a job leaves it start POLL_S apart and double up to this: a job
that takes a site's KillWait (30 s) to end costs ~10 squeue calls, not 60 (each squeue is
a full job-table RPC to slurmctld; docs/scaling.md, "What one monitor costs Slurm")."""


def poll_delays(total_s: float, first_s: float = POLL_S, cap_s: float = POLL_CAP_S) -> list[float]:
    """The pauses between polls while waiting up to ``total_s`` for a job to leave the
    queue: doubling from ``first_s`` to ``cap_s``, summing to at least ``total_s`` (pure)."""
    out: list[float] = []
    while sum(out) < total_s:
        out.append(min(cap_s, first_s * 2 ** len(out)))
    return out


class LiveJobError(GrpoError):
    """A job of the run is still live: starting another would put two trainers on one run
    directory. A usage error (exit 2), but not a configuration error: the monitor retries
    on its next pass rather than stopping the run."""

    exit_code = ExitCode.CONFIG_ERROR


def submit_next(paths: RunPaths, reason: str, nodes: int | None = None) -> Any:
    from grpo_hpc.submit import (
        job as submit,  # submitit, omegaconf...: only when something is submitted
    )

    return submit.resubmit(paths, reason, nodes)


def record_adopted(paths: RunPaths, job_id: str, reason: str, nodes: int | None = None) -> None:
    from grpo_hpc.submit import job as submit

    submit.adopt(paths, job_id, reason, nodes)


def slurm_submitted_jobs(paths: RunPaths, since: float) -> list[str]:
    return slurm_query.submitted_jobs(paths.name, paths.submitit_dir, since)


@dataclass
class Effects:
    """The side effects of starting an attempt; the monitor passes its own, tests fakes."""

    queued_job_ids: Callable[[], set[str]] = slurm_query.queued_job_ids
    """Job ids squeue lists."""
    pid_alive: Callable[[int], bool] = pid_alive
    """Is a process alive."""
    submit: Callable[[RunPaths, str], Any] = submit_next
    """Submit the next attempt: a submit.SubmitResult, or just the new job id."""
    submitted_jobs: Callable[[RunPaths, float], list[str]] = slurm_submitted_jobs
    """Slurm jobs of the run submitted since a time (recorded in jobs.jsonl or not)."""
    cancel_slurm: Callable[[str], None] = slurm_query.cancel
    """scancel (an extra orphan)."""
    adopt: Callable[[RunPaths, str, str, int | None], None] = record_adopted
    """Record in jobs.jsonl a job that was submitted but never recorded, on the nodes its
    intent asked for (None: the profile's)."""
    sleep: Callable[[float], None] = time.sleep
    """Pause while an ending job leaves the queue."""


@dataclass
class Started:
    """What :func:`start_next_attempt` did."""

    job_id: str | None
    """The run's new newest job (submitted, adopted, or the one that superseded)."""
    how: str
    """``submitted``, ``adopted`` or ``superseded``."""
    attempt: int | None = None
    """Its attempt number (jobs.jsonl)."""
    job: Any = None
    """The submitit Job when submitted in this process (``--wait`` follows it)."""
    set_aside: list[int] | None = None
    """With ``from_step``: the newer checkpoint steps set aside."""


def local_job_alive(paths: RunPaths, pid: int, alive: Callable[[int], bool] = pid_alive) -> bool:
    """Whether the local-executor job ``pid`` still runs *this run's* job: submitit's
    controller has the run's ``submitit/`` folder on its command line, so a pid reused by
    an unrelated process (days later) or a zombie does not count."""
    if pid <= 1 or not alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False  # gone meanwhile
    except OSError:
        return True  # no /proc to ask: trust the pid
    return str(paths.submitit_dir).encode() in cmdline


def live_job(paths: RunPaths, fx: Effects | None = None) -> tuple[str, str] | None:
    """(job id, what it is) of a live job of the run, or None. Slurm jobs: any recorded job
    squeue still lists (pending, running, completing: slurmctld's own view, never stale
    accounting); local jobs: the newest one's controller process."""
    fx = fx or Effects()
    jobs = read_jsonl(paths.jobs)
    if not jobs:
        return None
    newest = jobs[-1]
    if newest.get("executor") == "local":
        pid = str(newest["job_id"])
        if pid.isdigit() and local_job_alive(paths, int(pid), fx.pid_alive):
            return pid, "local process"
        return None
    ids = [str(j["job_id"]) for j in jobs if j.get("executor") != "local"]
    queued = fx.queued_job_ids()
    live = [j for j in ids if j in queued]
    return (live[-1], "in the Slurm queue") if live else None


def _ending(paths: RunPaths, job_id: str) -> bool:
    """Whether the job's trainer already recorded how it ended: the job is only leaving."""
    rec = read_progress(paths.progress)
    return rec is not None and rec.state.terminal and str(rec.job_id) == job_id


def refuse_if_live(paths: RunPaths, fx: Effects | None = None) -> None:
    """Raise LiveJobError naming the live job of the run, if there is one. A job whose
    trainer has recorded its outcome gets up to ENDING_WAIT_S to leave the queue first."""
    fx = fx or Effects()
    pauses = iter(poll_delays(ENDING_WAIT_S))
    while (found := live_job(paths, fx)) is not None:
        job, where = found
        pause = next(pauses, None) if _ending(paths, job) else None
        if pause is None:
            stop = f"kill {job}" if where == "local process" else f"scancel {job}"
            raise LiveJobError(
                f"run {paths.name!r} still has a live job {job} ({where}): {stop} or wait "
                "for it to end, then resume (two jobs would train on one run directory)"
            )
        fx.sleep(pause)


# ------------------------------------------------------------------------ the run's lock


@contextlib.contextmanager
def run_lock(paths: RunPaths) -> Iterator[bool]:
    """Non-blocking per-run lock; yields False when another process holds it (a monitor
    pass, a --resume) or the run directory is gone (deleted: nothing left to act on)."""
    try:
        fd = os.open(paths.monitor_lock, os.O_RDWR | os.O_CREAT, 0o644)
    except (FileNotFoundError, NotADirectoryError):
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing releases the lock


# ------------------------------------------------------------------------------- intents


def open_intent(paths: RunPaths, reason: str) -> dict[str, Any]:
    """Record, before submitting, that a person is resubmitting the run (about the newest
    job, as the monitor's own intents are)."""
    jobs = read_jsonl(paths.jobs)
    job_id = str(jobs[-1]["job_id"]) if jobs else "none"
    ev = Event(
        time.time(),
        job_id,
        Phase.INTENT,
        ActionKind.RESUBMIT.value,
        FailureClass.MANUAL.value,
        reason,
        extra={"cancel": False},
    )
    return event_log.append(paths.events, ev)


def close_intent(
    paths: RunPaths, intent: dict[str, Any], phase: Phase, t: float | None = None, **extra: Any
) -> dict[str, Any]:
    """``done`` or ``error`` for an intent (at ``t``, default now): whoever acted on it
    lived to record the outcome. The record written."""
    closed = Event.parse(intent).closing(phase, time.time() if t is None else t, **extra)
    return event_log.append(paths.events, closed)


def close_superseded(
    paths: RunPaths, events: list[dict[str, Any]], jobs: list[dict[str, Any]], t: float
) -> None:
    """A monitor killed after submitting left an open intent on the previous job: close it."""
    if len(jobs) < 2:
        return
    prev, newest = str(jobs[-2]["job_id"]), str(jobs[-1]["job_id"])
    intent = pending_intent(events, prev)
    if intent is not None:
        events.append(
            close_intent(paths, intent, Phase.DONE, t, new_job_id=newest, note="superseded")
        )


def adopt_orphan(
    paths: RunPaths, reason: str, since: float, fx: Effects, nodes: int | None = None
) -> str | None:
    """A job submitted for the run since ``since`` but missing from jobs.jsonl (its
    submitter killed between sbatch and the write): record it rather than submit a second
    one, on the ``nodes`` it was submitted on (None: the profile's); cancel any further
    orphans. The adopted job id, or None."""
    known = {str(j["job_id"]) for j in read_jsonl(paths.jobs)}
    orphans = [j for j in fx.submitted_jobs(paths, since) if j not in known]
    if not orphans:
        return None
    orphans.sort(key=lambda j: (len(j), j))
    for extra in orphans[:-1]:
        fx.cancel_slurm(extra)
    fx.adopt(paths, orphans[-1], reason, nodes)
    return orphans[-1]


# --------------------------------------------------------------------------- the one entry


def start_next_attempt(
    paths: RunPaths,
    reason: str,
    *,
    from_step: int | None = None,
    intent: dict[str, Any] | None = None,
    since: float | None = None,
    effects: Effects | None = None,
    lock_held: bool = False,
) -> Started:
    """Start the next attempt of a run (module docstring: the steps, in order).

    ``intent``: the monitor's own intent event (already written); None for a person's
    ``--resume``, which writes one. ``since``: the monitor is finishing the intent of a
    monitor killed mid-action (its time): adopt what that one submitted.
    ``lock_held``: the caller (a monitor pass) holds the run's lock; otherwise it is taken
    here, waiting up to LOCK_WAIT_S for a monitor pass to finish.
    """
    fx = effects or Effects()
    if lock_held:
        return _start_locked(paths, reason, from_step, intent, since, fx)
    refuse_if_live(paths, fx)  # before anything is written, the lock file included
    for _ in range(LOCK_WAIT_S):
        with run_lock(paths) as locked:
            if locked:
                return _start_locked(paths, reason, from_step, intent, since, fx)
        time.sleep(1)
    raise ConfigError(
        f"a grpo-monitor has been acting on run {paths.name!r} for {LOCK_WAIT_S} s: retry later"
    )


def _start_locked(
    paths: RunPaths,
    reason: str,
    from_step: int | None,
    intent: dict[str, Any] | None,
    since: float | None,
    fx: Effects,
) -> Started:
    jobs = read_jsonl(paths.jobs)
    newest = str(jobs[-1]["job_id"]) if jobs else None
    if intent is not None and str(intent["job_id"]) != newest:
        close_intent(paths, intent, Phase.DONE, new_job_id=newest, note="superseded")
        return Started(newest, "superseded")
    adopted = _adopt(paths, jobs, intent, since, fx)
    if adopted is not None:
        return adopted
    try:
        refuse_if_live(paths, fx)
    except LiveJobError as e:
        if intent is not None:
            close_intent(paths, intent, Phase.ERROR, error=str(e))
        raise
    intent = intent if intent is not None else open_intent(paths, reason)
    set_aside = None
    try:
        if from_step is not None:
            from grpo_hpc.submit.job import rewind

            set_aside = rewind(paths, from_step)
        result = fx.submit(paths, reason)
    except (GrpoError, KeyboardInterrupt) as e:  # refused or stopped: nothing to adopt
        close_intent(paths, intent, Phase.ERROR, error=str(e) or type(e).__name__)
        raise
    job_id = result if isinstance(result, str) else str(result.job_id)
    close_intent(paths, intent, Phase.DONE, new_job_id=job_id)
    attempt = getattr(result, "attempt", None)
    return Started(job_id, "submitted", attempt, getattr(result, "job", None), set_aside)


def _adopt(
    paths: RunPaths,
    jobs: list[dict[str, Any]],
    intent: dict[str, Any] | None,
    since: float | None,
    fx: Effects,
) -> Started | None:
    """Step 2: the open intent of a killed submitter (the monitor's, re-applied with
    ``since``; or, for a --resume, any open intent on the newest job) and the job Slurm
    accepted since it. A local job is a pid: there is no queue to find it in."""
    if not jobs or jobs[-1].get("executor") == "local":
        return None
    if intent is None:
        intent = pending_intent(event_log.read(paths.events), str(jobs[-1]["job_id"]))
        since = float(intent["time"]) if intent is not None else None
    if intent is None or since is None:
        return None
    why = f"{intent.get('reason') or 'resubmission'} (adopted: its submitter was killed)"
    # the nodes the intent's submission asked for: fewer than the profile's after a node
    # loss (the monitor's intent keeps them); the record must say so, or the run is taken
    # for a full one and never grows back (monitor/nodes.py, should_regrow)
    job = adopt_orphan(paths, why, since, fx, intent.get("nodes"))
    if job is None:
        return None
    close_intent(paths, intent, Phase.DONE, new_job_id=job, note="adopted")
    return Started(job, "adopted", len(read_jsonl(paths.jobs)) - 1)
