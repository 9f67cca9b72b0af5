"""grpo-status of a run whose trainer crashed, from the files the real crash left: the
exception's line, the exit class and the monitor's answer, where a user looks."""

from __future__ import annotations

from pathlib import Path

from grpo_hpc.config.profiles import load_profile
from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.progress import read_progress
from grpo_hpc.submit.job import record_job
from tests.conftest import run_cli

from .helpers import make_run, train

GONE_PID = "999999999"
"""The local job's id, a pid no process has: the job has ended, as a crashed one has."""


def test_status_shows_why_a_crashed_run_failed_and_what_the_monitor_would_do(
    tmp_path: Path,
) -> None:
    args = ("faults.enabled=true", "faults.crash_at_step=1", "training.max_steps=2")
    paths = make_run(tmp_path, "crashed", *args)
    # the job as grpo-submit records a local one (jobs.jsonl), so that status and the
    # monitor's rule see a job that ended
    record_job(paths, GONE_PID, load_profile("local"), "initial submission")
    assert train(paths).returncode == ExitCode.CRASH
    reason = read_progress(paths.progress).reason
    assert reason == "RuntimeError: fault injection: crash at step 1"

    result = run_cli("grpo_hpc.cli.status:main", "--logs", str(tmp_path), "crashed")
    assert result.returncode == ExitCode.OK, result.stderr
    out = result.stdout
    assert "ended: failed, exit 1 (crash) at step" in out
    assert f"reason: {reason}" in out
    assert "no monitor decision logged; grpo-monitor would resubmit after a backoff" in out
    assert "retry crash 1/3" in out
    flag = next(line for line in out.splitlines() if line.strip().startswith("crashed"))
    assert "failed (crash): RuntimeError: fault injection: crash" in flag, out
    assert "monitor would resubmit" in out
