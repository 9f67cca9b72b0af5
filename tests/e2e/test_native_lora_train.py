"""A LoRA policy trained with the native engine (adapters folded into the packed weights at
every rollout): the engine's log-probs agree with the training forward at every step, on
one process and under FSDP2 on two (CPU, fp32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_hpc.core.progress import TrainState, read_progress
from tests.e2e.helpers import make_run, train

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("strategy", "nproc"), [("ddp", 1), ("fsdp", 2)])
def test_lora_trains_with_the_native_engine(tmp_path: Path, strategy: str, nproc: int) -> None:
    paths = make_run(
        tmp_path,
        f"lora-{strategy}",
        "model.lora_rank=4",
        "model.lora_target_modules=[q_proj,v_proj,gate_proj,down_proj]",
        "rollout.engine=native",
        f"dist.strategy={strategy}",
        nproc=nproc,
    )
    result = train(paths, nproc=nproc)
    assert result.returncode == 0, result.stderr[-3000:]
    rec = read_progress(paths.progress)
    assert rec.state is TrainState.FINISHED and rec.step == 4
    steps = [m for m in map(json.loads, paths.metrics.read_text().splitlines()) if "loss" in m]
    assert any(m["grad_norm"] > 0 for m in steps)  # the adapters do change between rollouts
    # The engine's log-probs (folded weights) match the peft forward after every update.
    assert all(m["rollout/logp_diff"] < 1e-4 for m in steps), [
        m["rollout/logp_diff"] for m in steps
    ]


def test_lora_trains_under_fsdp_with_hf_generate(tmp_path: Path) -> None:
    # PeftModel.generate enters the HF model's generate, not the PeftModel's forward: with
    # FSDP2's root on the PeftModel the embedding stayed sharded and generation crashed
    # ("mixed torch.Tensor and DTensor").
    paths = make_run(
        tmp_path, "lora-fsdp-hf", "model.lora_rank=4", "rollout.engine=hf",
        "dist.strategy=fsdp", nproc=2,
    )  # fmt: skip
    result = train(paths, nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    rec = read_progress(paths.progress)
    assert rec.state is TrainState.FINISHED and rec.step == 4
    assert paths.latest_checkpoint() == 4
    steps = [m for m in map(json.loads, paths.metrics.read_text().splitlines()) if "loss" in m]
    assert any(m["grad_norm"] > 0 for m in steps)
