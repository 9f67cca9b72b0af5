"""Finding runs, and what their newest job is doing, for grpo-monitor, grpo-status, grpo-ckpt.

Slurm is asked once per pass for all runs (:func:`query_slurm`: one ``sacct``, one
``squeue``); a local-executor job (``executor: local`` in jobs.jsonl) is a pid, checked
with ``os.kill(pid, 0)``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_hpc.core import slurm as slurm_query
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.core.events import Phase
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.slurm import JobRecord

RUNNING_STATES = frozenset({"RUNNING", "LOCAL_RUNNING"})
"""Job states that count as running: Slurm's, and a local-executor job's live pid."""
COMPLETING = "COMPLETING"
"""A job that has ended but still holds its allocation: Slurm's own state, or what
:func:`job_view` says of a job accounting has an end for while squeue still lists it."""


@dataclass(frozen=True)
class JobView:
    """The newest job of a run, as the monitor sees it."""

    job_id: str
    """Slurm job id, or the pid of a local-executor job."""
    state: str
    """Slurm state word, LOCAL_RUNNING / LOCAL_EXITED, or MISSING (unknown to squeue+sacct)."""
    exit_code: int | None = None
    """Exit code from accounting, when known."""
    submitted_at: float | None = None
    """Submission time (jobs.jsonl)."""
    started_at: float | None = None
    """When it (re)started running: first RUNNING observation of the current streak."""


def running_since(events: list[dict[str, Any]], job_id: str) -> float | None:
    """Start of the latest streak of RUNNING observations of a job (pure)."""
    since = None
    for ev in events:
        if str(ev.get("job_id")) != job_id or ev.get("phase") != Phase.DECISION:
            continue
        if ev.get("slurm_state") in RUNNING_STATES:
            since = since if since is not None else float(ev["time"])
        else:
            since = None
    return since


def pid_alive(pid: int) -> bool:
    """Whether a local-executor job's process still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class SlurmView:
    """One pass's answers from Slurm."""

    records: dict[str, JobRecord] = field(default_factory=dict)
    """sacct records by job id."""
    queued: set[str] = field(default_factory=set)
    """Job ids known to squeue."""


def query_slurm(
    job_ids: Iterable[str],
    job_records: Callable[[Iterable[str]], dict[str, JobRecord]] | None = None,
    queued_job_ids: Callable[[], set[str]] | None = None,
) -> SlurmView:
    """One sacct and one squeue call for all Slurm jobs of a pass (none if no ids)."""
    ids = sorted(set(job_ids))
    if not ids:
        return SlurmView()
    records = (job_records or slurm_query.job_records)(ids)
    return SlurmView(records, (queued_job_ids or slurm_query.queued_job_ids)())


def slurm_ids(entries: Iterable[dict[str, Any] | None]) -> list[str]:
    """Job ids of the Slurm (not local) entries of jobs.jsonl."""
    return [str(e["job_id"]) for e in entries if e and e.get("executor") != "local"]


def job_view(
    entry: dict[str, Any],
    view: SlurmView,
    events: list[dict[str, Any]],
    alive: Callable[[int], bool] = pid_alive,
) -> JobView:
    """The newest job of a run (its jobs.jsonl entry) as decide() sees it."""
    job_id, submitted = str(entry["job_id"]), entry.get("submitted_at")
    if entry.get("executor") == "local":
        running = job_id.isdigit() and alive(int(job_id))
        state = "LOCAL_RUNNING" if running else "LOCAL_EXITED"
        return JobView(job_id, state, submitted_at=submitted, started_at=submitted)
    rec = view.records.get(job_id)
    if rec is None:
        state = "PENDING" if job_id in view.queued else "MISSING"
        return JobView(job_id, state, submitted_at=submitted)
    if not rec.active and job_id in view.queued:
        # Accounting already has the end state (e.g. CANCELLED) while squeue still lists
        # the job: its processes are being killed. Resubmitting now would start a second
        # trainer on the run directory while the first one may still write to it.
        return JobView(job_id, COMPLETING, rec.exit_code, submitted)
    since = None
    if rec.state == "RUNNING":
        since = rec.started_at or running_since(events, job_id)
    return JobView(job_id, rec.state, rec.exit_code, submitted, since)


def discover_runs(logs_root: Path) -> list[RunPaths]:
    """Every run directory under ``logs_root`` that has a job history, by name."""
    if not logs_root.is_dir():
        return []
    dirs = (d for d in sorted(logs_root.iterdir()) if d.is_dir() and not d.name.startswith("."))
    return [RunPaths(d) for d in dirs if (d / "jobs.jsonl").exists()]


def resolve_run(name: str, logs_root: Path) -> RunPaths:
    """A run by name under ``logs_root``, or by the path of its directory."""
    p = Path(name)
    if "/" in name and p.is_dir():
        return RunPaths(p.resolve())
    paths = RunPaths.for_run(name, logs_root)
    if not paths.root.is_dir():
        raise ConfigError(f"no run {name!r} in {logs_root} (grpo-status lists the runs)")
    return paths


def resolve_runs(names: list[str], logs_root: Path) -> list[RunPaths]:
    """The named runs, or every run under ``logs_root`` when none is named."""
    if not names:
        return discover_runs(logs_root)
    return [resolve_run(n, logs_root) for n in names]
