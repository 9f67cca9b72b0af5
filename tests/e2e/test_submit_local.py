"""grpo-submit --profile local as a user runs it: a real tiny run to the end, through
submitit's local executor and torchrun (moved out of tests/unit: it trains)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import run_cli

from ..slowdown import guard


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


@pytest.mark.slow
def test_a_rank_killed_by_a_signal_is_named_in_the_record(tmp_path: Path, logs_dir: Path):
    """Two ranks under the real launcher (submitit's local executor, torchrun); rank 1 is
    SIGKILLed mid-run, as the kernel's OOM killer would: it records nothing itself, and
    the record must still say who died, from torchrun's report (not just "exit 1")."""
    import signal
    import subprocess
    import sys
    import time

    from grpo_hpc.core.errors import ExitCode
    from grpo_hpc.core.progress import TrainState, read_progress

    profile = tmp_path / "two.yaml"
    profile.write_text(
        (Path(__file__).resolve().parents[2] / "templates/local.yaml")
        .read_text()
        .replace("nproc_per_node: 1", "nproc_per_node: 2")
    )
    # the local executor runs the job before grpo-submit returns: submit in the background
    code = "import sys; from grpo_hpc.cli.submit import main; sys.exit(main(sys.argv[1:]))"
    args = ["--profile", str(profile), "--config", "tiny", "--name", "killed",
            "training.max_steps=60", "faults.enabled=true", "faults.step_sleep=0.5"]  # fmt: skip
    sub = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    run = logs_dir / "killed"
    deadline = time.monotonic() + guard(180)
    victim = None
    while victim is None and time.monotonic() < deadline:
        rec = read_progress(run / "progress.json")
        pulses = list(run.glob("alive/*/rank1"))
        if rec is not None and rec.step >= 2 and pulses:
            victim = int(pulses[0].read_text().split()[0])
        time.sleep(0.2)
    assert victim is not None, "rank 1 never trained two steps"
    os.kill(victim, signal.SIGKILL)
    out, _ = sub.communicate(timeout=guard(180))
    assert sub.returncode == ExitCode.CRASH, out[-3000:]
    rec = read_progress(run / "progress.json")
    assert rec.state is TrainState.FAILED and rec.exit_code == 1, rec
    assert rec.reason.startswith(f"rank 1 (pid {victim} on "), rec.reason
    assert "was killed by SIGKILL at step" in rec.reason
    assert "reason:     rank 1 (pid" in (run / "job_summary.txt").read_text()
    assert f"rank 1 (pid {victim} on " in out  # grpo-submit's own last lines say it too
