"""grpo-submit --profile local as a user runs it: a real tiny run to the end, through
submitit's local executor and torchrun (moved out of tests/unit: it trains)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import run_cli


def submit(*args: str, env: dict | None = None):
    return run_cli("grpo_hpc.cli.submit:main", *args, env=env)


@pytest.mark.slow
def test_local_profile_runs_with_shell_metacharacters_as_data(tmp_path: Path, logs_dir: Path):
    marker = tmp_path / "pwned"
    result = submit(
        "--profile",
        "local",
        "--config",
        "tiny",
        "--name",
        "meta",
        "--wait",
        f"wandb.project=$(touch {marker}); `touch {marker}`",
        "training.max_steps=2",
        # rich treats the pipe as a terminal: --wait draws its live bar
        env={"OMP_NUM_THREADS": "1", "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert not marker.exists()
    final_frame = result.stdout.rsplit("\r", 1)[-1]
    assert "finished" in final_frame and "2/2" in final_frame and "tok/s" in final_frame
    run = logs_dir / "meta"
    for name in (
        "config.yaml",
        "profile.yaml",
        "jobs.jsonl",
        "progress.json",
        "training_output.log",
        "job_summary.txt",
    ):
        assert (run / name).is_file(), name
    assert f"$(touch {marker})" in (run / "config.yaml").read_text()
    assert "state:      finished" in (run / "job_summary.txt").read_text()
    assert os.listdir(run / "submitit")
