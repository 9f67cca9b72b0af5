"""Partial rollouts (``rollout.partial_pool``): a round of generation stops once a step's
worth of groups is complete, and the answers still running are continued in the next
round by the next weights.

Why: a step's batch waits for its longest answer. On one H200 the wait for the longest row
was 53 % (Qwen2.5-1.5B, 4,096 tokens) to 78 % (SmolLM2 on GSM8K) of a synchronous step
(bench/results/LOG-speed.md, 2026-12-05), and overlapping generation with the update
cannot hide a wait longer than the update. Here the generator keeps the prompts of
``P`` steps in flight (the *pool*) and decodes all their unfinished rows together; it stops
the round at the first host check where ``want`` groups are complete, trains those, and
carries the others over, as AReaL's interruptible generation and slime's or APRIL's
partial rollouts do.

What a continued row is: its prompt followed by the tokens it had, prefilled again by the
new weights (the old K/V were of other weights), then decoded on. Each token keeps the
log-prob of the weights that sampled it, so the update's token-level importance weights
(``algo.tis_cap``) correct each token for its own weights.

Bounds (pure functions below, table-tested): a group is as stale as its first token
(``version``: the weights of the round that started it). Trained at step ``s`` it is
``s - version`` updates stale. In the round for step ``s`` a group that, left unfinished,
would train at ``s + 1`` or later beyond the bound (``s + 1 - version > k``) *must finish*
in this round: the round does not stop before it has. A complete group not chosen waits
for the next step, oldest first; one that would then be too stale is dropped (counted).

Determinism: the pool, its order and every decision are functions of the tokens, which are
functions of the seed (each round draws from ``rollout_seed(seed, step, rank)``); the
round's stop is judged at the engine's host checks (every ``check_every`` tokens), not by
time. The pool is saved in each rank's checkpoint (``rng-rank<R>.pt``), so a resumed run
continues the same answers.

Rollback: by default the pipeline drops the pool and trains synchronously from then on
(``training.rollback_synchronous``; the prompts in flight are not trained); with that off,
flights of an abandoned line restart from their prompt under the current weights (the
prompts are kept: nothing is skipped in the data order).
"""

from __future__ import annotations

import time
from array import array
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from grpo_hpc.core.progress import TrainState
from grpo_hpc.train.rewards.verifier import VERIFIER
from grpo_hpc.train.rollout.collect import Collected, Collector
from grpo_hpc.train.rollout.types import GenerationAborted, RolloutBatch, left_padded, to_batch


@dataclass
class Flight:
    """One group (a prompt and its ``G`` rows) in the pool."""

    index: int
    """The problem's index in the training set."""
    prompt: list[int]
    """The rendered prompt's token ids."""
    rows: list[list[int]]
    """Each row's completion tokens so far."""
    logp: list[list[float]]
    """Each token's log-prob under the weights that sampled it."""
    eos: list[bool]
    """Each row: ended with EOS."""
    version: int = -1
    """The weights of its first tokens (-1: not decoded yet)."""
    lineage: int = 0
    """The run's rollbacks when it was started."""
    order: int = 0
    """Its place in the draw (ties between groups of one version)."""
    spans: list[int] = field(default_factory=list)
    """Each row: the rounds that decoded it (more than one: a continued answer)."""

    def ended(self, cap: int) -> list[bool]:
        """Each row: finished (EOS, or the cap reached)."""
        return [e or len(r) >= cap for e, r in zip(self.eos, self.rows, strict=True)]

    def complete(self, cap: int) -> bool:
        return all(self.ended(cap))

    def restart(self, lineage: int) -> None:
        """Back to its prompt (a rollback abandoned the weights that started it)."""
        g = len(self.rows)
        self.rows, self.logp, self.eos = [[] for _ in range(g)], [[] for _ in range(g)], [False] * g
        self.version, self.lineage, self.spans = -1, lineage, [0] * g


# ---------------------------------------------------------------------- decisions (pure)
def must_finish(version: int, step: int, k: int) -> bool:
    """Whether a group started by ``version`` must finish in the round for ``step``: left
    unfinished it would train at ``step + 1`` or later, more than ``k`` updates stale. A
    group not yet started (``version`` -1) starts now, at the round's weights."""
    return version >= 0 and step + 1 - version > k


def round_over(complete: list[bool], must: list[bool], want: int) -> bool:
    """Whether a round may stop: ``want`` groups complete and every group that must
    finish has."""
    done_must = all(c for c, m in zip(complete, must, strict=True) if m)
    return done_must and sum(complete) >= want


def choose(versions: list[int], orders: list[int], complete: list[bool], want: int) -> list[int]:
    """Which groups train (indices): the ``want`` complete ones started earliest (by
    version, then draw order), in pool order."""
    ready = [i for i, c in enumerate(complete) if c]
    ready.sort(key=lambda i: (versions[i], orders[i]))
    return sorted(ready[:want])


def expired(version: int, step: int, k: int) -> bool:
    """Whether a group started by ``version`` is too stale to train at ``step``."""
    return version >= 0 and step - version > k


# ---------------------------------------------------------------------- the pool
@dataclass
class RoundReport:
    """What one round made besides its batch."""

    versions: list[int]
    """The first-token weights of each group trained, in batch order."""
    continued: int = 0
    """Rows trained whose tokens came from more than one round."""
    dropped: int = 0
    """Groups dropped as too stale by the round."""
    pool: int = 0
    """Groups in flight after the round."""
    decoded_rows: int = 0
    """Rows the round decoded."""


@dataclass
class PartialPool:
    """The groups in flight of one rank, and the rounds that advance them."""

    steps: int
    """``rollout.partial_pool``: the pool holds the prompts of this many steps."""
    k: int
    """``algo.max_staleness``."""
    flights: list[Flight] = field(default_factory=list)
    drawn: int = 0
    """Groups drawn so far (the next one's ``order``)."""

    # ------------------------------------------------------------------ one round
    def make(
        self,
        collector: Collector,
        step: int,
        version: int,
        lineage: int,
        behaviour: Any,
        device: torch.device,
    ) -> tuple[Collected, RoundReport]:
        """The batch of ``step`` by a round of the weights ``version`` (the engine's):
        :meth:`prepare`, then :meth:`advance` (one process; a split run's trainer prepares
        and its generator advances)."""
        held, drawn = self.prepare(collector, lineage)
        try:
            return self.advance(collector, step, version, behaviour, device)
        except GenerationAborted:
            # A stop cut a round made on the main thread (inside the engine, before any
            # flight's tokens changed): the trainer restores the step's start, the sampler's
            # position included, so the groups drawn for this round go too, or the
            # checkpoint would hold groups drawn from a position it then draws again. (A
            # flight restarted by prepare stays restarted: this line would restart it anyway.)
            del self.flights[held:]
            self.drawn = drawn
            raise

    def prepare(self, collector: Collector, lineage: int) -> tuple[int, int]:
        """Before a round: the flights of an abandoned line back to their prompts, and the
        pool topped up with whole steps' prompts from ``collector``'s sampler (the data
        order's side of a round). Returns the flights and draws before the top-up (what
        undoes it)."""
        for f in self.flights:
            if f.lineage != lineage:
                f.restart(lineage)
        held, drawn = len(self.flights), self.drawn
        self._top_up(collector, collector.per_rank, collector.cfg.rollout.num_generations, lineage)
        return held, drawn

    def advance(
        self,
        collector: Collector,
        step: int,
        version: int,
        behaviour: Any,
        device: torch.device,
    ) -> tuple[Collected, RoundReport]:
        """A round of the weights ``version`` (``collector``'s engine's) over the pool
        :meth:`prepare` filled: the batch of ``step``, ``collector.per_rank`` complete
        groups, scored against ``collector.train_set[index]``. ``behaviour(batch)``: the
        sampled tokens' log-probs under those weights, where the engine reports none (HF
        generate); ``device``: where the batch goes (the policy's)."""
        want = collector.per_rank
        cap = collector.engine.max_new_tokens
        VERIFIER.take_stats()
        t = time.monotonic()
        decoded = self._decode(collector, step, version, cap, want, behaviour)
        generate_s = time.monotonic() - t
        picked = choose(
            [f.version for f in self.flights],
            [f.order for f in self.flights],
            [f.complete(cap) for f in self.flights],
            want,
        )
        chosen = [self.flights[i] for i in picked]
        taken = set(picked)
        left = [f for i, f in enumerate(self.flights) if i not in taken]
        # A complete group left over trains at the next step at the earliest.
        self.flights = [
            f for f in left if not (f.complete(cap) and expired(f.version, step + 1, self.k))
        ]
        collector._say(TrainState.SCORING)
        t = time.monotonic()
        batch = stitch(chosen, collector.tok, device)
        problems = [collector.train_set[f.index] for f in chosen]
        scored = collector.score(batch, problems)
        out = Collected([scored], generate_s, time.monotonic() - t)
        out.verify_items, out.verify_slowest_s = VERIFIER.take_stats()
        report = RoundReport(
            versions=[f.version for f in chosen],
            continued=sum(n > 1 for f in chosen for n in f.spans),
            dropped=len(left) - len(self.flights),
            pool=len(self.flights),
            decoded_rows=decoded,
        )
        return out, report

    def _top_up(self, collector: Collector, want: int, g: int, lineage: int) -> None:
        """Draw whole steps' prompts (this rank's share, as a synchronous step draws them)
        while the pool has room for one more step's."""
        while len(self.flights) + want <= want * self.steps:
            indices = collector.take_indices()
            texts = collector.prompt_texts([collector.train_set[i] for i in indices])
            for index, text in zip(indices, texts, strict=True):
                ids = collector.tok(text, add_special_tokens=False).input_ids
                empty: list[list] = [[] for _ in range(g)]
                self.flights.append(
                    Flight(index, list(ids), empty, [[] for _ in range(g)], [False] * g,
                           lineage=lineage, order=self.drawn, spans=[0] * g)
                )  # fmt: skip
                self.drawn += 1

    def _decode(
        self, collector: Collector, step: int, version: int, cap: int, want: int, behaviour: Any
    ) -> int:
        """One round over every unfinished row of the pool; returns the rows decoded."""
        prompts, counts, where = [], [], []  # where: per engine row, (flight, row)
        answered: list[int] = []  # per prompt: its trailing ids that are already answer
        for fi, f in enumerate(self.flights):
            todo = [j for j, e in enumerate(f.ended(cap)) if not e]
            if not todo:
                continue
            if len(todo) == len(f.rows) and not any(f.rows):  # fresh: one prefill, G rows
                prompts.append(f.prompt)
                counts.append(len(todo))
                answered.append(0)
            else:  # continued: each row its own prompt (its tokens so far)
                prompts += [f.prompt + f.rows[j] for j in todo]
                counts += [1] * len(todo)
                answered += [len(f.rows[j]) for j in todo]
            where += [(fi, j) for j in todo]
        if not where:
            return 0
        must = [must_finish(f.version, step, self.k) for f in self.flights]

        def stop_when(ended: list[bool], t: int) -> bool:
            """At a host check, ``t`` tokens in: a row is open until EOS or its cap (the
            engine's ``ended`` says both: the room it was given is the cap less its
            tokens; the cap test stays as a guard); a group is complete with no open row
            (the groups not decoded are complete)."""
            open_rows = [0] * len(self.flights)
            for (fi, j), e in zip(where, ended, strict=True):
                if not (e or len(self.flights[fi].rows[j]) + t >= cap):
                    open_rows[fi] += 1
            return round_over([o == 0 for o in open_rows], must, want)

        # ``answered``: each row's total answer stays under the cap inside the engine, which
        # ends a continued row at its room instead of decoding it on to the cap.
        batch = collector.engine.generate_rows(
            prompts, counts, stop_when=stop_when, answered=answered
        )
        logp = batch.sampled_logp if batch.sampled_logp is not None else behaviour(batch)
        lengths = batch.completion_mask.sum(1).tolist()
        finished = batch.finished.tolist() if batch.finished is not None else [False] * len(where)
        p = batch.prompt_len
        for r, (fi, j) in enumerate(where):
            f = self.flights[fi]
            room = cap - len(f.rows[j])
            # The engine gave the row at most its room; min() is a guard that keeps the
            # cap whatever an engine returns.
            n = min(int(lengths[r]), room)
            f.rows[j] += batch.input_ids[r, p : p + n].tolist()
            f.logp[j] += logp[r, :n].tolist()
            f.eos[j] = bool(finished[r]) and int(lengths[r]) <= room
            f.spans[j] += 1
        for fi in {fi for fi, _ in where}:
            if self.flights[fi].version < 0:
                self.flights[fi].version = version
        return len(where)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The pool as plain values, each row's tokens and log-probs packed as bytes (what
        a checkpoint keeps, and what a split run's trainer and generator send each other
        twice a step: 128 rows of 4,096 tokens make a hand-over of 0.12 s packed, 0.78 s
        as lists, on a 2-core CPU: bench/results/pool_transfer_cpu_2026-12-05.json)."""
        return {"flights": [_packed(f) for f in self.flights], "drawn": self.drawn}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        state = state or {}
        self.flights = [_unpacked(f) for f in state.get("flights", [])]
        self.drawn = int(state.get("drawn", 0))


TOKEN, LOGP = "q", "d"
"""The ``array`` codes a flight's rows are packed in: int64 token ids, float64 log-probs
(a Python float whole: bit for bit whatever dtype the engine reported)."""


def _packed(f: Flight) -> dict[str, Any]:
    d = asdict(replace(f, rows=[], logp=[]))
    d["rows"] = [array(TOKEN, r).tobytes() for r in f.rows]
    d["logp"] = [array(LOGP, lp).tobytes() for lp in f.logp]
    return d


def _unpacked(d: dict[str, Any]) -> Flight:
    """A flight from :func:`_packed` (or from a pool saved as lists, before packing)."""

    def values(code: str, v: bytes | list) -> list:
        if isinstance(v, list):
            return v
        a = array(code)
        a.frombytes(v)
        return a.tolist()

    rows = [values(TOKEN, r) for r in d["rows"]]
    logp = [values(LOGP, lp) for lp in d["logp"]]
    return Flight(**(d | {"rows": rows, "logp": logp}))


def stitch(flights: list[Flight], tok: Any, device: torch.device) -> RolloutBatch:
    """The batch of complete groups: each row its left-padded prompt, then its completion
    (right-padded), as a rollout of one round returns it; the log-probs each token was
    sampled with."""
    rows = [(f.prompt, r, lp) for f in flights for r, lp in zip(f.rows, f.logp, strict=True)]
    prompts, pmask = left_padded([p for p, _, _ in rows], tok.pad_token_id)
    cols = max(1, max(len(r) for _, r, _ in rows))
    out = torch.full((len(rows), cols), tok.pad_token_id, dtype=torch.long)
    logp = torch.zeros((len(rows), cols), dtype=torch.float32)
    for i, (_, row, lp) in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        logp[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
    ids = torch.cat([prompts, out], 1).to(device)
    batch = to_batch(ids, pmask.to(device), prompts.shape[1], tok)
    batch.sampled_logp = logp.to(device) * batch.completion_mask
    return batch
