"""The update's fast paths on every model family of tests/fixtures/families: the
packed forward (algo.packing: rows as one sequence, attention kept within a row and within
each layer's sliding window) with the fused log-prob head gives the per-token log-probs and
parameter gradients of the plain HF forward (padded rows, full logits, log_softmax) in
fp32, on a reduced random model of each family saved and loaded as the trainer loads it.

The comparisons are made to be able to fail: weights are drawn at a scale where attention
and the next-token distributions are far from uniform (HF's default init, std 0.02, makes
both nearly flat, and a window or a query scale then changes almost nothing), rows are
longer than the window (16), and for the families with windows (and Gemma's query scale)
the same packed forward with that keyword dropped is shown to miss the reference by far
more than the tolerance.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_hpc.core.errors import ConfigError
from grpo_hpc.train.algo import packing
from grpo_hpc.train.algo.logp_head import fused_logp_head, head_problem
from grpo_hpc.train.algo.update import completion_logp, split
from grpo_hpc.train.rollout.types import RolloutBatch
from grpo_hpc.train.setup.models import char_tokenizer, load_model_and_tokenizer
from tests.unit.train.algo.test_packing import padded_batch

FIXTURES = Path(__file__).resolve().parents[4] / "tests" / "fixtures" / "families"
FAMILIES = sorted(p.parent.name for p in FIXTURES.glob("*/config.json"))
WINDOW = 16
WINDOWED = {"gemma3", "mistral", "ministral"}
"""Families whose fixture has sliding-window layers (all: mistral; interleaved: the others)."""
GEMMA_QUERY_SCALAR = 20
"""Gemma 3 scales queries by query_pre_attn_scalar**-0.5; the fixture's 32 equals head_dim
(scaling = the default head_dim**-0.5), so the test sets a value that differs (Gemma 3 27B:
168 for head_dim 128), or a dropped ``scaling`` would go unseen."""
PROMPT, NEW = 12, 28
# (real prompt tokens, completion tokens): rows of 40, 4, 29, 29, 12 and 19 tokens, most
# longer than the window; an empty completion and a one-token prompt too.
ROWS = [(12, 28), (3, 1), (9, 20), (1, 28), (12, 0), (5, 14)]
ATOL = 1e-5
"""fp32 tolerance of a log-prob (and, relative to each parameter's largest, a gradient)."""


def test_every_family_of_the_fixtures_is_here() -> None:
    assert FAMILIES == sorted(
        [
            "gemma3",
            "llama3",
            "ministral",
            "mistral",
            "olmo2",
            "phi3",
            "qwen3",
            "qwen3_moe",
            "smollm3",
        ]  # fmt: skip
    )


def _spread(model: torch.nn.Module, seed: int) -> None:
    """Weights at unit scale: each matrix ~ N(0, 1 / fan_in) (so every projection keeps its
    input's scale: attention scores and logits of order 1), norm weights 1 + N(0, 0.1)
    (Gemma's, stored as w in (1 + w), about 1 too), other vectors N(0, 0.1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() >= 2:  # [..., out, in]: experts' stacked matrices included
                p.copy_(noise / math.sqrt(p.shape[-1]))
            elif "norm" in name:
                p.add_(0.1 * noise)
            else:
                p.copy_(0.1 * noise)


def _family_dir(tmp: Path, family: str) -> Path:
    """The family's fixture as a saved HF model directory (random weights, char tokenizer),
    which the tests load through the trainer's own loader."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(FIXTURES / family)
    if family == "gemma3":
        cfg.query_pre_attn_scalar = GEMMA_QUERY_SCALAR
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    _spread(model, seed=1)
    out = tmp / family
    model.save_pretrained(out)
    char_tokenizer(cfg.vocab_size).save_pretrained(out)
    return out


def _batch(vocab: int) -> RolloutBatch:
    return padded_batch(vocab, ROWS, PROMPT, NEW)


def _plain_logp(model: torch.nn.Module, batch: RolloutBatch) -> torch.Tensor:
    """[R, NEW] log-probs of the completion tokens from HF's own forward, written here
    without the update's code: each row's real tokens from position 0 (right padding and
    an attention mask), the full logits, log_softmax in fp32."""
    width, dev = max(p + c for p, c in ROWS), batch.input_ids.device
    ids = torch.zeros(len(ROWS), width, dtype=torch.long, device=dev)
    mask = torch.zeros_like(ids)
    for r, (p, c) in enumerate(ROWS):
        ids[r, : p + c] = batch.input_ids[r, PROMPT - p : PROMPT + c]
        mask[r, : p + c] = 1
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    logp = torch.log_softmax(logits.float(), -1)
    out = torch.zeros(len(ROWS), NEW, device=dev)
    for r, (p, c) in enumerate(ROWS):
        # completion token t (at p + t) is predicted at position p + t - 1
        picked = logp[r, p - 1 : p + c - 1].gather(-1, ids[r, p : p + c, None])[:, 0]
        out[r, :c] = picked
    return out


def _packed_logp(model: torch.nn.Module, batch: RolloutBatch) -> torch.Tensor:
    """[R, NEW] the update's own path: one packed micro-batch, the fused head."""
    (mb,) = split(batch, list(range(len(ROWS))), torch.zeros(len(ROWS)), 8, 0, packing=True)
    assert mb.lengths == tuple(ROWS)
    logp, _ = completion_logp(model, mb)
    return logp


def _grads(model: torch.nn.Module, logp: torch.Tensor, weights: torch.Tensor) -> dict:
    """Gradients of sum(weights * logp) over the completion tokens (a GRPO-like loss with
    signed per-token weights), by parameter name; the model's gradients cleared after."""
    (weights * logp).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def _attention_calls(model: torch.nn.Module, drop: str | None = None) -> list[Any]:
    """Record the ``sliding_window`` each attention call of ``model`` receives (a spy around
    the packed attention function); with ``drop``, also remove that keyword before the call
    (the bug the refusal guards against: a keyword silently ignored)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    seen: list[Any] = []

    def spy(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
        seen.append(kwargs.get("sliding_window"))
        if drop is not None:
            kwargs.pop(drop, None)
        return packing.packed_attention(*args, **kwargs)

    name = f"grpo_test_spy_{drop}"
    AttentionInterface.register(name, spy)
    AttentionMaskInterface.register(name, packing._mask)
    model.set_attn_implementation(name)
    return seen


@pytest.fixture(scope="module", params=FAMILIES)
def family_case(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, torch.nn.Module, torch.nn.Module]:
    """(family, plain sdpa model, packed model): the same weights loaded by the trainer's
    loader, in train mode."""
    family = request.param
    path = _family_dir(tmp_path_factory.mktemp("families"), family)
    plain, _ = load_model_and_tokenizer(path, "sdpa", torch.device("cpu"))
    packed = copy.deepcopy(plain)
    assert packing.use_packed_attention(packed) == packing.ATTN_NAME
    return family, plain.train(), packed.train()


def test_packed_fused_update_equals_plain_hf_forward(
    family_case: tuple[str, torch.nn.Module, torch.nn.Module],
) -> None:
    family, plain, packed = family_case
    assert head_problem(packed) is None
    batch = _batch(plain.config.vocab_size)
    mask = batch.completion_mask.bool()
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(5)) * mask

    ref = _plain_logp(plain, batch)
    ref_grads = _grads(plain, ref, weights)
    windows = _attention_calls(packed)
    got = _packed_logp(packed, batch)
    got_grads = _grads(packed, got, weights)

    # The values compared are far from trivial: spread log-probs, far from uniform.
    real = ref[mask]
    assert real.std() > 0.5 and (real + math.log(plain.config.vocab_size)).abs().mean() > 0.5
    torch.testing.assert_close(got * mask, ref, rtol=0, atol=ATOL)
    assert ref_grads.keys() == got_grads.keys() == {n for n, _ in plain.named_parameters()}
    for name, g in ref_grads.items():
        scale = float(g.abs().max())
        assert scale > 0, name  # every parameter is trained (each expert routed to, too)
        torch.testing.assert_close(got_grads[name], g, rtol=ATOL, atol=ATOL * scale, msg=name)
    # Each layer's window reached the packed attention as the family's config says.
    layers = plain.config.num_hidden_layers
    assert len(windows) == layers
    if family in WINDOWED:
        types = getattr(plain.config, "layer_types", None) or ["sliding_attention"] * layers
        assert windows == [WINDOW if t == "sliding_attention" else None for t in types]
    else:
        assert windows == [None] * layers


@pytest.mark.parametrize(
    ("family", "drop"),
    [
        ("gemma3", "sliding_window"),
        ("mistral", "sliding_window"),
        ("ministral", "sliding_window"),
        ("gemma3", "scaling"),
    ],  # fmt: skip
)
def test_a_dropped_window_or_query_scale_is_seen(tmp_path: Path, family: str, drop: str) -> None:
    """The equality above can fail: the packed forward with the window (or Gemma's query
    scale) silently dropped misses the plain forward by far more than its tolerance."""
    path = _family_dir(tmp_path, family)
    plain, _ = load_model_and_tokenizer(path, "sdpa", torch.device("cpu"))
    mutant = copy.deepcopy(plain)
    packing.use_packed_attention(mutant)  # registers the mask builder the spy reuses
    _attention_calls(mutant, drop=drop)
    batch = _batch(plain.config.vocab_size)
    with torch.no_grad():
        ref, wrong = _plain_logp(plain, batch), _packed_logp(mutant, batch)
    mask = batch.completion_mask.bool()
    miss = float((wrong - ref)[mask].abs().max())
    assert miss > 1000 * ATOL, miss


def test_windowed_rows_per_row_attention_is_transformers_sliding_mask() -> None:
    """The row-by-row fallback with a window equals SDPA under transformers' own sliding
    causal mask (its ``sliding_window_overlay`` on top of causal), row by row, GQA too."""
    from transformers.masking_utils import and_masks, causal_mask_function, sliding_window_overlay

    g = torch.Generator().manual_seed(0)
    bounds = [0, 23, 30, 47]
    q = torch.randn(47, 4, 8, generator=g) * 2
    k, v = torch.randn(47, 2, 8, generator=g) * 2, torch.randn(47, 2, 8, generator=g)
    got = packing._per_row(q, k, v, bounds, 0.3, window=5)
    allowed = and_masks(causal_mask_function, sliding_window_overlay(5))
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        n = b - a
        idx, zero = torch.arange(n), torch.tensor(0)
        mask = allowed(zero, zero, idx[:, None], idx[None, :])
        assert torch.equal(mask, packing.window_mask(n, 5, q.device))
        qi = q[a:b].transpose(0, 1)
        ki, vi = (x[a:b].transpose(0, 1).repeat_interleave(2, 0) for x in (k, v))
        want = torch.nn.functional.scaled_dot_product_attention(
            qi, ki, vi, attn_mask=mask, scale=0.3
        )
        torch.testing.assert_close(got[a:b], want.transpose(0, 1), rtol=1e-6, atol=1e-6)
    plain = packing._per_row(q, k, v, bounds, 0.3)
    assert (plain - got).abs().max() > 0.1  # the window changed the 23- and 17-token rows


def test_varlen_call_passes_the_window_as_flash_attention_expects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the CUDA path hands ``varlen_attn`` (tested here with a stand-in that records
    it; the kernel itself runs in tests/e2e/test_update_families_gpu.py): W keys including
    the query itself is flash attention's ``window_size=(W - 1, 0)``, no window causal
    ``(-1, 0)``, and a window no row fills is no window."""
    import torch.nn.attention.varlen as varlen_mod

    calls: list[dict[str, Any]] = []

    def fake(  # the installed signature's keywords, which varlen_kernel reads
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seq_q: torch.Tensor,
        cu_seq_k: torch.Tensor | None,
        max_q: int,
        max_k: int,
        *,
        scale: float | None = None,
        window_size: tuple[int, int] = (-1, -1),
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        calls.append({"window_size": window_size, "scale": scale})
        return q

    monkeypatch.setattr(varlen_mod, "varlen_attn", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    packing.varlen_kernel.cache_clear()
    try:
        call = packing.varlen_kernel()
        assert call is not None
        q = torch.zeros(10, 2, 8)
        cu = torch.tensor([0, 6, 10], dtype=torch.int32)
        call(q, q, q, cu, 6, None, 4)
        call(q, q, q, cu, 6, None, None)
        call(q, q, q, cu, 6, None, 6)
    finally:
        packing.varlen_kernel.cache_clear()
    assert [c["window_size"] for c in calls] == [(3, 0), (-1, 0), (-1, 0)]


def _call_packed(module: torch.nn.Module, dropout: float = 0.0, mask: Any = None, **kw: Any):  # noqa: ANN202
    q = torch.randn(1, 2, 6, 8)
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    return packing.packed_attention(
        module, q, q, q, mask, dropout, cu_seq_lens_q=cu, max_length_q=3, **kw
    )


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda m: {"dropout": 0.1}, "attention dropout 0.1"),
        (lambda m: {"softcap": 50.0}, "soft-capping 50.0"),
        (lambda m: {"s_aux": torch.zeros(2)}, "s_aux="),
        (lambda m: {"mask": torch.ones(1, 1, 6, 6, dtype=torch.bool)}, "an attention mask"),
        (lambda m: setattr(m, "is_causal", False) or {}, "bidirectional"),
        (lambda m: {"sliding_window": 0}, "sliding_window=0"),
    ],
)
def test_what_packed_attention_cannot_honour_is_refused(
    change: Callable[[torch.nn.Module], dict], named: str
) -> None:
    module = torch.nn.Module()
    kwargs = change(module)
    with pytest.raises(ConfigError, match="algo.packing=false") as err:
        _call_packed(module, **kwargs)
    assert named in str(err.value)
    # what a family passes that changes nothing is accepted
    inert = {"position_ids": None, "use_cache": False, "output_router_logits": False}
    out, _ = _call_packed(torch.nn.Module(), sliding_window=None, scaling=None, **inert)
    assert out.shape == (1, 6, 2, 8)


@pytest.mark.parametrize(
    ("field", "value"),
    [("final_logit_softcapping", 30.0), ("logit_scale", 0.0625), ("logits_scaling", 8.0)],
)
def test_fused_head_refuses_logits_transformed_after_the_head(
    tmp_path: Path, field: str, value: float
) -> None:
    """Gemma 2/3's final soft-capping (and Cohere's, Granite's logit scales) would be
    dropped by a head that computes h W^T: the fused head refuses before any forward, and
    the update scores such a model's own logits instead
    (tests/unit/train/algo/test_update_model_logits.py)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(FIXTURES / "gemma3")
    setattr(cfg, field, value)
    model = AutoModelForCausalLM.from_config(cfg)
    assert field in (head_problem(model) or "")
    batch = _batch(cfg.vocab_size)
    (mb,) = split(batch, list(range(len(ROWS))), torch.zeros(len(ROWS)), 8, 0, packing=False)
    targets = batch.input_ids[:, PROMPT:]
    positions = torch.zeros_like(targets)
    with pytest.raises(ConfigError, match=field), fused_logp_head(model, positions, targets):
        pass
    logp, _ = completion_logp(model, mb)  # the model's own logits: no refusal
    assert bool(torch.isfinite(logp).all())
    setattr(cfg, field, None if field == "final_logit_softcapping" else 1.0)
    assert head_problem(model) is None


def test_fused_head_refuses_an_adapter_on_the_head() -> None:
    """LoRA on ``lm_head`` makes the head a peft layer whose ``weight`` is the frozen base:
    scoring with it alone would drop the adapter's B A from every logit."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    def lora(targets: list[str]) -> torch.nn.Module:
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(FIXTURES / "olmo2"))
        return get_peft_model(model, LoraConfig(r=2, target_modules=targets))

    assert head_problem(lora(["q_proj"])) is None
    assert "not a plain linear layer" in (head_problem(lora(["q_proj", "lm_head"])) or "")
