"""The native rollout engine on the CPU against HF ``generate`` and a plain forward pass,
with real models saved and loaded through ``from_pretrained``."""

from __future__ import annotations

import copy

import pytest
import torch

from grpo_hpc.core.errors import ConfigError, StalledError
from grpo_hpc.train.algo.update import MicroBatch, completion_logp
from grpo_hpc.train.rewards.streaming import completion_text
from grpo_hpc.train.rollout.engines import (
    EngineOptions,
    GenerationAborted,
    HFEngine,
    build_engine,
    capped,
    pick_engine,
)
from grpo_hpc.train.rollout.native.engine import NativeEngine
from grpo_hpc.train.rollout.native.sampling import choose, top_p_filter
from grpo_hpc.train.rollout.native.workspace import compact_rows, compaction_buckets, spans

PROMPTS = ["What is 2+3?", "Compute 17 plus 25, then give the answer.", "9*9="]


def _engines(model, tok, new: int = 40):  # noqa: ANN001, ANN202
    return HFEngine(model, tok, new, 1.0, 1.0, 60), NativeEngine(model, tok, new, 1.0, 1.0, 60)


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_greedy_tokens_equal_hf_generate(name: str, request: pytest.FixtureRequest) -> None:
    model, tok = request.getfixturevalue(name)
    hf, native = _engines(model, tok)
    a = hf.generate(PROMPTS, 2, greedy=True)
    b = native.generate(PROMPTS, 2, greedy=True)
    assert len({t for t in b.texts}) > 1, "degenerate test: every completion is the same"
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.completion_mask, b.completion_mask)
    assert a.texts == b.texts


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_sampled_logp_equals_a_plain_forward(name: str, request: pytest.FixtureRequest) -> None:
    model, tok = request.getfixturevalue(name)
    torch.manual_seed(0)
    batch = NativeEngine(model, tok, 24, 0.7, 0.9, 60).generate(PROMPTS, 4)
    rows = batch.input_ids.shape[0]
    with torch.no_grad():
        logp, _ = completion_logp(model, MicroBatch(batch, torch.arange(rows), torch.zeros(rows)))
    mask = batch.completion_mask.bool()
    assert batch.sampled_logp is not None
    torch.testing.assert_close(batch.sampled_logp[mask], logp[mask], atol=1e-5, rtol=0)
    # Completions of one prompt differ: each row samples on its own from the shared prefix.
    assert len(set(batch.texts[:4])) > 1


def test_rows_stop_at_eos_and_generation_ends_early(llama) -> None:  # noqa: ANN001
    model, tok = llama
    probe = NativeEngine(model, tok, 40, 1.0, 1.0, 60).generate(PROMPTS, 1, greedy=True)
    # Make a token the model emits early in some rows (not all) the end-of-sequence token.
    completion = probe.input_ids[:, probe.prompt_len :]
    eos = int(completion[0, 2])
    hits = completion == eos
    want = torch.where(hits.any(1), hits.int().argmax(1) + 1, torch.tensor(40))
    assert want.min() < 40 < want.max() + 1  # some rows end early, at least one does not
    tok2 = copy.deepcopy(tok)
    tok2.eos_token = tok.convert_ids_to_tokens(eos)
    hf, native = _engines(model, tok2, new=40)
    a = hf.generate(PROMPTS, 1, greedy=True)
    b = native.generate(PROMPTS, 1, greedy=True)
    assert torch.equal(a.input_ids, b.input_ids)
    assert b.completion_mask.sum(1).tolist() == want.tolist()  # up to EOS, inclusive
    first = int(want[0])
    assert (b.input_ids[0, b.prompt_len + first :] == tok2.pad_token_id).all()
    alone = native.generate(PROMPTS[:1], 1, greedy=True)  # its only row ends at token 3
    assert alone.input_ids.shape[1] - alone.prompt_len < 40  # the loop stopped early


def test_time_budget_raises_stalled_and_abort_raises_aborted(llama) -> None:  # noqa: ANN001
    model, tok = llama
    with pytest.raises(StalledError, match="generation_timeout_s"):
        NativeEngine(model, tok, 64, 1.0, 1.0, timeout_s=0.0).generate(PROMPTS, 2)
    beats: list[int] = []
    engine = NativeEngine(
        model, tok, 64, 1.0, 1.0, 60, tick=lambda: beats.append(1), abort=lambda: len(beats) > 1
    )
    with pytest.raises(GenerationAborted):
        engine.generate(PROMPTS, 2)
    assert len(beats) == 2  # heartbeats come from inside the decode loop


def test_sampling_follows_the_tempered_distribution() -> None:
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(20000, 1)
    tokens, logp = choose(logits, temperature=0.5, top_p=1.0, greedy=False)
    freq = torch.bincount(tokens, minlength=4).float() / len(tokens)
    want = torch.softmax(logits[0] / 0.5, -1)
    assert (freq - want).abs().max() < 0.015
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1).gather(1, tokens[:, None])[:, 0])


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert torch.equal(top_p_filter(probs, 0.7), torch.tensor([[0.5, 0.3, 0.0, 0.0]]))
    assert torch.equal(top_p_filter(probs, 0.4), torch.tensor([[0.5, 0.0, 0.0, 0.0]]))
    assert torch.equal(top_p_filter(probs, 1.0), probs)


def test_engine_choice(llama) -> None:  # noqa: ANN001
    model, tok = llama
    opts = EngineOptions(8, 1.0, 1.0, 60)
    assert pick_engine("hf", model, opts) == "hf"
    assert pick_engine("auto", model, opts) == "hf"  # CPU: HF generate unless asked
    assert pick_engine("native", model, opts) == "native"
    with pytest.raises(ConfigError, match="use rollout.engine=hf"):
        pick_engine("native", torch.nn.Linear(2, 2), opts)  # not a supported architecture
    engine = build_engine(
        "native", model, tok, opts, tick=lambda: None, abort=lambda: False, autocast=None
    )
    assert isinstance(engine, NativeEngine)
    assert engine.use_graphs and engine.compile  # (both ignored on a CPU)
    eager = EngineOptions(8, 1.0, 1.0, 60, eager=True)  # rollout.enforce_eager
    engine = build_engine(
        "native", model, tok, eager, tick=lambda: None, abort=lambda: False, autocast=None
    )
    assert not engine.use_graphs and not engine.compile


def _eos_in_most_rows(model, tok, prompts: list[str], g: int, greedy: bool):  # noqa: ANN001, ANN202
    """A copy of ``tok`` whose EOS is the token that occurs in the most rows of a rollout
    (not among any row's first 4 tokens): rows then end at many different steps, as a real
    model's do."""
    torch.manual_seed(0)
    probe = NativeEngine(model, tok, 64, 1.0, 1.0, 60).generate(prompts, g, greedy=greedy)
    completion = probe.input_ids[:, probe.prompt_len :]
    rows_with = torch.zeros(len(tok), dtype=torch.long)
    for row in completion:
        rows_with[row.unique()] += 1
    rows_with[completion[:, :4].unique()] = 0
    rows_with[tok.pad_token_id] = 0
    tok2 = copy.deepcopy(tok)
    tok2.eos_token = tok.convert_ids_to_tokens(int(rows_with.argmax()))
    return tok2


@pytest.mark.parametrize("greedy", [True, False])
def test_compacting_finished_rows_keeps_tokens_and_logp(qwen2, greedy: bool) -> None:  # noqa: ANN001
    model, tok = qwen2
    prompts = [f"{p} ({i})" for i in range(4) for p in PROMPTS] if greedy else PROMPTS
    g = 2 if greedy else 8  # 24 rows either way
    tok2 = _eos_in_most_rows(model, tok, prompts, g, greedy)
    runs, handed, seen = [], [], {}
    for compact in (False, True):
        torch.manual_seed(1)
        engine = NativeEngine(
            model, tok2, 64, 1.0, 1.0, 60, row_bucket=4, check_every=4, compact=compact
        )

        # the compacting run also hands finished rows over (rollout.stream_scoring)
        # and the new tokens of rows still decoding (rollout.judge_running)
        def running(rows: list[int], ids: list[list[int]]) -> None:
            assert not handed or not set(rows) & {r for chunk, _ in handed for r in chunk}
            for row, new in zip(rows, ids, strict=True):
                seen.setdefault(row, []).extend(new)

        hand = {"on_done": lambda rows, ids: handed.append((rows, ids)), "on_running": running}
        hand = hand if compact else {}
        runs.append((engine.generate(prompts, g, greedy=greedy, **hand), dict(engine.stats)))
    (full, full_stats), (compacted, stats) = runs
    torch.manual_seed(1)  # again on the same engine: its compacted batches are reused
    assert torch.equal(engine.generate(prompts, g, greedy=greedy).input_ids, full.input_ids)
    lengths = compacted.completion_mask.sum(1)
    assert lengths.min() < 16 and lengths.max() > 40  # rows end at very different steps
    assert full_stats["compactions"] == 0 and stats["compactions"] >= 1
    assert stats["row_steps"] < full_stats["row_steps"]  # finished rows stopped costing
    assert torch.equal(full.input_ids, compacted.input_ids)
    assert torch.equal(full.completion_mask, compacted.completion_mask)
    assert full.texts == compacted.texts
    assert full.sampled_logp is not None and compacted.sampled_logp is not None
    torch.testing.assert_close(compacted.sampled_logp, full.sampled_logp, atol=1e-6, rtol=0)
    # Rows handed over through the compactions are the rollout's rows, each once, as returned
    rows = [row for chunk, _ in handed for row in chunk]
    assert len(handed) > 1 and len(rows) == len(set(rows))
    for chunk, ids in handed:
        for row, tokens in zip(chunk, ids, strict=True):
            assert completion_text(tok2, tokens) == compacted.texts[row]
    # Rows still decoding were shown their tokens in order, each column once: a prefix of
    # the row's completion, through the compactions; every row, from the first check on.
    completion = compacted.input_ids[:, compacted.prompt_len :].tolist()
    assert sorted(seen) == list(range(len(completion)))
    for row, tokens in seen.items():
        assert len(tokens) >= 4 and tokens == completion[row][: len(tokens)]


def test_compaction_halves_row_buckets() -> None:
    assert [compact_rows(n, 64, 8) for n in (64, 33, 32, 17, 9, 8, 1)] == [
        64,
        64,
        32,
        32,
        16,
        8,
        8,
    ]
    assert compact_rows(20, 24, 8) == 24  # the next bucket (32) is no smaller: stay
    assert compact_rows(16, 24, 8) == 16


@pytest.mark.parametrize("rows", [8, 24, 64, 72, 128])
def test_capture_ahead_covers_every_batch_compaction_reaches(rows: int) -> None:
    """The batches captured ahead (capture_ahead) are exactly those compact_rows can pick
    for some number of running rows, below the batch's own."""
    reachable = {compact_rows(live, rows, 8) for live in range(1, rows + 1)} - {rows}
    assert set(compaction_buckets(rows, 8)) == reachable


def test_capture_ahead_covers_every_span_a_step_reads() -> None:
    """A step reads round_up(prompt + t, 64) slots; with the cache sized for the longest
    prompt plus max_new (its capacity), every span read is one captured ahead."""
    capacity, max_new = 448, 256  # a 192-token longest prompt
    read = {-(-(prompt + t) // 64) * 64 for prompt in range(1, 193) for t in range(1, max_new)}
    assert read <= set(spans(capacity, 64)) and max(spans(capacity, 64)) == capacity


def test_cache_sized_once_for_the_longest_prompt(llama) -> None:  # noqa: ANN001
    """Evaluation feeds chunks of prompts of many lengths. Without a reservation the cache
    regrows whenever a chunk's prompts are longer, dropping the captured graphs; sized for
    the longest prompt it is allocated once, and the tokens are the same either way."""
    from grpo_hpc.tasks.problems import longest_prompt_tokens, prompt_text

    model, tok = llama
    texts = [prompt_text(tok, q) for q in PROMPTS]  # as the trainer prompts
    chunks = [texts[2:], texts[:1], texts[1:2]]  # short, longer, longest
    longest = longest_prompt_tokens(tok, [{"question": q} for q in PROMPTS])
    assert longest == max(len(x) for x in tok(texts, add_special_tokens=False).input_ids)
    grow = NativeEngine(model, tok, 8, 1.0, 1.0, 60)
    fixed = NativeEngine(model, tok, 8, 1.0, 1.0, 60, max_prompt_tokens=longest)
    for chunk in chunks:
        a = grow.generate(chunk, 1, greedy=True)
        b = fixed.generate(chunk, 1, greedy=True)
        assert torch.equal(a.input_ids, b.input_ids)
    assert grow.totals["caches"] > 1
    assert fixed.totals["caches"] == 1


@pytest.mark.parametrize("name", ["native", "hf"])
def test_a_raised_cap_decodes_longer_and_a_capped_evaluation_keeps_the_old(
    llama,  # noqa: ANN001
    name: str,
) -> None:
    """A rollback's larger cap (``training.rollback_cap_growth``): the engine decodes up to
    the new cap (the native engine's workspaces widened), an evaluation under ``capped``
    decodes up to the configured one, greedy tokens the same as an engine built at that
    cap, and the rollouts go back to the raised cap after it."""
    model, tok = llama
    make = NativeEngine if name == "native" else HFEngine
    engine, small = make(model, tok, 8, 1.0, 1.0, 60), make(model, tok, 8, 1.0, 1.0, 60)
    engine.generate(PROMPTS, 2)  # workspaces 8 wide
    engine.set_max_new_tokens(24)
    assert engine.generate(PROMPTS, 2, greedy=True).completion_mask.shape[1] == 24
    with capped(engine, 8):
        a = engine.generate(PROMPTS, 1, greedy=True)
    assert torch.equal(a.input_ids, small.generate(PROMPTS, 1, greedy=True).input_ids)
    assert engine.max_new_tokens == 24
    assert engine.generate(PROMPTS, 1, greedy=True).completion_mask.shape[1] == 24


def test_release_frees_the_engine_and_the_next_rollout_is_the_same(llama) -> None:  # noqa: ANN001
    """rollout.release_engine_memory: between rollouts the engine holds no weights, caches
    or workspaces, and the next rollout rebuilds them and samples exactly what a kept
    engine samples from the same seed."""
    model, tok = llama
    kept, released = (
        NativeEngine(model, tok, 16, 1.0, 1.0, 60),
        NativeEngine(model, tok, 16, 1.0, 1.0, 60),
    )
    for _ in range(2):
        torch.manual_seed(1)
        a = kept.generate(PROMPTS, 3)
        released.release()
        assert released.packed is None and not released.spaces
        torch.manual_seed(1)
        b = released.generate(PROMPTS, 3)
        assert torch.equal(a.input_ids, b.input_ids)
        assert torch.equal(a.sampled_logp, b.sampled_logp)
    assert released.totals["caches"] == 2 and kept.totals["caches"] == 1


def test_fused_attention_only_where_its_kernel_was_measured() -> None:
    """The Triton decode attention needs CUDA, half precision and a power-of-two head
    size; everywhere else (here: the CPU) the engine keeps the matrix-product path."""
    from grpo_hpc.train.rollout.native import attention

    cpu = torch.device("cpu")
    assert not attention.fused_available(cpu, torch.bfloat16, 64)
    assert not attention.fused_available(torch.device("cuda"), torch.float32, 64)
    assert not attention.fused_available(torch.device("cuda"), torch.bfloat16, 80)
