"""``generate_rows`` of both rollout engines on the CPU (what partial rollouts build on):
rows with their own prompts and counts, continuation of an unfinished answer, and the
``stop_when`` hook, with real tiny models saved and loaded through ``from_pretrained``."""

from __future__ import annotations

import copy

import pytest
import torch

from grpo_hpc.train.rollout.engines import HFEngine, RolloutBatch, capped
from grpo_hpc.train.rollout.native.engine import NativeEngine

# Three lengths: the batch is left-padded, and each prompt's rows carry its own padding.
PROMPTS = ["What is 2+3?", "Compute 17 plus 25, then give the answer.", "9*9="]
MIXED = [3, 1, 2]
ENDING = [5, 3, 4]
"""Counts of the tests where rows end early: enough rows that some end at every check."""


def _engines(model, tok, new: int = 40, **kw):  # noqa: ANN001, ANN003, ANN202
    return (
        HFEngine(model, tok, new, 1.0, 1.0, 60, **kw),
        NativeEngine(model, tok, new, 1.0, 1.0, 60, **kw),
    )


def _engine(kind: str, model, tok, new: int = 40, **kw):  # noqa: ANN001, ANN003, ANN202
    hf, native = _engines(model, tok, new, **kw)
    return native if kind == "native" else hf


def _ids(tok, prompts: list[str]) -> list[list[int]]:  # noqa: ANN001
    return [tok(p, add_special_tokens=False).input_ids for p in prompts]


def _assert_same(a: RolloutBatch, b: RolloutBatch) -> None:
    """Bit for bit: every tensor, the texts and the prompt width."""
    assert a.prompt_len == b.prompt_len
    for name in ("input_ids", "attention_mask", "completion_mask", "finished"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.texts == b.texts
    assert (a.sampled_logp is None) == (b.sampled_logp is None)
    if a.sampled_logp is not None:
        assert torch.equal(a.sampled_logp, b.sampled_logp)


def _has_eos_before(batch: RolloutBatch, eos: int, t: int) -> list[bool]:
    """Per row: an EOS among the first ``t`` completion columns of the returned batch."""
    return (batch.input_ids[:, batch.prompt_len : batch.prompt_len + t] == eos).any(1).tolist()


# ---------------------------------------------------------------- generate is generate_rows


@pytest.mark.parametrize("kind", ["native", "hf"])
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_equal_counts_give_generate_bit_for_bit(
    kind: str, name: str, request: pytest.FixtureRequest
) -> None:
    model, tok = request.getfixturevalue(name)
    engine = _engine(kind, model, tok)
    ids = _ids(tok, PROMPTS)
    assert len({len(i) for i in ids}) == len(PROMPTS)  # padding differs from row to row
    torch.manual_seed(7)
    want = engine.generate(PROMPTS, 3)
    torch.manual_seed(7)
    got = engine.generate_rows(ids, [3] * len(PROMPTS))
    assert len(set(want.texts)) > 3, "degenerate test: too few distinct completions"
    _assert_same(want, got)
    assert (got.sampled_logp is not None) == (kind == "native")


# ---------------------------------------------------------------- mixed counts


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_mixed_counts_give_each_prompt_its_own_greedy_completion(kind: str, llama: tuple) -> None:
    model, tok = llama
    engine = _engine(kind, model, tok)
    ids = _ids(tok, PROMPTS)
    batch = engine.generate_rows(ids, MIXED, greedy=True)
    owner = [i for i, n in enumerate(MIXED) for _ in range(n)]  # [0, 0, 0, 1, 2, 2]
    assert batch.input_ids.shape[0] == sum(MIXED) == len(batch.texts)
    width = max(len(i) for i in ids)
    assert batch.prompt_len == width
    alone = [engine.generate([p], 1, greedy=True) for p in PROMPTS]
    texts = [a.texts[0] for a in alone]
    assert len(set(texts)) == len(PROMPTS), "degenerate test: prompts complete alike"
    for row, i in enumerate(owner):
        # the prompt, left-padded with the pad id to the longest, masked on the padding
        pad = width - len(ids[i])
        assert batch.input_ids[row, pad:width].tolist() == ids[i]
        assert (batch.input_ids[row, :pad] == tok.pad_token_id).all()
        assert batch.attention_mask[row, :width].tolist() == [0] * pad + [1] * len(ids[i])
        # the completion: that of the prompt decoded on its own
        a = alone[i]
        n = int(a.completion_mask.sum())
        assert int(batch.completion_mask[row].sum()) == n
        got = batch.input_ids[row, width : width + n]
        assert torch.equal(got, a.input_ids[0, a.prompt_len : a.prompt_len + n])
        assert batch.texts[row] == a.texts[0]
        assert bool(batch.finished[row]) == bool(a.finished[0])


# ---------------------------------------------------------------- continuation


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_a_continued_row_goes_on_as_the_uncut_decode(kind: str, qwen2: tuple) -> None:
    """The partial-rollout case: two answers cut after 13 and 9 tokens continue, in one
    call (different prompt + answer lengths, so left padding), for 27 more tokens: the
    tokens of the uncut greedy decode, and (native) its log-probs (prefill vs decode
    numerics). The Qwen2: the random Llama's greedy text is one character repeated."""
    model, tok = qwen2
    n, cut = 40, [13, 9]
    engine = _engine(kind, model, tok, new=n)
    prompts = PROMPTS[:2]
    ids = _ids(tok, prompts)
    full = [engine.generate([p], 1, greedy=True) for p in prompts]
    for f in full:  # no EOS before N: every one of the N tokens can be compared
        assert f.completion_mask.sum() == n and not f.finished[0]
    tokens = [f.input_ids[0, f.prompt_len :] for f in full]
    assert all(len(set(t.tolist())) > 10 for t in tokens), "degenerate test: repeated text"
    cap = n - max(cut)  # 27: row 0 continues to its 40th token, row 1 to its 36th
    with capped(engine, cap):
        cont = engine.generate_rows(
            [i + t[:m].tolist() for i, t, m in zip(ids, tokens, cut, strict=True)],
            [1, 1],
            greedy=True,
        )
    assert cont.prompt_len == max(len(i) + m for i, m in zip(ids, cut, strict=True))
    assert cont.input_ids.shape[1] == cont.prompt_len + cap
    assert not cont.finished.any() and bool(cont.completion_mask.all())
    for row, (t, m) in enumerate(zip(tokens, cut, strict=True)):
        assert torch.equal(cont.input_ids[row, cont.prompt_len :], t[m : m + cap])
        if kind == "native":
            assert full[row].sampled_logp is not None and cont.sampled_logp is not None
            torch.testing.assert_close(
                cont.sampled_logp[row], full[row].sampled_logp[0, m : m + cap], atol=1e-4, rtol=0
            )


# ---------------------------------------------------------------- stop_when


class _Hook:
    """Records every call; says stop once ``t`` reaches ``at`` (never when None)."""

    def __init__(self, at: int | None) -> None:
        self.at = at
        self.calls: list[tuple[list[bool], int]] = []

    def __call__(self, ended: list[bool], t: int) -> bool:
        self.calls.append((list(ended), t))
        return self.at is not None and t >= self.at


@pytest.fixture(scope="module")
def qwen2_eos(qwen2: tuple) -> tuple:
    """The Qwen2 with a tokenizer whose EOS it writes often (:func:`_eos_in_many_rows`)."""
    model, tok = qwen2
    return model, _eos_in_many_rows(model, tok, _ids(tok, PROMPTS), ENDING)


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_stop_when_ends_the_rollout_at_a_host_check(kind: str, qwen2_eos: tuple) -> None:
    model, tok = qwen2_eos
    every = 8
    engine = _engine(kind, model, tok, new=40, check_every=every)
    ids = _ids(tok, PROMPTS)
    torch.manual_seed(3)
    uncut = engine.generate_rows(ids, ENDING)
    hook = _Hook(2 * every)
    torch.manual_seed(3)
    batch = engine.generate_rows(ids, ENDING, stop_when=hook)
    t = 2 * every
    assert batch.input_ids.shape[1] - batch.prompt_len == t == batch.completion_mask.shape[1]
    assert [c[1] for c in hook.calls] == [every, 2 * every]  # positive multiples of the check
    assert all(len(ended) == sum(ENDING) for ended, _ in hook.calls)
    ended = hook.calls[-1][0]
    assert batch.finished.tolist() == ended
    assert any(ended) and not all(ended), "degenerate test: no row or every row ended"
    for row in range(sum(ENDING)):
        if not ended[row]:
            assert bool(batch.completion_mask[row].all())
            assert batch.attention_mask[row, batch.prompt_len :].all()
    for seen, at in hook.calls:
        assert seen == _has_eos_before(batch, tok.eos_token_id, at)
    # Stopping changes no token: the columns it kept are the uncut rollout's.
    width = batch.prompt_len + t
    assert torch.equal(batch.input_ids, uncut.input_ids[:, :width])


@pytest.mark.parametrize("kind", ["native", "hf"])
@pytest.mark.parametrize("ending", [False, True])
def test_stop_when_that_never_stops_changes_nothing(
    kind: str, ending: bool, request: pytest.FixtureRequest
) -> None:
    """Rows that never end (the Llama) and rows that end early (``qwen2_eos``)."""
    model, tok = request.getfixturevalue("qwen2_eos" if ending else "llama")
    counts = ENDING if ending else MIXED
    engine = _engine(kind, model, tok, new=40, check_every=8)
    ids = _ids(tok, PROMPTS)
    torch.manual_seed(4)
    want = engine.generate_rows(ids, counts)
    hook = _Hook(None)
    torch.manual_seed(4)
    got = engine.generate_rows(ids, counts, stop_when=hook)
    _assert_same(want, got)
    # asked at every check below the cap of 40 while a row still ran
    running = [t for t in (8, 16, 24, 32) if not all(_has_eos_before(want, tok.eos_token_id, t))]
    assert [c[1] for c in hook.calls] == running and running
    for seen, at in hook.calls:
        assert seen == _has_eos_before(want, tok.eos_token_id, at)


def _eos_in_many_rows(model, tok, prompt_ids: list[list[int]], counts: list[int]):  # noqa: ANN001, ANN202
    """A copy of ``tok`` whose EOS is the token found in the most rows of a sampled rollout
    (not among any row's first 4 tokens). The random models never write the real EOS;
    with this one rows end at many different steps, as a real model's do, and the native
    engine compacts them out."""
    torch.manual_seed(0)
    probe = NativeEngine(model, tok, 64, 1.0, 1.0, 60).generate_rows(prompt_ids, counts)
    completion = probe.input_ids[:, probe.prompt_len :]
    rows_with = torch.zeros(len(tok), dtype=torch.long)
    for row in completion:
        rows_with[row.unique()] += 1
    rows_with[completion[:, :4].unique()] = 0
    rows_with[tok.pad_token_id] = 0
    tok2 = copy.deepcopy(tok)
    tok2.eos_token = tok.convert_ids_to_tokens(int(rows_with.argmax()))
    return tok2


@pytest.mark.parametrize("stop_at", [48, None])
def test_stop_when_through_compactions_maps_rows_back(
    qwen2_eos: tuple, stop_at: int | None
) -> None:
    """Native engine, rows ending early (an EOS the model writes often, see
    :func:`_eos_in_many_rows`) and compacted out of small row buckets: ``ended`` is, at
    every check, each output row's EOS so far in the returned batch (a compacted row
    ended; the rows still decoding mapped back through ``rows_of``); a hook that never
    stops leaves the result bit for bit."""
    model, tok2 = qwen2_eos
    counts = ENDING
    ids = _ids(tok2, PROMPTS)
    eos = tok2.eos_token_id

    def engine() -> NativeEngine:
        return NativeEngine(model, tok2, 64, 1.0, 1.0, 60, row_bucket=2, check_every=4)

    torch.manual_seed(1)
    plain = engine()
    uncut = plain.generate_rows(ids, counts)
    hook = _Hook(stop_at)
    torch.manual_seed(1)
    hooked = engine()
    batch = hooked.generate_rows(ids, counts, stop_when=hook)
    assert hooked.stats["compactions"] >= 1  # rows were compacted out before the stop
    assert any(any(e) and not all(e) for e, _ in hook.calls), "degenerate: no row ended"
    for seen, at in hook.calls:
        assert at % 4 == 0 and at > 0 and len(seen) == sum(counts)
        assert seen == _has_eos_before(batch, eos, at)
    if stop_at is None:
        _assert_same(uncut, batch)
        assert plain.stats == hooked.stats
        return
    assert batch.completion_mask.shape[1] == stop_at == hook.calls[-1][1]
    assert batch.finished.tolist() == hook.calls[-1][0]
    assert not all(hook.calls[-1][0]), "degenerate test: every row ended before the stop"
    for row, fin in enumerate(batch.finished.tolist()):
        if not fin:
            assert bool(batch.completion_mask[row].all())
    width = batch.prompt_len + stop_at
    assert torch.equal(batch.input_ids, uncut.input_ids[:, :width])
    assert uncut.sampled_logp is not None and batch.sampled_logp is not None
    assert torch.equal(batch.sampled_logp, uncut.sampled_logp[:, :stop_at] * batch.completion_mask)


# ---------------------------------------------------------------- room (answered)


def _greedy_tails(engine, tok, prompts: list[str], n: int) -> list[torch.Tensor]:  # noqa: ANN001
    """Each prompt's uncut greedy completion of ``n`` tokens (none may end with EOS)."""
    full = engine.generate_rows(_ids(tok, prompts), [1] * len(prompts), greedy=True)
    assert not full.finished.any() and int(full.completion_mask.sum()) == n * len(prompts)
    tokens = full.input_ids[:, full.prompt_len :]
    assert all(len(set(t.tolist())) > 10 for t in tokens), "degenerate test: repeated text"
    return list(tokens)


def _check_room_rows(batch: RolloutBatch, tok, rooms: list[int]) -> None:  # noqa: ANN001
    """Every row ran to its room and no further: no EOS, ``finished`` False, completion
    and attention masks 1 up to the room and 0 after, padding after it, the text of the
    real tokens only."""
    p = batch.prompt_len
    for row, room in enumerate(rooms):
        width = batch.completion_mask.shape[1]
        assert batch.completion_mask[row].tolist() == [1] * room + [0] * (width - room)
        assert batch.attention_mask[row, p:].tolist() == batch.completion_mask[row].tolist()
        assert (batch.input_ids[row, p + room :] == tok.pad_token_id).all()
        assert not bool(batch.finished[row])
        real = batch.input_ids[row, p : p + room]
        assert batch.texts[row] == tok.decode(real, skip_special_tokens=True)


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_an_answered_prompt_gets_only_its_room(kind: str, qwen2: tuple) -> None:
    """``answered=[5]`` under the cap N: exactly N - 5 new tokens (no EOS), the tail of the
    uncut greedy decode, ending at the total cap; unfinished, masked after its room."""
    model, tok = qwen2
    n = 40
    engine = _engine(kind, model, tok, new=n)
    (tail,) = _greedy_tails(engine, tok, PROMPTS[:1], n)
    ids = _ids(tok, PROMPTS[:1])[0]
    batch = engine.generate_rows([ids + tail[:5].tolist()], [1], greedy=True, answered=[5])
    assert int(batch.completion_mask.sum()) == n - 5
    _check_room_rows(batch, tok, [n - 5])
    got = batch.input_ids[0, batch.prompt_len : batch.prompt_len + n - 5]
    assert torch.equal(got, tail[5:])  # 5 answered + 35 new = the whole capped answer
    if kind == "native":
        assert batch.sampled_logp is not None
        assert (batch.sampled_logp[0, n - 5 :] == 0).all()


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_mixed_rooms_in_one_call_each_stop_at_their_own(kind: str, qwen2: tuple) -> None:
    """``answered=[0, 20, 11]`` in one call (two rows each, a small row bucket so the native
    engine compacts the rows that reached their room out): each row stops at its own room,
    each continuation is the uncut greedy decode's tail, token for token, to the total cap;
    ``stop_when`` sees a row ended from the check where it reached its room."""
    model, tok = qwen2
    n, answered, every = 40, [0, 20, 11], 8
    engine = _engine(kind, model, tok, new=n, check_every=every)
    if kind == "native":
        engine.row_bucket = 2
    tails = _greedy_tails(engine, tok, PROMPTS, n)
    ids = [i + t[:a].tolist() for i, t, a in zip(_ids(tok, PROMPTS), tails, answered, strict=True)]
    hook = _Hook(None)
    batch = engine.generate_rows(ids, [2, 2, 2], greedy=True, stop_when=hook, answered=answered)
    rooms = [n - a for a in answered for _ in range(2)]
    _check_room_rows(batch, tok, rooms)
    for row, room in enumerate(rooms):
        got = batch.input_ids[row, batch.prompt_len : batch.prompt_len + room]
        assert torch.equal(got, tails[row // 2][n - room :])
    assert [t for _, t in hook.calls] == [8, 16, 24, 32]
    for ended, t in hook.calls:
        assert ended == [t >= room for room in rooms]
    assert any(any(e) and not all(e) for e, _ in hook.calls), "degenerate: no room reached"
    if kind == "native":
        assert engine.stats["compactions"] >= 1  # the rows at their room were compacted out


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_answered_none_is_all_zeros_bit_for_bit(kind: str, qwen2_eos: tuple) -> None:
    """Sampled, rows ending early: ``answered`` None, all zeros and not given are one
    rollout (and ``generate``'s, pinned above)."""
    model, tok = qwen2_eos
    engine = _engine(kind, model, tok, new=40, check_every=8)
    ids = _ids(tok, PROMPTS)
    got = []
    for answered in ("absent", None, [0, 0, 0]):
        torch.manual_seed(6)
        kw = {} if answered == "absent" else {"answered": answered}
        got.append(engine.generate_rows(ids, ENDING, **kw))
    assert got[0].finished.any(), "degenerate test: no row ended"
    _assert_same(got[0], got[1])
    _assert_same(got[0], got[2])


def test_to_batch_masks_a_row_at_its_room_even_where_pad_is_eos() -> None:
    """A row stopped by its room has no EOS; its padding after the room is masked and,
    where the pad id is the EOS id, does not read as an ending."""
    from types import SimpleNamespace

    from grpo_hpc.train.rollout.types import to_batch

    tok = SimpleNamespace(eos_token_id=0, pad_token_id=0, batch_decode=lambda ids, **_: [
        " ".join(str(i) for i in row.tolist() if i) for row in ids
    ])  # fmt: skip
    out = torch.tensor([[9, 5, 6, 0, 0], [9, 5, 6, 7, 8], [9, 5, 0, 0, 0]])
    batch = to_batch(out, torch.ones(3, 1, dtype=torch.long), 1, tok, torch.tensor([2, 4, 4]))
    assert batch.completion_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch.finished.tolist() == [False, False, True]  # row 2: EOS within its room
    assert batch.texts == ["5 6", "5 6 7 8", "5"]


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_rows_without_a_prompt_or_a_count_are_refused(kind: str, llama: tuple) -> None:
    model, tok = llama
    engine = _engine(kind, model, tok)
    for prompt_ids, counts in (([], []), ([[5, 6]], [1, 1]), ([[5, 6]], [0]), ([[5], []], [1, 1])):
        with pytest.raises(ValueError, match="generate_rows"):
            engine.generate_rows(prompt_ids, counts)


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_answered_without_room_or_past_its_prompt_is_refused(kind: str, llama: tuple) -> None:
    model, tok = llama
    engine = _engine(kind, model, tok, new=8)
    for answered in ([8], [9], [-1], [3], [0, 0]):  # no room, negative, the whole prompt
        with pytest.raises(ValueError, match="generate_rows"):
            engine.generate_rows([[5, 6, 7]], [1], answered=answered)


@pytest.mark.parametrize("carry", [False, True])
def test_a_cache_sized_for_carried_answers_never_regrows(qwen2: tuple, carry: bool) -> None:
    """Partial rollouts hand the generator's engine prompts that end with up to a cap's
    tokens of answer: with ``carry_answers()`` its caches are sized for them from the start
    (one cache for the fresh rollout and its continuation); without, the continuation's
    longer prompt regrows the cache (and, on a GPU, captures every graph again)."""
    model, tok = qwen2
    ids = _ids(tok, PROMPTS)
    longest = max(len(i) for i in ids)
    engine = NativeEngine(model, tok, 64, 1.0, 1.0, 60, max_prompt_tokens=longest)
    if carry:
        engine.carry_answers()
    fresh = engine.generate_rows(ids, [2] * len(ids))
    p = fresh.prompt_len
    answer = fresh.input_ids[0, p : p + 60].tolist()  # the first row, 60 tokens in
    # past the first cache's slack (its capacity rounds up to a multiple of 64 slots)
    assert longest + len(answer) + 64 > -(-(longest + 64) // 64) * 64
    start = fresh.attention_mask[0, :p].nonzero()[0].item()
    continued = fresh.input_ids[0, start:p].tolist() + answer
    engine.generate_rows([continued], [1], answered=[len(answer)])
    assert engine.totals["caches"] == (1 if carry else 2)


def test_batch_rows_decodes_every_round_in_one_workspace(qwen2_eos: tuple) -> None:
    """Partial rollouts' rounds vary in rows; with ``batch_rows`` (the pool's rows) each
    round decodes in the one workspace of that many rows (one KV cache, one set of CUDA
    graphs), the extra rows padding: greedy, every real row completes as it does in a
    batch of its own size, rows ending early and compacted out included."""
    model, tok2 = qwen2_eos
    ids = _ids(tok2, PROMPTS)
    rounds = [ENDING, MIXED, [1, 1, 1]]  # 12, 6 and 3 rows

    def engine(**kw: int) -> NativeEngine:
        return NativeEngine(model, tok2, 64, 1.0, 1.0, 60, row_bucket=2, check_every=4, **kw)

    plain, padded = engine(), engine(batch_rows=16)
    for counts in rounds:
        want = plain.generate_rows(ids, counts, greedy=True)
        got = padded.generate_rows(ids, counts, greedy=True)
        # the tokens bit for bit; the log-probs to rounding (other batch shapes, other
        # matmul blockings)
        for name in ("input_ids", "attention_mask", "completion_mask", "finished"):
            assert torch.equal(getattr(want, name), getattr(got, name)), name
        torch.testing.assert_close(got.sampled_logp, want.sampled_logp)
        assert padded.stats["compactions"] >= 1  # the padding went at the first check
    assert padded.totals["caches"] == 1 and list(padded.spaces) == [16]
    assert plain.totals["caches"] == len(rounds)  # what each round cost before: its own
