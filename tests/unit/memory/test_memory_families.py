"""The supported model families in the memory estimator: for every bench/shapes config (and
every reduced family config of tests/fixtures/families), the parameter count from
config.json equals what transformers builds from it (on the meta device: no memory, no
weights), and each full-size shape has the published size of its model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grpo_hpc.memory import estimate as memory

ROOT = Path(__file__).resolve().parents[3]
SHAPES = ROOT / "bench" / "shapes"
FAMILIES = ROOT / "tests" / "fixtures" / "families"
CONFIGS = sorted(p.parent for p in [*SHAPES.glob("*/config.json"), *FAMILIES.glob("*/config.json")])

PUBLISHED: dict[str, tuple[str, float, int, str]] = {
    # name: (what the publisher counts, figure in billions, its decimals, where it is said)
    "qwen3-0.6b": ("non-embedding", 0.44, 2, "model card: 0.44B non-embedding"),
    "qwen3-1.7b": ("unique", 1.720574976, 9, "total_parameters of its safetensors index"),
    "qwen3-4b": ("unique", 4.0, 1, "model card: 4.0B"),
    "qwen3-8b": ("non-embedding", 6.95, 2, "model card: 6.95B non-embedding"),
    "qwen3-30b-a3b": ("unique", 30.5, 1, "model card: 30.5B in total, 3.3B activated"),
    "llama-3.2-1b": ("unique", 1.23, 2, "model card: 1B (1.23B)"),
    "llama-3.2-3b": ("unique", 3.21, 2, "model card: 3B (3.21B)"),
    "llama-3.1-8b": ("unique", 8, 0, "model card: 8B"),
    "gemma-3-1b": ("non-embedding", 0.698, 3, "Gemma 3 report, table 1 (recalled)"),
    "gemma-3-4b": ("non-embedding", 3.209, 3, "Gemma 3 report, table 1 (recalled)"),
    "phi-4-mini": ("unique", 3.8, 1, "model card: 3.8B"),
    "olmo-2-1b": ("unique", 1, 0, "its name, OLMo 2 1B (no exact count found)"),
    "smollm3-3b": ("unique", 3, 0, "model card: a 3B parameter language model"),
    "ministral-8b": ("unique", 8.019808256, 9, "model card: 8,019,808,256"),
}
"""Each shape's published size as its publisher states it: ``unique`` counts a tied head once
(what ``sum(p.numel())`` gives); ``non-embedding`` leaves out the embedding and an untied
head. A figure given to N decimals holds the count within one unit of its last decimal
(Meta's 1.23B is a 1,235,814,400 cut short, not rounded). Sources: bench/shapes/README.md."""


def _config(d: Path) -> dict:
    return json.loads((d / "config.json").read_text())


def _hf_count(d: Path) -> int:
    """Parameters of the model transformers builds from ``d`` (tied weights counted once)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(d))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("d", CONFIGS, ids=lambda d: f"{d.parent.name}/{d.name}")
def test_parameter_count_equals_the_hf_model(d: Path) -> None:
    assert memory.ModelShape.from_config(_config(d)).params == _hf_count(d)


def test_every_new_shape_has_a_published_size() -> None:
    """A shape added to bench/shapes joins PUBLISHED (the Qwen2.5 shapes predate it; tiny is
    no published model)."""
    names = {d.name for d in CONFIGS if d.parent == SHAPES}
    older = {n for n in names if n.startswith("qwen2.5-")} | {"tiny"}
    assert names - older == set(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shape_has_the_published_size(name: str) -> None:
    kind, figure, decimals, source = PUBLISHED[name]
    shape = memory.ModelShape.from_config(_config(SHAPES / name))
    count = shape.params
    if kind == "non-embedding":
        count -= shape.embed_params - shape.hidden  # embedding, untied head; not the final norm
    assert abs(count / 1e9 - figure) < 10**-decimals, f"{name}: {count:,} against {source}"


def test_mixture_of_experts_trains_every_expert() -> None:
    """Qwen3-30B-A3B: weights, gradients and both AdamW moments for all 128 experts of each
    layer (and its router), though a token uses 8; activations for the 8 it uses."""
    shape = memory.ModelShape.from_config(_config(SHAPES / "qwen3-30b-a3b"))
    assert (shape.experts, shape.experts_per_token, shape.sparse_layers) == (128, 8, 48)
    e = memory.estimate(shape, memory.Settings(ranks=1))
    p = shape.params
    assert (e.weights, e.grads, e.optimizer) == (4 * p, 4 * p, 8 * p)
    assert shape.params > 30e9 and shape.active_intermediate == 8 * 768


def test_sliding_window_layers_keep_a_full_cache() -> None:
    """The native engine's cache gives every layer rows x (prompt + max_new) slots, a
    sliding-window layer too (train/rollout/native/forward.py, KVCache): Gemma 3 1B's 22
    sliding layers of a 512-token window are counted at full length."""
    cfg = _config(SHAPES / "gemma-3-1b")
    shape = memory.ModelShape.from_config(cfg)
    s = memory.Settings(rows=64, prompt_tokens=320, max_new_tokens=512)
    slots = 320 + 512 + (-(320 + 512) % memory.SPAN_BUCKET)
    assert slots > cfg["sliding_window"]
    per_slot = 2 * shape.kv_heads * shape.head_dim * s.compute_bytes
    assert memory.estimate(shape, s).kv_cache == 64 * slots * shape.layers * per_slot
