"""grpo-submit --resume on the real cluster: refused while the run's job is live; killed
between sbatch and jobs.jsonl, the next --resume adopts the job Slurm accepted instead of
submitting another one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from grpo_hpc.core.fsutil import read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.slurm import job_name

from .slurm_helpers import REPO, cli, cli_env, job_ids, queued, scancel, submit, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

KILLED_AFTER_SBATCH = (
    "import os, sys; import grpo_hpc.submit.job as s; "
    "s.record_job = lambda *a, **k: os._exit(9); "  # dies after sbatch, before the write
    "from grpo_hpc.cli.submit import main; sys.exit(main(sys.argv[1:]))"
)


def _run_jobs(name: str) -> set[str]:
    out = subprocess.run(
        ["squeue", "-h", f"--name={job_name(name)}", "-o", "%i"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


LONG_RUN = ("training.max_steps=1000", "faults.enabled=true", "faults.step_sleep=1")


def test_resume_refuses_while_job_live(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    first = submit(logs, "live", *LONG_RUN)
    paths = RunPaths(logs / "live")
    try:
        wait_for(f"job {first} in squeue", lambda: first in queued(), 30, interval=0.2)
        before = {p.name: p.read_bytes() for p in (paths.jobs, paths.events) if p.exists()}
        listing = sorted(p.name for p in paths.root.iterdir())
        proc = cli("cli.submit", "--resume", "live", "--logs", str(logs))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert f"live job {first}" in line and f"scancel {first}" in line, line
        after = {p.name: p.read_bytes() for p in (paths.jobs, paths.events) if p.exists()}
        assert after == before and _run_jobs("live") == {first}, "a second job was submitted"
        new = {p.name for p in paths.root.iterdir()} - set(listing)
        assert not new & {"monitor.lock", "events.jsonl"}, f"the refusal wrote {new}"
    finally:
        scancel(first)


def test_killed_resume_is_adopted_not_resubmitted(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    first = submit(logs, "adopt", *LONG_RUN)
    paths = RunPaths(logs / "adopt")
    ours = {first}
    try:
        scancel(first)  # a resume while it is live is refused (test above)
        wait_for(f"job {first} gone from squeue", lambda: first not in queued(), 60)
        cmd = [sys.executable, "-c", KILLED_AFTER_SBATCH, "--resume", "adopt", "--logs", str(logs)]
        killed = subprocess.run(cmd, env=cli_env(), cwd=REPO, timeout=120)
        assert killed.returncode == 9 and job_ids(paths) == [first]
        orphan = _run_jobs("adopt") - {first}
        ours |= orphan
        assert len(orphan) == 1, "the killed --resume should have left one job in Slurm"

        proc = cli("cli.submit", "--resume", "adopt", "--logs", str(logs))
        assert proc.returncode == 0, proc.stderr
        (job,) = orphan
        assert f"adopted job {job}" in proc.stdout
        ours |= set(job_ids(paths)) | _run_jobs("adopt")
        assert job_ids(paths) == [first, job] and _run_jobs("adopt") <= {first, job}
        assert read_jsonl(paths.events)[-1]["note"] == "adopted"
    finally:
        subprocess.run(["scancel", *sorted(ours)], check=False)  # only this test's jobs
