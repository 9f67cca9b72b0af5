"""Jobs of a run that Slurm has but jobs.jsonl lacks (a submitter killed between sbatch and
the write): finding and adopting them, and closing intents a newer job superseded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grpo_hpc import slurm_query
from grpo_hpc.decision import pending_intent
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
    adopt(paths, orphans[-1], f"{reason} (adopted: submitted by a monitor killed mid-action)")
    return orphans[-1]
