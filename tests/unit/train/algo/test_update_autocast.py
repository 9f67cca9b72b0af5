"""The update's autocast keeps no cast cache (optimization.autocast_factory): under gradient
checkpointing no low-precision copy of a weight outlives its layer's forward, and the
gradients are those of autocast with its cache, bit for bit. Real tiny Qwen2 model loaded
through from_pretrained, the real update (``update.accumulate``), bf16 autocast on the CPU
(the same autocast mechanism as on a GPU; the trainer autocasts on CUDA only)."""

from __future__ import annotations

import weakref
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grpo_hpc.config.schema import AlgoConfig
from grpo_hpc.train.algo.optimization import autocast_factory
from grpo_hpc.train.algo.update import accumulate, split
from grpo_hpc.train.distributed.dist import DistInfo
from grpo_hpc.train.setup.models import enable_checkpointing, load_model_and_tokenizer
from tests.unit.train.algo.test_packing import NEW, ROWS, _batch, _model_dir


class LiveCasts(TorchDispatchMode):
    """Weak references to every low-precision copy autocast makes of a parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.casts: list[weakref.ref] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        src = args[0] if args else None
        if func is torch.ops.aten._to_copy.default and isinstance(src, torch.nn.Parameter):
            if out.dtype == torch.bfloat16:
                self.casts.append(weakref.ref(out))
        return out

    def alive(self) -> int:
        return sum(r() is not None for r in self.casts)


def _update(cache: bool, tmp: Path, probe: LiveCasts | None = None) -> tuple[dict, dict, list]:
    """One update of two micro-batches under checkpointing; the live casts when the
    backward of the first micro-batch begins (the forward's peak)."""
    model, _ = load_model_and_tokenizer(_model_dir(tmp, "qwen2"), "sdpa", torch.device("cpu"))
    enable_checkpointing(model, 1)
    model.train()
    seen: list[int] = []

    def on_backward(grad: torch.Tensor) -> None:
        if probe is not None:
            seen.append(probe.alive())

    def watch(module: torch.nn.Module, inputs: tuple, out: torch.Tensor) -> None:
        out.register_hook(on_backward)  # the first gradient of the backward

    model.model.norm.register_forward_hook(watch)
    algo = AlgoConfig(micro_batch_size=4, micro_batch_tokens=4096, packing=False)
    adv = torch.linspace(-1.5, 2.0, len(ROWS))
    mbs = split(_batch(model.config.vocab_size), list(range(len(ROWS))), adv, 4, 4096, False)
    assert len(mbs) == 2
    ac = autocast_factory("cpu", torch.bfloat16, cache=cache)
    stats = accumulate(model, mbs, algo, DistInfo(), NEW, None, ac)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return stats, grads, seen


def test_update_autocast_holds_no_weight_copy_through_the_backward(tmp_path: Path) -> None:
    with LiveCasts() as cached:
        _, _, seen_cached = _update(True, tmp_path, cached)
    with LiveCasts() as uncached:
        _, _, seen = _update(False, tmp_path, uncached)
    model, _ = load_model_and_tokenizer(tmp_path / "qwen2", "sdpa", torch.device("cpu"))
    per_layer = sum(p.dim() == 2 for p in model.model.layers[0].parameters())
    layers = len(model.model.layers)
    # With the cache, every layer's cast weights are alive when the backward starts ...
    assert len(seen_cached) == 2 and min(seen_cached) >= per_layer * layers
    # ... without it, at most the head's and one layer's (the recompute casts again).
    assert len(seen) == 2 and max(seen) <= per_layer + 1, (seen, per_layer)
    assert len(uncached.casts) > len(cached.casts)  # the recompute did cast again


@pytest.mark.parametrize("first", [True, False])
def test_update_gradients_equal_with_and_without_the_cast_cache(
    tmp_path: Path, first: bool
) -> None:
    stats_a, grads_a, _ = _update(first, tmp_path)
    stats_b, grads_b, _ = _update(not first, tmp_path)
    assert stats_a == stats_b
    assert grads_a.keys() == grads_b.keys()
    for name, g in grads_a.items():
        assert torch.equal(g, grads_b[name]), name
    assert any(g.abs().sum() > 0 for g in grads_a.values())


def test_autocast_factory_without_a_dtype_is_no_autocast() -> None:
    with autocast_factory("cpu", None, cache=False)():
        assert not torch.is_autocast_enabled("cpu")
    with autocast_factory("cpu", torch.bfloat16, cache=False)():
        assert torch.is_autocast_enabled("cpu") and not torch.is_autocast_cache_enabled()
    with autocast_factory("cpu", torch.bfloat16)():
        assert torch.is_autocast_cache_enabled()
