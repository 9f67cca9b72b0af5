"""algo.fp32_lm_head: the LM head's product in fp32 in the update (fused head), in the
native engine (an fp32 head of its own, refilled every rollout) and in HF generate."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from grpo_hpc.train.algo.logp_head import Scoring, linear_logp
from grpo_hpc.train.algo.update import MicroBatch, completion_logp
from grpo_hpc.train.rollout.engines import fp32_logits
from grpo_hpc.train.rollout.native.engine import NativeEngine
from grpo_hpc.train.setup.models import LlamaShape, load_model_and_tokenizer, save_random_llama

PROMPTS = ["What is 2+3?", "Compute 17 plus 25."]
BF16 = torch.autocast("cpu", dtype=torch.bfloat16)


def _head_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    h = torch.randn(64, 32, generator=g, requires_grad=True)
    w = (torch.randn(500, 32, generator=g) * 0.8).requires_grad_()  # logits of size ~20
    ids = torch.randint(0, 500, (64,), generator=g)
    return h, w, ids


def test_fp32_head_under_autocast_equals_the_fp32_head_with_its_gradients() -> None:
    h, w, ids = _head_case()
    exact, _ = linear_logp(h, w, ids)  # no autocast: fp32
    ref = torch.autograd.grad(exact.sum(), (h, w))
    with BF16:
        low, _ = linear_logp(h, w, ids)
        high, _ = linear_logp(h, w, ids, scoring=Scoring(fp32=True))
    assert (low - exact).abs().max() > 1e-2  # bf16 logits: visibly off
    torch.testing.assert_close(high, exact, atol=1e-5, rtol=0)
    for got, want in zip(torch.autograd.grad(high.sum(), (h, w)), ref, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    out: Path = tmp_path_factory.mktemp("llama") / "m"
    save_random_llama(out, LlamaShape(64, 2, 4, 2, 128), seed=3)  # tied embeddings
    model, tok = load_model_and_tokenizer(out, "sdpa", torch.device("cpu"))
    return model.eval(), tok


def test_engine_reports_the_log_probs_the_fp32_head_update_scores(llama) -> None:  # noqa: ANN001
    """In bf16, with the head in fp32 on both sides, the engine's log-probs and the update's
    agree better than with bf16 heads (what the option is for), and in fp32 the option
    changes no token."""
    model, tok = llama

    def mismatch(fp32: bool) -> float:
        torch.manual_seed(0)
        engine = NativeEngine(model, tok, 24, 1.0, 1.0, 60, dtype=torch.bfloat16, fp32_head=fp32)
        batch = engine.generate(PROMPTS, 4)
        rows = batch.input_ids.shape[0]
        mb = MicroBatch(batch, torch.arange(rows), torch.zeros(rows))
        with torch.no_grad(), BF16:
            logp, _ = completion_logp(model, mb, scoring=Scoring(fp32=fp32))
        mask = batch.completion_mask.bool()
        return float((logp - batch.sampled_logp)[mask].abs().mean())

    assert mismatch(True) < 0.9 * mismatch(False)  # 0.68x here (tiny model, small logits)
    torch.manual_seed(1)
    plain = NativeEngine(model, tok, 24, 1.0, 1.0, 60).generate(PROMPTS, 2)
    torch.manual_seed(1)
    head = NativeEngine(model, tok, 24, 1.0, 1.0, 60, fp32_head=True).generate(PROMPTS, 2)
    assert torch.equal(plain.input_ids, head.input_ids)


def test_engine_head_copy_follows_the_policy(llama) -> None:  # noqa: ANN001
    """The fp32 head is a separate buffer from the bf16 embedding (tied model): every
    rollout must copy the updated weights into it, or the engine samples a stale head."""
    model, tok = llama
    engine = NativeEngine(model, tok, 4, 1.0, 1.0, 60, dtype=torch.bfloat16, fp32_head=True)
    engine.generate(PROMPTS, 1, greedy=True)
    head = engine.packed.lm_head
    assert head.dtype == torch.float32 and head.data_ptr() != engine.packed.embed.data_ptr()
    weight = model.get_output_embeddings().weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.add_(0.25)  # an optimizer step
        engine.generate(PROMPTS, 1, greedy=True)
        torch.testing.assert_close(engine.packed.lm_head, weight.detach(), atol=0, rtol=0)
    finally:
        with torch.no_grad():
            weight.copy_(saved)


def test_hf_generate_logits_in_fp32_under_autocast(llama) -> None:  # noqa: ANN001
    model, tok = llama
    ids = tok(PROMPTS[:1], return_tensors="pt").input_ids
    with torch.no_grad(), BF16:
        low = model(ids).logits
        with fp32_logits(model):
            high = model(ids).logits
        with fp32_logits(model, on=False):
            off = model(ids).logits
    assert low.dtype == off.dtype == torch.bfloat16 and high.dtype == torch.float32
    with torch.no_grad(), contextlib.nullcontext():
        exact = model(ids).logits
    assert (high - exact).abs().max() < (low.float() - exact).abs().max()
