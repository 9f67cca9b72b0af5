"""The native engine's CUDA path (graphs, compiled layers) on a real-shaped model
(Qwen2.5-0.5B dimensions, random weights, loaded through ``from_pretrained``)."""

from __future__ import annotations

import pytest
import torch

from grpo_hpc.train.algo.update import MicroBatch, completion_logp
from grpo_hpc.train.rollout.engines import HFEngine
from grpo_hpc.train.rollout.native.engine import NativeEngine
from grpo_hpc.train.setup.models import load_model_and_tokenizer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
PROMPTS = [f"Question {i}: what is {7 * i} plus {3 * i + 1}?" for i in range(8)]


@pytest.fixture(scope="module")
def qwen_shaped(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    from bench.common import build_model

    out = tmp_path_factory.mktemp("qwen") / "m"
    build_model(out, "qwen2.5-0.5b")
    model, tok = load_model_and_tokenizer(out, "sdpa", torch.device("cuda"))
    return model.eval(), tok


def test_fp32_greedy_tokens_equal_hf_generate(qwen_shaped) -> None:  # noqa: ANN001
    model, tok = qwen_shaped
    hf = HFEngine(model, tok, 48, 1.0, 1.0, 600)
    native = NativeEngine(model, tok, 48, 1.0, 1.0, 600, dtype=torch.float32)
    a, b = hf.generate(PROMPTS, 2, greedy=True), native.generate(PROMPTS, 2, greedy=True)
    assert torch.equal(a.input_ids, b.input_ids)


def test_bf16_greedy_is_argmax_up_to_bf16_rounding(qwen_shaped) -> None:  # noqa: ANN001
    """In bf16 the head's output is rounded to 8 significant bits, so two correct
    implementations may pick different tokens at near-ties (a random model's logits are
    nearly flat, so sequences diverge). Every native greedy token must still be an
    argmax of a plain forward over its own prefix, up to two bf16 steps of the logits
    (each side's logits are rounded once, and their hidden states differ by bf16 noise)."""
    model, tok = qwen_shaped
    native = NativeEngine(model, tok, 48, 1.0, 1.0, 600, dtype=torch.bfloat16)
    b = native.generate(PROMPTS, 2, greedy=True)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.float()
    pred = logits[:, b.prompt_len - 1 : -1]
    chosen = pred.gather(-1, b.input_ids[:, b.prompt_len :, None])[..., 0]
    top = pred.max(-1).values
    ulp = 2.0 ** (torch.floor(torch.log2(top.abs())) - 7)  # bf16 spacing at that magnitude
    gap = top - chosen
    assert (gap <= 2 * ulp).all(), (gap.max(), ulp.min())


def test_bf16_logp_match_the_training_forward(qwen_shaped) -> None:  # noqa: ANN001
    model, tok = qwen_shaped
    native = NativeEngine(model, tok, 64, 1.0, 1.0, 600, dtype=torch.bfloat16)
    torch.manual_seed(0)
    batch = native.generate(PROMPTS, 4)
    rows = batch.input_ids.shape[0]
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        logp, _ = completion_logp(model, MicroBatch(batch, torch.arange(rows), torch.zeros(rows)))
    diff = (logp - batch.sampled_logp)[batch.completion_mask.bool()].abs()
    assert diff.mean() < 0.02 and diff.max() < 0.15, (diff.mean(), diff.max())


def test_graphs_are_captured_once_and_reused(qwen_shaped) -> None:  # noqa: ANN001
    model, tok = qwen_shaped
    native = NativeEngine(model, tok, 64, 1.0, 1.0, 600, dtype=torch.bfloat16)
    native.generate(PROMPTS, 8)
    graphs = {rows: dict(ws.graphs) for rows, ws in native.spaces.items()}
    again = native.generate(PROMPTS, 8)
    assert again.input_ids.shape[0] == 64 and again.num_tokens > 0
    assert {rows: dict(ws.graphs) for rows, ws in native.spaces.items()} == graphs


def test_capture_ahead_leaves_nothing_to_capture_mid_run(qwen_shaped) -> None:  # noqa: ANN001
    """capture_ahead (the default): the first rollout of a batch shape captures every graph
    that rollouts of that shape can meet, so later ones, with other prompt lengths, capture
    none (a graph met mid-run made one rank late and its peers wait); and the tokens equal
    an engine that captures as it goes, from the same seeds."""
    model, tok = qwen_shaped
    long = [p + " Show the work." * 4 for p in PROMPTS]
    longest = max(len(x) for x in tok(long).input_ids)
    engines = [
        NativeEngine(
            model, tok, 64, 1.0, 1.0, 600, dtype=torch.bfloat16, max_prompt_tokens=longest,
            capture_ahead=ahead,
        )
        for ahead in (True, False)
    ]  # fmt: skip
    first = 0
    for i, prompts in enumerate([PROMPTS, long, PROMPTS]):
        out = []
        for engine in engines:
            torch.manual_seed(i)
            out.append(engine.generate(prompts, 8))
        assert torch.equal(out[0].input_ids, out[1].input_ids)
        first = first or engines[0].totals["captures"]
    ahead, lazy = (e.totals["captures"] for e in engines)
    assert ahead == first  # nothing after the first rollout
    assert lazy <= ahead  # captured as met: a subset of what was captured ahead
    # A new shape of the same rows (greedy, as evaluation decodes) is captured ahead from
    # workspaces that hold the end of a full-length rollout: the same tokens again.
    greedy = [e.generate(PROMPTS, 8, greedy=True) for e in engines]
    assert torch.equal(greedy[0].input_ids, greedy[1].input_ids)
    assert engines[0].totals["captures"] > ahead


def test_cache_regrowth_keeps_graphs_working(qwen_shaped) -> None:  # noqa: ANN001
    """A prompt longer than the cache was sized for makes the engine regrow it: every graph
    is dropped and recaptured into a fresh pool (dropping one workspace's graphs alone
    tripped a caching-allocator assert). Tokens equal an engine sized for it up front."""
    model, tok = qwen_shaped
    long = [p + " Explain every step of the sum in words." * 12 for p in PROMPTS]
    batches = [PROMPTS, long, PROMPTS]
    longest = max(len(x) for x in tok(long).input_ids)
    grow = NativeEngine(model, tok, 32, 1.0, 1.0, 600, dtype=torch.float32)
    fixed = NativeEngine(
        model, tok, 32, 1.0, 1.0, 600, dtype=torch.float32, max_prompt_tokens=longest
    )
    for prompts in batches:
        a = grow.generate(prompts, 2, greedy=True)
        b = fixed.generate(prompts, 2, greedy=True)
        assert torch.equal(a.input_ids, b.input_ids)
    assert grow.totals["caches"] == 2 and fixed.totals["caches"] == 1
    assert grow.totals["captures"] > fixed.totals["captures"]  # recaptured after regrowth


def test_release_gives_the_memory_back_and_recaptures(qwen_shaped) -> None:  # noqa: ANN001
    """rollout.release_engine_memory on a GPU: after release() the engine's weights, caches
    and graph pool are no longer allocated, and the next rollout recaptures its graphs and
    samples what an engine that kept everything samples from the same seed."""
    model, tok = qwen_shaped
    kept = NativeEngine(model, tok, 32, 1.0, 1.0, 600, dtype=torch.bfloat16)
    released = NativeEngine(model, tok, 32, 1.0, 1.0, 600, dtype=torch.bfloat16)
    for _ in range(2):
        torch.manual_seed(3)
        a = kept.generate(PROMPTS, 4)
        torch.manual_seed(3)
        b = released.generate(PROMPTS, 4)
        assert torch.equal(a.input_ids, b.input_ids)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        released.release()
        freed = before - torch.cuda.memory_allocated()
        packed = sum(t.numel() * t.element_size() for t in model.parameters())  # fp32 model
        assert freed > packed // 2 * 0.9  # at least the bf16 packed copy of the weights
    assert released.totals["captures"] > kept.totals["captures"]


@pytest.mark.parametrize(
    ("heads", "kv", "d", "span"),
    [(14, 2, 64, 320), (12, 2, 128, 64), (16, 2, 128, 576), (28, 4, 128, 192)],
)
def test_fused_attention_equals_the_plain_one(heads: int, kv: int, d: int, span: int) -> None:
    """The Triton decode kernel against the matrix-product path in fp32 (0.5B, 1.5B, 3B
    and 7B head layouts): rows with different left padding, the current slot inside the
    span bucket, keys past it unwritten garbage."""
    from grpo_hpc.train.rollout.native import attention

    g = torch.Generator(device="cuda").manual_seed(0)
    rows, cap, dt = 64, span + 64, torch.bfloat16
    q = torch.randn(rows, heads, d, device="cuda", generator=g).to(dt)
    cache_k = torch.randn(rows, kv, cap, d, device="cuda", generator=g).to(dt)
    cache_v = torch.randn(rows, kv, cap, d, device="cuda", generator=g).to(dt)
    keys, vals = cache_k[:, :, :span], cache_v[:, :, :span]
    left_pad = torch.randint(0, span // 2, (rows,), device="cuda", generator=g)
    pos = torch.tensor([span - 9], device="cuda")
    slots = torch.arange(span, device="cuda")
    ok = (slots >= left_pad[:, None]) & (slots <= pos)
    bias = torch.zeros(ok.shape, device="cuda").masked_fill(~ok, float("-inf"))
    bias = bias.view(rows, 1, 1, span)
    want = attention.grouped_attention(q.float(), keys.float(), vals.float(), bias, left_pad, pos)
    got = attention.fused_attention(q, keys, vals, bias, left_pad, pos)
    assert got.dtype == dt and got.shape == want.shape
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


def test_bf16_engine_decodes_with_the_fused_attention(qwen_shaped) -> None:  # noqa: ANN001
    from grpo_hpc.train.rollout.native import attention

    model, tok = qwen_shaped
    native = NativeEngine(model, tok, 16, 1.0, 1.0, 600, dtype=torch.bfloat16)
    assert native.fns.attend is attention.fused_attention
    out = native.generate(PROMPTS[:2], 4)
    assert out.completion_mask.sum() > 0
