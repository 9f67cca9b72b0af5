"""GPU paths (skipped where there is no CUDA; GPU figures live in bench/results/)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_hpc.progress import TrainState, read_progress

from .helpers import make_run, train

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_tiny_trains_on_one_gpu(tmp_path: Path, precision: str) -> None:
    paths = make_run(tmp_path, precision)
    text = paths.config.read_text().replace("precision: fp32", f"precision: {precision}")
    paths.config.write_text(text)
    result = train(paths)
    assert result.returncode == 0, result.stderr[-3000:]
    rec = read_progress(paths.progress)
    assert rec.state == TrainState.FINISHED and rec.step == rec.max_steps


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_tiny_trains_on_two_gpus(tmp_path: Path, strategy: str) -> None:
    paths = make_run(tmp_path, strategy, f"dist.strategy={strategy}", nproc=2)
    text = paths.config.read_text().replace("precision: fp32", "precision: bf16")
    paths.config.write_text(text)
    result = train(paths, nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_progress(paths.progress).state == TrainState.FINISHED
