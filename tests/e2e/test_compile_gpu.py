"""Compiled layers and attention on a GPU, as the trainer sets them up: one compilation of
each decoder layer serves micro-batches on both sides of Inductor's 5 Mi-element fusion
threshold (no recompilation at the first wide one), and SDPA stays off cuDNN's attention,
whose per-shape plans stalled the native engine's prefill.

Written 2026-11-27 after the real 2-GPU runs that found both (bench/results/archive/
slurm_gsm8k_attention_plans_h100x2_2026-11-27.md); skipped where there is no GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from grpo_hpc.train.setup.models import compile_layers, load_model_and_tokenizer
from tests.unit.train.algo.test_packing import _model_dir

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_loading_a_model_keeps_sdpa_off_cudnn(tmp_path: Path) -> None:
    torch.backends.cuda.enable_cudnn_sdp(True)
    load_model_and_tokenizer(_model_dir(tmp_path, "qwen2"), "sdpa", torch.device("cuda"))
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.mem_efficient_sdp_enabled()


def _train_once(model: torch.nn.Module, rows: int, width: int) -> None:
    ids = torch.randint(10, model.config.vocab_size, (rows, width), device="cuda")
    model(input_ids=ids, use_cache=False).logits.float().mean().backward()
    model.zero_grad(set_to_none=True)


def test_one_compilation_serves_narrow_and_wide_micro_batches(tmp_path: Path) -> None:
    model, _ = load_model_and_tokenizer(_model_dir(tmp_path, "qwen2"), "sdpa", torch.device("cuda"))
    model.train()
    compile_layers(model)
    counters.clear()
    _train_once(model, 2, 256)  # 512 rows x 64 hidden: under 5 Mi elements
    graphs = counters["stats"]["unique_graphs"]
    assert graphs > 0
    _train_once(model, 40, 2100)  # 84,000 rows x 64: over it
    _train_once(model, 3, 200)
    assert counters["stats"]["unique_graphs"] == graphs, "a wider micro-batch recompiled"
