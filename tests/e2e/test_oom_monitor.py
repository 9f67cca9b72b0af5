"""Out of GPU memory, end to end: a real trainer (local executor) hits an injected
torch.cuda.OutOfMemoryError, records exit 6 with the estimator's advice, and the real
grpo-monitor stops the run with one line instead of resubmitting it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState, read_progress
from tests.conftest import run_cli

pytestmark = pytest.mark.slow

# Rows-only micro-batches of a wider tiny model: the estimator says they need ~0.9 GiB, and
# a 2048-token budget ~0.7 GiB; the injected error claims a 1 GiB GPU (85 % headroom).
OVERRIDES = [
    "model.tiny_hidden_size=256",
    "algo.micro_batch_tokens=0",
    "algo.micro_batch_size=64",
    "rollout.prompts_per_step=4",
    "faults.enabled=true",
    "faults.oom_at_step=1",
    "faults.oom_gpu_gb=1.0",
]


def test_oom_stops_the_run_with_what_would_fit(logs_dir: Path) -> None:
    sub = run_cli(
        "grpo_hpc.cli.submit:main",
        "--profile", "local", "--config", "tiny", "--name", "oom",
        *OVERRIDES,
    )  # fmt: skip
    assert sub.returncode == ExitCode.OUT_OF_MEMORY, sub.stdout + sub.stderr
    assert "exit code 6 (out_of_memory)" in sub.stdout
    paths = RunPaths(logs_dir.resolve() / "oom")
    rec = read_progress(paths.progress)
    assert rec.state is TrainState.FAILED and rec.exit_code == 6 and rec.step == 1
    assert rec.reason.startswith("CUDA out of memory while training at step 1")
    assert "would fit: algo.micro_batch_tokens=2048" in rec.reason
    assert "exit code:  6 (OUT_OF_MEMORY)" in paths.job_summary.read_text()

    mon = run_cli("grpo_hpc.cli.monitor:main", "oom", "--interval", "1", "--logs", str(logs_dir))
    assert mon.returncode == 1, mon.stdout + mon.stderr  # the loop ends: a run was stopped
    (line,) = [x for x in mon.stdout.splitlines() if "STOP out_of_memory" in x]
    assert "CUDA out of memory while training at step 1" in line
    assert "would fit: algo.micro_batch_tokens=2048" in line
    assert "never resubmitted unchanged" in line
    again = run_cli("grpo_hpc.cli.monitor:main", "oom", "--once", "--logs", str(logs_dir))
    assert again.returncode == 0 and "STOP" not in again.stdout  # sticky: nothing more done
    assert len(paths.jobs.read_text().splitlines()) == 1  # never resubmitted
    (decision,) = [e for e in map(json.loads, paths.events.read_text().splitlines())
                   if e.get("phase") == "decision"]  # fmt: skip
    assert decision["class"] == "out_of_memory"
