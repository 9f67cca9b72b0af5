"""dist.cpu_offload (FSDP2 CPUOffloadPolicy) trains and checkpoints: two processes
on CPU with gloo (on CPU the offload is a no-op move; the GPU path is the same code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_hpc.core.progress import TrainState, read_progress
from tests.e2e.helpers import make_run, train

pytestmark = pytest.mark.slow


def test_fsdp_with_cpu_offload_trains_and_checkpoints(tmp_path: Path) -> None:
    paths = make_run(tmp_path, "offload", "dist.strategy=fsdp", "dist.cpu_offload=true", nproc=2)
    result = train(paths, nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    rec = read_progress(paths.progress)
    assert rec.state is TrainState.FINISHED and rec.step == 4 and paths.latest_checkpoint() == 4
    steps = [json.loads(x) for x in paths.metrics.read_text().splitlines()]
    assert any(m.get("grad_norm", 0) > 0 for m in steps)
