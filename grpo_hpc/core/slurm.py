"""The only module that calls Slurm's command-line tools (sacct, squeue, scancel, sinfo).

Everything else gets typed records from here. One ``sacct`` call answers for
any number of jobs, so a dashboard of 100 runs costs one process, not 100.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from grpo_hpc.core.errors import SlurmUnavailableError

TIMEOUT_S = 20.0
SKEW_S = 60.0
FAR = "now+3650days"
"""Clock difference tolerated between this machine and slurmctld."""
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
    started_at: float | None = None
    """Unix time the job (its latest run, after a requeue) started; None if not yet."""
    nodes: str | None = None
    """Its nodes as Slurm writes them (``grpo-n[1-2]``); None before any are assigned."""

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
        daemon = "slurmdbd" if cmd[0] == "sacct" else "slurmctld"  # sacct asks accounting
        raise SlurmUnavailableError(
            f"{cmd[0]} did not answer within {TIMEOUT_S:.0f} s: is {daemon} up?"
        ) from None
    if check and proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        raise SlurmUnavailableError(
            f"{' '.join(cmd[:2])} failed: {err[-1] if err else 'exit ' + str(proc.returncode)}"
        )
    return proc.stdout


def check_available() -> None:
    """Raise SlurmUnavailableError unless sbatch exists and slurmctld answers."""
    for tool in ("sbatch", "srun"):  # submitit needs srun on PATH to build the job
        if shutil.which(tool) is None:
            raise SlurmUnavailableError(
                f"{tool} not found: this machine has no Slurm client tools "
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


SACCT_FIELDS = "JobID,State,ExitCode,Elapsed,Start,NodeList"
"""sacct has no requeue counter (there is no ``Restarts`` field in Slurm 22.05; sacct
rejects the whole call for an unknown field); without ``-D`` it shows a requeued job's
latest run, whose Start is that run's start."""


def parse_sacct(text: str) -> dict[str, JobRecord]:
    """Parse ``sacct -X -n -P -o JobID,State,ExitCode,Elapsed,Start,NodeList`` output (with
    ``SLURM_TIME_FORMAT=%s``, so Start is a Unix time or "Unknown") (pure)."""
    out: dict[str, JobRecord] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4 or not parts[0]:
            continue
        job_id, state, exit_code, elapsed = parts[:4]
        start = parts[4] if len(parts) > 4 else ""
        nodes = parts[5].strip() if len(parts) > 5 else ""
        code = exit_code.split(":")[0]
        out[job_id] = JobRecord(
            job_id=job_id,
            state=state.split()[0] if state else "UNKNOWN",  # "CANCELLED by 0" -> CANCELLED
            exit_code=int(code) if code.isdigit() else None,
            elapsed_s=_parse_elapsed(elapsed),
            started_at=float(start) if start.isdigit() else None,
            nodes=nodes if nodes and nodes != "None assigned" else None,
        )
    return out


def job_records(job_ids: Iterable[str]) -> dict[str, JobRecord]:
    """Accounting records for the given jobs, in one sacct call. Missing ids are absent."""
    ids = sorted({str(j) for j in job_ids if j})
    if not ids:
        return {}
    cmd = ["sacct", "-X", "-n", "-P", "-o", SACCT_FIELDS, "-j", ",".join(ids)]
    return parse_sacct(_run(cmd, env={"SLURM_TIME_FORMAT": "%s"}))


def job_name(run_name: str) -> str:
    """The Slurm job name of every job of a run."""
    return f"grpo-{run_name}"


def parse_submit_lines(text: str, script_dir: Path, since: float) -> list[str]:
    """Job ids from ``JobID|Submit|command`` lines (``sacct -o JobID,Submit,SubmitLine`` or
    ``squeue -o %i|%V|%o``, with ``SLURM_TIME_FORMAT=%s``) submitted at or after ``since``
    whose sbatch script lies in ``script_dir`` (submitit runs
    ``sbatch <folder>/.submission_file_<uuid>.sh``) (pure)."""
    prefix = f"{str(script_dir).rstrip('/')}/"
    out = []
    for line in text.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) < 3 or not parts[0] or not parts[1].isdigit():
            continue
        job_id, submitted, command = parts
        ours = any(arg.startswith(prefix) for arg in command.split())
        if ours and float(submitted) >= since:
            out.append(job_id)
    return out


def submitted_jobs(run_name: str, script_dir: Path, since: float) -> list[str]:
    """Ids of the run's jobs submitted since ``since`` (Unix time; a minute of clock skew
    allowed), recorded in jobs.jsonl or not: how a restarted monitor finds the job that a
    killed monitor submitted but did not live to record.

    squeue answers at once for queued jobs; accounting (slurmdbd) learns of a new job only
    seconds later, but also knows the jobs that have already ended."""
    env, name, after = {"SLURM_TIME_FORMAT": "%s"}, job_name(run_name), since - SKEW_S
    queued = _run(["squeue", "-h", f"--name={name}", "-o", "%i|%V|%o"], env=env)
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(after))
    # -E in the far future: a pending job (held by --begin, say) counts as in the window.
    cmd = ["sacct", "-X", "-n", "-P", f"--name={name}", "-S", start, "-E", FAR]
    accounted = _run(cmd + ["-o", "JobID,Submit,SubmitLine"], env=env)
    ids = parse_submit_lines(queued + "\n" + accounted, script_dir, after)
    return sorted(set(ids), key=lambda j: (len(j), j))


def queued_job_ids() -> set[str]:
    """Job ids squeue currently lists: pending, running, completing... (not finished ones)."""
    return {line.strip() for line in _run(["squeue", "-h", "-o", "%i"]).splitlines() if line}


def pending_reason(job_id: str) -> str | None:
    """Why squeue says a pending job waits (``Resources``, ``Priority``, ``PartitionConfig``
    ...); None when it is not pending (running, finished, or unknown to squeue)."""
    out = _run(["squeue", "-h", "-j", str(job_id), "-t", "PD", "-o", "%r"], check=False)
    lines = [x.strip() for x in out.splitlines() if x.strip()]
    return lines[0] if lines else None


UP_STATES = ("idle", "alloc", "mix", "comp", "resv", "plnd", "planned", "maint")
"""sinfo's short node states of a node in service (``%t``); a trailing ``*`` (not
responding), ``~`` (powered off) or ``#``/``!``/``%`` (powering up or down) is not up."""


def parse_up_nodes(text: str, partition: str | None) -> int:
    """Nodes in service in ``partition`` (None: the default one, ``%P`` ending in ``*``)
    from ``sinfo -h -N -o %N|%t|%P`` (pure)."""
    up = set()
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3:
            continue
        node, state, part = parts
        if (part.rstrip("*") != partition) if partition else not part.endswith("*"):
            continue
        if state in UP_STATES:
            up.add(node)
    return len(up)


def up_nodes(partition: str | None) -> int:
    """How many nodes of ``partition`` are in service now, in one sinfo call."""
    return parse_up_nodes(_run(["sinfo", "-h", "-N", "-o", "%N|%t|%P"]), partition)


def cancel(job_id: str, signal: str | None = None) -> None:
    """scancel a job (optionally only send it a signal). Never raises for a finished job."""
    cmd = ["scancel"] + ([f"--signal={signal}"] if signal else []) + [str(job_id)]
    _run(cmd, check=False)
