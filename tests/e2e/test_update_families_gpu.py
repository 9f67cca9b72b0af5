"""The update's GPU fast paths on every supported model family (docs/models.md), at the
reduced sizes of tests/fixtures/families, in bf16 as the trainer runs them on a GPU: the
packed forward on PyTorch's varlen flash attention (each layer's sliding window passed to
the kernel, no per-row fallback) and the compiled decoder layers (``dist.compile``).

bf16 rounding makes every path differ from every other, so each is judged against the
exact answer, the plain HF forward in fp32 (padded rows, full logits): the packed varlen
update, and the compiled one, must be as close to it as the padded bf16 update of HF's own
sdpa path is (a dropped window or query scale misses by 0.5 and more, tests/unit/train/
algo/test_update_families.py). The fp32 equality of the packed and fused update is proven
on the CPU there; only what runs on CUDA alone is tested here. Skipped where there is no
GPU."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from grpo_hpc.train.algo import packing
from grpo_hpc.train.rollout.types import RolloutBatch
from grpo_hpc.train.setup.models import compile_layers, load_model_and_tokenizer
from tests.unit.train.algo.test_update_families import (
    FAMILIES,
    _batch,
    _family_dir,
    _packed_logp,
    _plain_logp,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
CUDA = torch.device("cuda")


def _on_gpu(batch: RolloutBatch) -> RolloutBatch:
    return dataclasses.replace(
        batch,
        input_ids=batch.input_ids.to(CUDA),
        attention_mask=batch.attention_mask.to(CUDA),
        completion_mask=batch.completion_mask.to(CUDA),
    )


def _logp_and_grads(
    model: torch.nn.Module, batch: RolloutBatch, packed: bool, bf16: bool
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token log-probs [R, C] (fp32, zero off the completions) and the gradients of a
    signed per-token sum of them, by the update's packed path or HF's padded forward."""
    mask = batch.completion_mask.bool()
    g = torch.Generator().manual_seed(5)
    weights = torch.randn(mask.shape, generator=g).to(CUDA) * mask
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        logp = _packed_logp(model, batch) if packed else _plain_logp(model, batch)
    logp = logp.to(CUDA) * mask
    (weights * logp).sum().backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return logp.detach(), grads


def _error(
    got: tuple[torch.Tensor, dict[str, torch.Tensor]],
    exact: tuple[torch.Tensor, dict[str, torch.Tensor]],
    tokens: int,
) -> tuple[float, dict[str, float]]:
    """The mean log-prob error over the ``tokens`` completion tokens, and each gradient's
    relative error (norm of the difference over the exact gradient's norm). A mean, not a
    maximum: in bf16 the mixture of experts routes a few tokens to other experts than fp32
    does (0.63 at the worst token on an H100, on every path alike), and where those land
    differs from path to path."""
    logp = float((got[0] - exact[0]).abs().sum()) / tokens
    grads = {
        n: float((got[1][n] - g).norm() / g.norm().clamp_min(1e-12)) for n, g in exact[1].items()
    }
    return logp, grads


@pytest.fixture(scope="module", params=FAMILIES)
def family(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    return request.param, _family_dir(tmp_path_factory.mktemp("families"), request.param)


def _as_close(
    errors: tuple[float, dict[str, float]], padded: tuple[float, dict[str, float]]
) -> None:
    """``errors`` no worse than the reference bf16 path's ``padded``, up to twice it plus a
    little (two roundings of the same math land apart by about one rounding step; a window
    off by one key is caught: :func:`test_a_window_off_by_one_is_caught`)."""
    assert errors[0] <= 2 * padded[0] + 0.005, (errors[0], padded[0])
    for name, e in errors[1].items():
        assert e <= 2 * padded[1][name] + 0.02, (name, e, padded[1][name])


def test_packed_varlen_update_is_as_exact_as_the_padded_one(
    family: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    name, path = family
    fallbacks: list[int | None] = []
    per_row = packing._per_row

    def counted(*args: object) -> torch.Tensor:
        fallbacks.append(args[5] if len(args) > 5 else None)
        return per_row(*args)

    monkeypatch.setattr(packing, "_per_row", counted)
    plain, _ = load_model_and_tokenizer(path, "sdpa", CUDA)
    packed = copy.deepcopy(plain)
    packing.use_packed_attention(packed)
    plain.train()
    packed.train()
    batch = _on_gpu(_batch(plain.config.vocab_size))
    exact = _logp_and_grads(plain, batch, packed=False, bf16=False)
    tokens = int(batch.completion_mask.sum())
    padded = _error(_logp_and_grads(plain, batch, packed=False, bf16=True), exact, tokens)
    got = _error(_logp_and_grads(packed, batch, packed=True, bf16=True), exact, tokens)
    # Every packed attention call, the windowed ones included, ran on the varlen kernel.
    assert not fallbacks, f"{name}: {len(fallbacks)} calls fell back to per-row SDPA"
    _as_close(got, padded)


def test_compiled_layers_are_as_exact_as_eager(family: tuple[str, Path]) -> None:
    """dist.compile as the trainer sets it up on a GPU: every decoder layer compiled, the
    update packed, bf16 autocast."""
    name, path = family
    plain, _ = load_model_and_tokenizer(path, "sdpa", CUDA)
    eager = copy.deepcopy(plain)
    packing.use_packed_attention(eager)
    compiled_model = copy.deepcopy(eager)
    assert compile_layers(compiled_model) == plain.config.num_hidden_layers
    for m in (plain, eager, compiled_model):
        m.train()
    batch = _on_gpu(_batch(plain.config.vocab_size))
    exact = _logp_and_grads(plain, batch, packed=False, bf16=False)
    tokens = int(batch.completion_mask.sum())
    eager_err = _error(_logp_and_grads(eager, batch, packed=True, bf16=True), exact, tokens)
    counters.clear()
    compiled = _logp_and_grads(compiled_model, batch, packed=True, bf16=True)
    compiled_err = _error(compiled, exact, tokens)
    assert counters["stats"]["unique_graphs"] > 0, name  # compiled code is what ran
    _as_close(compiled_err, eager_err)


def test_a_window_off_by_one_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bf16 comparison can fail: the kernel handed one key more than the window
    (``window_size=(W, 0)``, the reading of its docstring's "(W, 0) for a window of size
    W" that transformers' masks disagree with) is not as exact as the padded path."""
    import inspect

    import torch.nn.attention.varlen as varlen_mod

    kernel = varlen_mod.varlen_attn

    def one_more(*args: object, window_size: tuple[int, int] = (-1, -1), **kw: object):  # noqa: ANN202
        if window_size != (-1, 0):
            window_size = (window_size[0] + 1, 0)
        return kernel(*args, window_size=window_size, **kw)

    one_more.__signature__ = inspect.signature(kernel)  # type: ignore[attr-defined]
    monkeypatch.setattr(varlen_mod, "varlen_attn", one_more)
    packing.varlen_kernel.cache_clear()
    try:
        plain, _ = load_model_and_tokenizer(_family_dir(tmp_path, "mistral"), "sdpa", CUDA)
        packed = copy.deepcopy(plain)
        packing.use_packed_attention(packed)
        batch = _on_gpu(_batch(plain.config.vocab_size))
        exact = _logp_and_grads(plain, batch, packed=False, bf16=False)
        tokens = int(batch.completion_mask.sum())
        padded = _error(_logp_and_grads(plain, batch, packed=False, bf16=True), exact, tokens)
        wrong = _error(_logp_and_grads(packed, batch, packed=True, bf16=True), exact, tokens)
    finally:
        packing.varlen_kernel.cache_clear()
    with pytest.raises(AssertionError):
        _as_close(wrong, padded)
