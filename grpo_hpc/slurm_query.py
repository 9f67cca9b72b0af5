"""The only module that calls Slurm's command-line tools (sacct, squeue, scancel, sinfo).

Everything else gets typed records from here. One ``sacct`` call answers for
any number of jobs, so a dashboard of 100 runs costs one process, not 100.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

from grpo_hpc.errors import SlurmUnavailableError

TIMEOUT_S = 20.0
# Slurm states grouped by what they mean for a training run.
ACTIVE_STATES = {
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "RESIZING",
    "SUSPENDED",
    "COMPLETING",
    "CONFIGURING",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "SIGNALING",
    "STAGE_OUT",
}


@dataclass(frozen=True)
class JobRecord:
    """What Slurm accounting knows about one job (the allocation, not its steps)."""

    job_id: str
    state: str
    """Base state word, e.g. RUNNING, COMPLETED, CANCELLED, TIMEOUT, PREEMPTED, NODE_FAIL."""
    exit_code: int | None = None
    """Exit code of the batch script (None if unknown)."""
    elapsed_s: int | None = None
    """Elapsed wall time in seconds."""
    restarts: int = 0
    """Times the job was requeued (sacct Restarts)."""
    started_at: float | None = None
    """Unix time the job (its latest run, after a requeue) started; None if not yet."""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


def _run(cmd: list[str], check: bool = True, env: dict[str, str] | None = None) -> str:
    if shutil.which(cmd[0]) is None:
        raise SlurmUnavailableError(
            f"{cmd[0]} not found: Slurm's client tools are not on PATH "
            "(load the Slurm module, or use --profile local)"
        )
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env={**os.environ, **env} if env else None,
        )
    except subprocess.TimeoutExpired:
        raise SlurmUnavailableError(
            f"{cmd[0]} did not answer within {TIMEOUT_S:.0f} s: is slurmctld up?"
        ) from None
    if check and proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        raise SlurmUnavailableError(
            f"{' '.join(cmd[:2])} failed: {err[-1] if err else 'exit ' + str(proc.returncode)}"
        )
    return proc.stdout


def check_available() -> None:
    """Raise SlurmUnavailableError unless sbatch exists and slurmctld answers."""
    if shutil.which("sbatch") is None:
        raise SlurmUnavailableError(
            "sbatch not found: this machine has no Slurm client tools "
            "(load the Slurm module, or use --profile local)"
        )
    try:
        _run(["sinfo", "-h", "-o", "%P"])
    except SlurmUnavailableError as e:
        raise SlurmUnavailableError(
            f"Slurm is not reachable ({e}): check that slurmctld is running "
            "(for the test cluster: bash slurm/up.sh)"
        ) from None


def _parse_elapsed(text: str) -> int | None:
    # [D-]HH:MM:SS or MM:SS
    try:
        days = 0
        if "-" in text:
            d, text = text.split("-", 1)
            days = int(d)
        parts = [int(p) for p in text.split(":")]
        while len(parts) < 3:
            parts.insert(0, 0)
        h, m, s = parts
        return days * 86400 + h * 3600 + m * 60 + s
    except ValueError:
        return None


def parse_sacct(text: str) -> dict[str, JobRecord]:
    """Parse ``sacct -X -n -P -o JobID,State,ExitCode,Elapsed,Restarts,Start`` output
    (with ``SLURM_TIME_FORMAT=%s``, so Start is a Unix time or "Unknown") (pure)."""
    out: dict[str, JobRecord] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 5 or not parts[0]:
            continue
        job_id, state, exit_code, elapsed, restarts = parts[:5]
        start = parts[5] if len(parts) > 5 else ""
        code = exit_code.split(":")[0]
        out[job_id] = JobRecord(
            job_id=job_id,
            state=state.split()[0] if state else "UNKNOWN",  # "CANCELLED by 0" -> CANCELLED
            exit_code=int(code) if code.isdigit() else None,
            elapsed_s=_parse_elapsed(elapsed),
            restarts=int(restarts) if restarts.isdigit() else 0,
            started_at=float(start) if start.isdigit() else None,
        )
    return out


def job_records(job_ids: Iterable[str]) -> dict[str, JobRecord]:
    """Accounting records for the given jobs, in one sacct call. Missing ids are absent."""
    ids = sorted({str(j) for j in job_ids if j})
    if not ids:
        return {}
    text = _run(
        [
            "sacct",
            "-X",
            "-n",
            "-P",
            "-o",
            "JobID,State,ExitCode,Elapsed,Restarts",
            "-j",
            ",".join(ids),
        ]
    )
    return parse_sacct(text)


def queued_job_ids() -> set[str]:
    """Job ids squeue currently lists (pending, running, completing...)."""
    return {line.strip() for line in _run(["squeue", "-h", "-o", "%i"]).splitlines() if line}


def cancel(job_id: str, signal: str | None = None) -> None:
    """scancel a job (optionally only send it a signal). Never raises for a finished job."""
    cmd = ["scancel"] + ([f"--signal={signal}"] if signal else []) + [str(job_id)]
    _run(cmd, check=False)
