"""Jobs of a run that Slurm has but jobs.jsonl lacks (a submitter killed between sbatch and
the write): finding and adopting them, and closing intents a newer job superseded.

A submitter (the monitor, or ``grpo-submit --resume``) writes an ``intent`` event to
events.jsonl before it submits and ``done`` (or ``error``) after it recorded the job. An
intent still open later means the submitter died in between: whoever comes next (a monitor
pass, the next ``--resume``) looks for a job of the run that Slurm accepted since the
intent and adopts it instead of submitting a second one."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from grpo_hpc import slurm_query
from grpo_hpc.decision import ActionKind, FailureClass, pending_intent
from grpo_hpc.fsutil import append_jsonl, read_jsonl
from grpo_hpc.paths import RunPaths


def slurm_submitted_jobs(paths: RunPaths, since: float) -> list[str]:
    """Slurm jobs of the run submitted since ``since``, recorded in jobs.jsonl or not."""
    return slurm_query.submitted_jobs(paths.name, paths.submitit_dir, since)


def record_adopted(paths: RunPaths, job_id: str, reason: str) -> None:
    """Record in jobs.jsonl a job that was submitted but never recorded."""
    from grpo_hpc import submit  # submitit, omegaconf...: only when something is adopted

    submit.adopt(paths, job_id, reason)


def close_superseded(
    paths: RunPaths, events: list[dict[str, Any]], jobs: list[dict[str, Any]], t: float
) -> None:
    """A monitor killed after submitting left an open intent on the previous job: close it."""
    if len(jobs) < 2:
        return
    prev, newest = str(jobs[-2]["job_id"]), str(jobs[-1]["job_id"])
    intent = pending_intent(events, prev)
    if intent is not None:
        done = {**intent, "time": t, "phase": "done", "new_job_id": newest, "note": "superseded"}
        append_jsonl(paths.events, done)
        events.append(done)


def adopt_orphan(
    paths: RunPaths,
    reason: str,
    since: float,
    submitted_jobs: Callable[[RunPaths, float], list[str]],
    cancel: Callable[[str], None],
    adopt: Callable[[RunPaths, str, str], None],
) -> str | None:
    """A job submitted for the run since ``since`` but missing from jobs.jsonl (a monitor
    killed between sbatch and the write): record it rather than submit a second one."""
    known = {str(j["job_id"]) for j in read_jsonl(paths.jobs)}
    orphans = [j for j in submitted_jobs(paths, since) if j not in known]
    if not orphans:
        return None
    orphans.sort(key=lambda j: (len(j), j))
    for extra in orphans[:-1]:
        cancel(extra)
    adopt(paths, orphans[-1], reason)
    return orphans[-1]


def _newest_job(paths: RunPaths) -> str:
    jobs = read_jsonl(paths.jobs)
    return str(jobs[-1]["job_id"]) if jobs else "none"


def open_manual_intent(paths: RunPaths, reason: str) -> dict[str, Any]:
    """Record, before submitting, that a person is resubmitting the run (the newest job is
    what the intent is about, as for the monitor's own intents)."""
    ev = {
        "time": time.time(),
        "job_id": _newest_job(paths),
        "slurm_state": None,
        "phase": "intent",
        "action": ActionKind.RESUBMIT.value,
        "class": FailureClass.MANUAL.value,
        "reason": reason,
        "cancel": False,
    }
    append_jsonl(paths.events, ev)
    return ev


def close_intent(paths: RunPaths, intent: dict[str, Any], phase: str, **extra: Any) -> None:
    """``done`` or ``error`` for an intent: the submitter lived to record the outcome."""
    append_jsonl(paths.events, {**intent, "time": time.time(), "phase": phase, **extra})


def adopt_pending(
    paths: RunPaths,
    submitted_jobs: Callable[[RunPaths, float], list[str]] = slurm_submitted_jobs,
    cancel: Callable[[str], None] | None = None,
    adopt: Callable[[RunPaths, str, str], None] = record_adopted,
) -> str | None:
    """If a submitter died between sbatch and jobs.jsonl (an open intent on the newest
    job), adopt the job Slurm accepted for the run since then and close the intent; the
    adopted job id, or None (no open intent, or nothing was submitted: submit as usual)."""
    jobs = read_jsonl(paths.jobs)
    if not jobs or jobs[-1].get("executor") == "local":
        return None  # a local job is a pid: there is no queue to find it in
    intent = pending_intent(read_jsonl(paths.events), str(jobs[-1]["job_id"]))
    if intent is None:
        return None
    if cancel is None:
        cancel = slurm_query.cancel
    reason = f"{intent.get('reason') or 'resubmission'} (adopted: its submitter was killed)"
    job = adopt_orphan(paths, reason, float(intent["time"]), submitted_jobs, cancel, adopt)
    if job is not None:
        close_intent(paths, intent, "done", new_job_id=job, note="adopted")
    return job
