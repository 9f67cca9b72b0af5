"""Starting the next attempt of a run: the one place that does it.

A run has at most one live job, ever: two trainers on one run directory log every step
twice and overwrite each other's checkpoints. So before anything is submitted:

* a job of the run that is still live (queued or running in Slurm; a live local-executor
  process) refuses the resubmission (:class:`LiveJobError`, exit 2): cancel it first.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from grpo_hpc import slurm_query
from grpo_hpc.errors import ExitCode, GrpoError
from grpo_hpc.fsutil import read_jsonl
from grpo_hpc.paths import RunPaths


class LiveJobError(GrpoError):
    """A job of the run is still live: starting another would put two trainers on one run
    directory. A usage error (exit 2), but not a configuration error: the monitor retries
    on its next pass rather than stopping the run."""

    exit_code = ExitCode.CONFIG_ERROR


def pid_alive(pid: int) -> bool:
    """Whether a process exists (a local-executor job's controller)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


def live_job(
    paths: RunPaths,
    queued_job_ids: Callable[[], set[str]] = slurm_query.queued_job_ids,
    alive: Callable[[int], bool] = pid_alive,
) -> tuple[str, str] | None:
    """(job id, what it is) of a live job of the run, or None. Slurm jobs: any recorded job
    squeue still lists (pending, running, completing: slurmctld's own view, never stale
    accounting); local jobs: the newest one's controller process."""
    jobs = read_jsonl(paths.jobs)
    if not jobs:
        return None
    newest = jobs[-1]
    if newest.get("executor") == "local":
        pid = str(newest["job_id"])
        if pid.isdigit() and local_job_alive(paths, int(pid), alive):
            return pid, "local process"
        return None
    ids = [str(j["job_id"]) for j in jobs if j.get("executor") != "local"]
    queued = queued_job_ids()
    live = [j for j in ids if j in queued]
    return (live[-1], "in the Slurm queue") if live else None


def refuse_if_live(
    paths: RunPaths,
    queued_job_ids: Callable[[], set[str]] = slurm_query.queued_job_ids,
    alive: Callable[[int], bool] = pid_alive,
) -> None:
    """Raise LiveJobError naming the live job of the run, if there is one."""
    found = live_job(paths, queued_job_ids, alive)
    if found is None:
        return
    job, where = found
    stop = f"kill {job}" if where == "local process" else f"scancel {job}"
    raise LiveJobError(
        f"run {paths.name!r} still has a live job {job} ({where}): {stop} or wait for it "
        "to end, then resume (two jobs would train on one run directory)"
    )
