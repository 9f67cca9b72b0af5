"""The partial-rollout pool's rounds (train/rollout/partial.py) with a scripted engine: each
row ends after a length drawn from a heavy tail (half the rows within 12 tokens, the rest
run on to near the cap), so that groups stay unfinished for several rounds unless the
bound makes them finish. The real engines and the real trainer run the pool in
tests/e2e/test_async_partial.py; this pins what the pool decides over many rounds: no
group trains staler than the bound, every group trained is complete and whole, the
tokens of a continued row are its rounds' in order with each round's log-probs, a saved
pool resumes the same rounds, and a rollback restarts the groups in flight."""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from grpo_hpc.config.schema import Config
from grpo_hpc.memory.estimate import PREFILL_TOKENS
from grpo_hpc.tasks.problems import Sampler
from grpo_hpc.train.distributed.dist import DistInfo
from grpo_hpc.train.rewards import toy
from grpo_hpc.train.rollout.collect import Collector
from grpo_hpc.train.rollout.partial import PartialPool
from grpo_hpc.train.rollout.types import (
    GenerationAborted,
    RolloutBatch,
    left_padded,
    repeat_rows,
    rooms,
    to_batch,
)
from grpo_hpc.train.setup.models import char_tokenizer

CAP, CHECK = 64, 8
TOKEN = 20  # what every scripted row writes before its EOS


@dataclass
class ScriptedEngine:
    """Rows end after a drawn number of new tokens (EOS the last); each call's rows draw
    from ``rng`` in order; the log-prob of each token is the call's number (so that a
    stitched row shows which round wrote each token)."""

    tok: object
    max_new_tokens: int = CAP
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    calls: int = 0
    asked: list = field(default_factory=list)
    """Each call's prompts, counts and ``answered``."""

    def draw(self) -> int:
        return self.rng.randint(1, 12) if self.rng.random() < 0.5 else self.rng.randint(40, 90)

    def generate_rows(
        self, prompt_ids, counts, *, greedy=False, stop_when=None, answered=None
    ) -> RolloutBatch:  # noqa: ANN001, E501
        self.calls += 1
        self.asked.append((list(prompt_ids), list(counts), answered))
        ids, mask = left_padded(prompt_ids, self.tok.pad_token_id)
        ids, mask = repeat_rows(ids, counts), repeat_rows(mask, counts)
        room = rooms(answered, counts, self.max_new_tokens).tolist()
        # As the real engines: a row ends at its EOS or, drawn longer than its room, at
        # the room without one.
        draws = [self.draw() for _ in room]
        ends = [min(d, rm) for d, rm in zip(draws, room, strict=True)]
        eos = [d <= rm for d, rm in zip(draws, room, strict=True)]
        t = self.max_new_tokens
        for check in range(CHECK, self.max_new_tokens, CHECK):
            if all(e <= check for e in ends):
                t = check
                break
            if stop_when is not None and stop_when([e <= check for e in ends], check):
                t = check
                break
        cols = torch.full((ids.shape[0], t), self.tok.pad_token_id, dtype=torch.long)
        for r, e in enumerate(ends):
            cols[r, : min(e, t)] = TOKEN
            if eos[r] and e <= t:
                cols[r, e - 1] = self.tok.eos_token_id
        out = torch.cat([ids, cols], 1)
        batch = to_batch(out, mask, ids.shape[1], self.tok, torch.tensor(room))
        batch.sampled_logp = torch.full(cols.shape, -float(self.calls)) * batch.completion_mask
        return batch


def _collector(engine: ScriptedEngine, prompts: int, g: int) -> Collector:
    cfg = Config()
    cfg.rollout.prompts_per_step, cfg.rollout.num_generations = prompts, g
    cfg.rollout.max_new_tokens = CAP
    cfg.reward.correctness = 0.0
    cfg.reward.format = 0.0
    train = [{"question": f"{i}+{i}=", "gold": str(2 * i)} for i in range(50)]
    custom = {"digit_fraction": toy.digit_fraction}
    collector = Collector(cfg, DistInfo(), engine.tok, train, Sampler(50, 1), custom, None, engine)
    collector.ahead = True  # no progress file here: as the decode thread, say nothing
    return collector


def _rounds(pool: PartialPool, collector: Collector, steps: range) -> list[tuple[int, list]]:
    """Round ``s`` made as the thread makes it at k >= 1 (version ``s - 1``; step 0 now)."""
    out = []
    for s in steps:
        got, report = pool.make(collector, s, max(0, s - 1), 0, None, torch.device("cpu"))
        out.append((s, report, got.scored[0].batch))
    return out


@pytest.mark.parametrize(("k", "steps"), [(2, 2), (3, 2), (3, 3)])
def test_no_group_trains_staler_than_the_bound(k: int, steps: int) -> None:
    engine = ScriptedEngine(char_tokenizer())
    collector = _collector(engine, prompts=3, g=4)
    pool = PartialPool(steps, k)
    made = _rounds(pool, collector, range(40))
    continued = 0
    for s, report, batch in made:
        assert len(report.versions) == 3  # a step's groups, every round
        assert all(0 <= s - v <= k for v in report.versions), (s, report)
        assert batch.input_ids.shape[0] == 12
        # every row trained is complete: EOS, or the cap reached
        lengths = batch.completion_mask.sum(1)
        assert all(bool(f) or int(n) == CAP for f, n in zip(batch.finished, lengths, strict=True))
        continued += report.continued
        assert report.dropped == 0
    assert continued > 20, "few answers were continued: the test proved little"
    assert max(s - v for s, r, _ in made for v in r.versions) == k  # the bound is reached


def test_a_continued_row_holds_each_rounds_tokens_with_that_rounds_log_probs() -> None:
    engine = ScriptedEngine(char_tokenizer())
    collector = _collector(engine, prompts=2, g=4)
    pool = PartialPool(2, 2)
    seen = 0
    for _, _report, batch in _rounds(pool, collector, range(20)):
        p = batch.prompt_len
        for r in range(batch.input_ids.shape[0]):
            n = int(batch.completion_mask[r].sum())
            logp = batch.sampled_logp[r, :n].tolist()
            # rounds in order: the log-probs (minus the round's number) never increase
            assert logp == sorted(logp, reverse=True), logp
            seen += len(set(logp)) > 1
            tokens = batch.input_ids[r, p : p + n].tolist()
            body = tokens[:-1] if batch.finished[r] else tokens
            assert set(body) <= {TOKEN}, tokens  # no padding inside a stitched answer
    assert seen > 5


def test_the_pool_gives_each_continued_row_its_answer_so_far_as_answered() -> None:
    """``answered``: 0 for a fresh group's prompt (its G rows), the row's tokens so far for
    a continued row (its own prompt); the engine then keeps every answer under the cap."""
    engine = ScriptedEngine(char_tokenizer())
    collector = _collector(engine, prompts=2, g=4)
    _rounds(PartialPool(2, 2), collector, range(12))
    continued = 0
    for prompts, counts, answered in engine.asked:
        assert answered is not None and len(answered) == len(prompts)
        for ids, n, a in zip(prompts, counts, answered, strict=True):
            if a == 0:
                assert n == 4  # a fresh group: one prompt, its G rows
            else:  # an answer so far, of the scripted token, below the cap
                assert n == 1 and ids[-a:] == [TOKEN] * a
                assert a < CAP
                continued += 1
    assert continued > 5, "few rows were continued: the test proved little"


def test_a_saved_pool_resumes_the_same_rounds() -> None:
    def run(split: int | None) -> list[torch.Tensor]:
        engine = ScriptedEngine(char_tokenizer())
        collector = _collector(engine, prompts=2, g=4)
        pool = PartialPool(2, 2)
        out = [b.input_ids for _, _, b in _rounds(pool, collector, range(split or 12))]
        if split is not None:  # a new process: the pool, the sampler and the engine's stream
            state, sampler, rng = pool.state_dict(), collector.sampler.state_dict(), engine.rng
            engine2 = ScriptedEngine(char_tokenizer(), rng=rng, calls=engine.calls)
            collector = _collector(engine2, prompts=2, g=4)
            collector.sampler.load_state_dict(sampler)
            pool = PartialPool(2, 2)
            pool.load_state_dict(state)
            out += [b.input_ids for _, _, b in _rounds(pool, collector, range(split, 12))]
        return out

    whole, resumed = run(None), run(5)
    assert len(whole) == len(resumed) == 12
    assert all(torch.equal(a, b) for a, b in zip(whole, resumed, strict=True))


def test_a_rollback_restarts_the_groups_in_flight_and_keeps_their_prompts() -> None:
    engine = ScriptedEngine(char_tokenizer())
    collector = _collector(engine, prompts=2, g=4)
    pool = PartialPool(2, 2)
    _rounds(pool, collector, range(3))
    before = [(f.index, f.order) for f in pool.flights]
    assert any(any(f.rows) for f in pool.flights), "nothing in flight: the test proves nothing"
    _, report = pool.make(collector, 3, 3, 1, None, torch.device("cpu"))  # lineage 1
    # the step trained groups of the current weights only; the groups in flight came back
    # to their prompts (lineage 1), and no prompt drawn before was lost
    assert report.versions == [3, 3] and report.dropped == 0
    assert all(f.lineage == 1 for f in pool.flights)
    left = {f.index for f in pool.flights}
    trained = [i for i, _ in before if i not in left]
    assert len(trained) <= 2


def test_a_round_cut_by_a_stop_leaves_the_pool_as_it_was() -> None:
    """A stop signal cuts a round made on the main thread (the first step, after a
    rollback): the trainer restores the sampler to the step's start, and the pool must go
    back with it (groups drawn in the cut round would be drawn again)."""
    engine = ScriptedEngine(char_tokenizer())
    collector = _collector(engine, prompts=2, g=4)
    pool = PartialPool(2, 2)
    _rounds(pool, collector, range(3))
    before, sampler = pool.state_dict(), collector.sampler.state_dict()

    def cut(*args: object, **kwargs: object) -> RolloutBatch:
        raise GenerationAborted()

    engine.generate_rows = cut  # type: ignore[method-assign]
    with pytest.raises(GenerationAborted):
        pool.make(collector, 3, 3, 0, None, torch.device("cpu"))
    assert pool.state_dict() == before
    assert collector.sampler.state_dict() != sampler  # drawn, and the trainer restores it


@pytest.mark.parametrize("pool", [0, 2])
def test_the_generators_engine_prefills_in_chunks_only_for_partial_rollouts(
    tmp_path: Path, pool: int
) -> None:
    """A partial pool's generator gets continued answers as prompts: its native engine
    prefills them in chunks of ``PREFILL_TOKENS`` (the budget the memory estimate counts);
    every other engine prefills in one batch, as every figure so far was measured. Its
    rounds all decode in one batch of the pool's rows (``batch_rows``)."""
    from grpo_hpc.train.rollout.native.engine import NativeEngine
    from grpo_hpc.train.rollout.pipeline import RolloutPipeline
    from grpo_hpc.train.setup.models import LlamaShape, load_model_and_tokenizer, save_random_llama

    save_random_llama(tmp_path / "m", LlamaShape(32, 1, 2, 1, 64), seed=0)
    model, tok = load_model_and_tokenizer(tmp_path / "m", "sdpa", torch.device("cpu"))
    policy = NativeEngine(model, tok, CAP, 1.0, 1.0, 60)
    collector = _collector(ScriptedEngine(tok), prompts=2, g=4)
    collector.engine = policy
    collector.cfg.algo.max_staleness = 2
    collector.cfg.rollout.partial_pool = pool

    def make(shadow, abort, tick):  # noqa: ANN001, ANN202 - the trainer's _build_engine
        return NativeEngine(shadow, tok, CAP, 1.0, 1.0, 60, abort=abort, tick=tick)

    pipe = RolloutPipeline(collector, model, make, lambda: False, contextlib.nullcontext)
    assert pipe.now.engine.prefill_tokens == (PREFILL_TOKENS if pool else 0)
    # every round in one batch of the pool's rows: 2 prompts x 2 steps x G 4
    assert pipe.now.engine.batch_rows == (16 if pool else 0)
    assert policy.prefill_tokens == 0 and policy.batch_rows == 0
