"""dist.compile: each decoder layer compiled (dynamic shapes) gives the eager model's loss
and fp32 gradients, with gradient checkpointing recomputing through the compiled layer,
on a real tiny Qwen2 loaded through from_pretrained (CPU inductor)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from grpo_hpc.config.schema import AlgoConfig
from grpo_hpc.train.setup.models import (
    compile_layers,
    enable_checkpointing,
    load_model_and_tokenizer,
)
from tests.unit.train.algo.test_packing import _batch, _grads, _model_dir

pytestmark = pytest.mark.slow


def test_compiled_layers_give_the_eager_gradients(tmp_path: Path) -> None:
    eager, _ = load_model_and_tokenizer(_model_dir(tmp_path, "qwen2"), "sdpa", torch.device("cpu"))
    enable_checkpointing(eager, 1)
    eager.train()
    compiled = copy.deepcopy(eager)
    assert compile_layers(compiled) == eager.config.num_hidden_layers
    batch = _batch(eager.config.vocab_size)
    # Micro-batches of 3 rows and a last one of 1: two widths, one compilation.
    algo = AlgoConfig(micro_batch_size=3, packing=False)
    want_stats, want = _grads(eager, batch, algo)
    counters.clear()
    got_stats, got = _grads(compiled, batch, algo)
    assert got_stats["loss"] == pytest.approx(want_stats["loss"], rel=1e-5)
    for name, g in want.items():
        torch.testing.assert_close(got[name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert all(layer._compiled_call_impl is not None for layer in compiled.model.layers)
    assert counters["stats"]["unique_graphs"] > 0  # compiled code is what ran
