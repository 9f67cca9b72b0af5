"""GPU paths (skipped where there is no CUDA; GPU figures live in bench/results/)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from grpo_hpc.core.progress import TrainState, read_progress

from ..slowdown import guard
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


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize(
    "memory",
    [
        ["dist.cpu_offload=true"],  # inputs and engine on the GPU, shards in host memory
        ["rollout.release_engine_memory=true", "model.lora_rank=4"],  # released, under peft
    ],
)
def test_fsdp_memory_means_train_on_two_gpus(tmp_path: Path, memory: list[str]) -> None:
    """The means the 7B plans rest on, on real GPUs with the native engine: FSDP2 with CPU
    offload (its first ladder row failed on a device mismatch) and the engine released
    before each update (its CUDA graphs recaptured every rollout)."""
    paths = make_run(
        tmp_path, "means", "dist.strategy=fsdp", "rollout.engine=native", *memory, nproc=2
    )
    text = paths.config.read_text().replace("precision: fp32", "precision: bf16")
    paths.config.write_text(text)
    result = train(paths, nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_progress(paths.progress).state == TrainState.FINISHED
    assert paths.latest_checkpoint() == read_progress(paths.progress).max_steps


def test_sharded_adamw_matches_unsharded() -> None:
    """The trainer's AdamW under FSDP2 (fused, in place) over sharded DTensors: the same
    weights as plain AdamW on the whole model, on as many GPUs as there are (1 is enough)."""
    nproc = min(2, torch.cuda.device_count())
    worker = Path(__file__).with_name("fsdp_adamw_worker.py")
    cmd = ["torchrun", "--standalone", f"--nproc-per-node={nproc}", str(worker)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=guard(300))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "fused=True" in result.stdout
