"""The native engine's prefill in chunks of whole prompts (``NativeEngine.prefill_tokens``):
what partial rollouts need once they hand the engine many long continued answers. On the
CPU in fp32 with real tiny models saved and loaded through ``from_pretrained``: a rollout
whose prompts (of different lengths, mixed counts) are split into 2 or 3 chunks gives the
unchunked rollout's greedy tokens, its log-probs and its KV cache within TOL (measured:
log-probs within 3e-6, K and V within 1.1e-5 of keys up to 20 in size), each chunk within
the budget; a budget that fits, or 0, is the one batch bit for bit."""

from __future__ import annotations

import pytest
import torch

from grpo_hpc.memory.estimate import PREFILL_TOKENS
from grpo_hpc.train.rollout.native import forward, weights
from grpo_hpc.train.rollout.native.engine import NativeEngine
from grpo_hpc.train.rollout.types import RolloutBatch, left_padded
from grpo_hpc.train.setup.models import load_model_and_tokenizer
from tests.fixtures.families.make import save_varied

# Lengths 12, 53, 4 and 23: every chunk but the longest one's is padded to less than the
# rollout's 53 columns, and Gemma 3's sliding window (16) is shorter than three of them.
PROMPTS = [
    "What is 2+3?",
    "Compute 17 plus 25, then give the answer in one line.",
    "9*9=",
    "abc def ghi jkl mno pqr",
]
COUNTS = [3, 1, 2, 1]
"""Seven rows: the row bucket of 8 leaves one bucket-padding row after the last chunk."""
BUDGETS = {60: [(1, 12), (1, 53), (2, 23)], 110: [(2, 53), (2, 23)]}
"""Budgets and the chunks (prompts, padded width) each gives these prompts."""
NEW = 40
TOL = 1e-5
"""Absolute on log-probs and logits; absolute and relative on K and V (fp32 sums over
other batch shapes round differently: Gemma's keys reach 20)."""


@pytest.fixture(scope="module", params=["qwen3", "gemma3"])
def model_tok(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """Qwen3 (q/k norms, grouped KV heads) and Gemma 3 (sliding and global layers with
    their own rotary, post-norms, scaled embeddings, GELU)."""
    path = save_varied(request.param, tmp_path_factory.mktemp("chunks"))
    model, tok = load_model_and_tokenizer(path, "sdpa", torch.device("cpu"))
    return model.eval(), tok


def _engine(model, tok, budget: int, **kw) -> NativeEngine:  # noqa: ANN001, ANN003
    return NativeEngine(model, tok, NEW, 1.0, 1.0, 60, prefill_tokens=budget, **kw)


def _ids(tok) -> list[list[int]]:  # noqa: ANN001
    ids = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]
    assert [len(i) for i in ids] == [12, 53, 4, 23]
    return ids


def _assert_same(a: RolloutBatch, b: RolloutBatch) -> None:
    """Bit for bit: every tensor, the texts and the prompt width."""
    assert a.prompt_len == b.prompt_len and a.texts == b.texts
    for name in ("input_ids", "attention_mask", "completion_mask", "finished", "sampled_logp"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


# ---------------------------------------------------------------- the chunks (pure)


@pytest.mark.parametrize(
    "lengths",
    [[12, 53, 4, 23], [5] * 9, [300, 4400, 4400, 310, 4000, 320, 320, 320], [1], [7, 0, 3]],
)
@pytest.mark.parametrize("budget", [1, 10, 60, 110, 9000, 16384])
def test_chunks_are_consecutive_whole_prompts_within_the_budget(
    lengths: list[int], budget: int
) -> None:
    chunks = forward.prefill_chunks(lengths, budget)
    assert chunks[0][0] == 0 and chunks[-1][1] == len(lengths)
    assert all(a < b for a, b in chunks)  # at least one prompt each
    assert all(b == c for (_, b), (c, _) in zip(chunks, chunks[1:], strict=False))
    for a, b in chunks:
        tokens = (b - a) * max(max(lengths[a:b]), 1)
        assert tokens <= budget or b - a == 1  # a prompt past the budget goes alone
        if b < len(lengths):  # as full as the budget allows: the next prompt would not fit
            assert (b + 1 - a) * max(max(lengths[a : b + 1]), 1) > budget


def test_a_budget_of_zero_or_of_every_prompt_is_one_chunk() -> None:
    assert forward.prefill_chunks([12, 53, 4, 23], 0) == [(0, 4)]
    assert forward.prefill_chunks([12, 53, 4, 23], 4 * 53) == [(0, 4)]
    assert forward.prefill_chunks([12, 53, 4, 23], 4 * 53 - 1) != [(0, 4)]
    # one batch unless asked (evaluations and synchronous steps as measured so far); the
    # partial pool's generator asks for the budget the memory estimate counts
    assert NativeEngine.prefill_tokens == 0


# ---------------------------------------------------------------- chunked = one batch


@pytest.mark.parametrize("budget", sorted(BUDGETS))
def test_chunked_prefill_gives_the_one_batch_rollout(budget: int, model_tok: tuple) -> None:
    """Greedy tokens equal, log-probs and the whole KV cache (prefill and decoded slots,
    each row from its left padding) within TOL; each chunk within the budget."""
    model, tok = model_tok
    ids = _ids(tok)
    # compact=False: each row stays in its cache row for the comparison of the caches
    one, chunked = (_engine(model, tok, b, compact=False) for b in (0, budget))
    want = one.generate_rows(ids, COUNTS, greedy=True)
    got = chunked.generate_rows(ids, COUNTS, greedy=True)
    assert len(set(want.texts)) == len(PROMPTS), "degenerate test: prompts complete alike"
    assert one.prefill_shapes == [(4, 53)] and one.stats["prefill_chunks"] == 1
    assert chunked.prefill_shapes == BUDGETS[budget]
    assert chunked.stats["prefill_chunks"] == len(BUDGETS[budget])
    assert all(p * w <= budget for p, w in chunked.prefill_shapes)
    for name in ("input_ids", "attention_mask", "completion_mask", "finished"):
        assert torch.equal(getattr(want, name), getattr(got, name)), name
    assert want.texts == got.texts
    torch.testing.assert_close(got.sampled_logp, want.sampled_logp, rtol=0, atol=TOL)
    width = want.prompt_len
    pads = [width - len(i) for i, n in zip(ids, COUNTS, strict=True) for _ in range(n)]
    a, b = one.spaces[8].cache, chunked.spaces[8].cache
    for row, pad in enumerate(pads):  # the slots a row's attention reads
        for x, y in ((a.k, b.k), (a.v, b.v)):
            seen = slice(pad, width + NEW - 1)
            torch.testing.assert_close(y[:, row, :, seen], x[:, row, :, seen], rtol=TOL, atol=TOL)


def test_each_chunk_fills_its_rows_and_slots_of_the_cache(model_tok: tuple) -> None:
    """The prefill alone into caches full of NaN: chunked, every slot of the prompt columns
    of every row (bucket padding too) is written (left padding as zeros), each row's
    visible K/V and the logits are the one batch's within TOL, and no slot past the prompt
    is touched."""
    model, tok = model_tok
    ids, pad_id = _ids(tok), tok.pad_token_id
    one, chunked = _engine(model, tok, 0), _engine(model, tok, 60)
    x, mask = left_padded(ids, pad_id)
    pads = x.shape[1] - mask.sum(1)
    out = {}
    with torch.no_grad():
        weights.refill(one.packed, model)
        weights.refill(chunked.packed, model)
        for engine in (one, chunked):
            cache = forward.KVCache.empty(engine.packed, 8, 128, torch.float32)
            cache.k.fill_(float("nan"))
            cache.v.fill_(float("nan"))
            out[engine.prefill_tokens] = (engine._prefill(cache, x, pads, COUNTS), cache)
    assert len(chunked.prefill_shapes) == 3
    (want, a), (got, b) = out[0], out[60]
    torch.testing.assert_close(got, want, rtol=0, atol=TOL)
    width = x.shape[1]
    rows = [int(pads[i]) for i, n in enumerate(COUNTS) for _ in range(n)]
    for row, pad in enumerate([*rows, rows[-1]]):  # row 7: bucket padding, the last row's
        for k, (x_, y) in enumerate(((a.k, b.k), (a.v, b.v))):
            assert torch.isfinite(y[:, row, :, :width]).all(), (row, k)
            assert torch.isnan(y[:, row, :, width:]).all(), (row, k)
            torch.testing.assert_close(
                y[:, row, :, pad:width], x_[:, row, :, pad:width], rtol=TOL, atol=TOL
            )


# ---------------------------------------------------------------- one chunk: as before


@pytest.mark.parametrize("greedy", [True, False])
def test_a_budget_that_fits_or_zero_is_the_one_batch_bit_for_bit(
    greedy: bool, model_tok: tuple
) -> None:
    """0, the default and a huge budget: one chunk of the rollout's width, and the same
    rollout bit for bit (sampled with the same seed too), its cache included."""
    model, tok = model_tok
    ids = _ids(tok)
    runs = []
    for budget in (0, PREFILL_TOKENS, 4 * 53, 10**9):
        engine = _engine(model, tok, budget, compact=False)
        torch.manual_seed(11)
        runs.append((engine.generate_rows(ids, COUNTS, greedy=greedy), engine))
        assert engine.prefill_shapes == [(4, 53)]
    (want, first), rest = runs[0], runs[1:]
    for got, engine in rest:
        _assert_same(want, got)
        assert torch.equal(first.spaces[8].cache.k, engine.spaces[8].cache.k)
        assert torch.equal(first.spaces[8].cache.v, engine.spaces[8].cache.v)
