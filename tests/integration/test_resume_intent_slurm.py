"""grpo-submit --resume killed between sbatch and jobs.jsonl, on the real cluster: the next
--resume adopts the job Slurm accepted instead of submitting another one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from grpo_hpc.fsutil import read_jsonl
from grpo_hpc.paths import RunPaths
from grpo_hpc.slurm_query import job_name

from .slurm_helpers import REPO, cli, cli_env, job_ids, submit

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

KILLED_AFTER_SBATCH = (
    "import os, sys; import grpo_hpc.submit as s; "
    "s.record_job = lambda *a, **k: os._exit(9); "  # dies after sbatch, before the write
    "from grpo_hpc.cli import submit_main; sys.exit(submit_main(sys.argv[1:]))"
)


def _run_jobs(name: str) -> set[str]:
    out = subprocess.run(
        ["squeue", "-h", f"--name={job_name(name)}", "-o", "%i"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


def test_killed_resume_is_adopted_not_resubmitted(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    first = submit(logs, "adopt", "training.max_steps=1000", "faults.enabled=true",
                   "faults.step_sleep=1")  # fmt: skip
    paths = RunPaths(logs / "adopt")
    ours = {first}
    try:
        cmd = [sys.executable, "-c", KILLED_AFTER_SBATCH, "--resume", "adopt", "--logs", str(logs)]
        killed = subprocess.run(cmd, env=cli_env(), cwd=REPO, timeout=120)
        assert killed.returncode == 9 and job_ids(paths) == [first]
        orphan = _run_jobs("adopt") - {first}
        ours |= orphan
        assert len(orphan) == 1, "the killed --resume should have left one job in Slurm"

        proc = cli("cli", "--resume", "adopt", "--logs", str(logs))
        assert proc.returncode == 0, proc.stderr
        (job,) = orphan
        assert f"adopted job {job}" in proc.stdout
        ours |= set(job_ids(paths)) | _run_jobs("adopt")
        assert job_ids(paths) == [first, job] and _run_jobs("adopt") <= {first, job}
        assert read_jsonl(paths.events)[-1]["note"] == "adopted"
    finally:
        subprocess.run(["scancel", *sorted(ours)], check=False)  # only this test's jobs
