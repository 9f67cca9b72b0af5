"""One step's rollouts on this rank: generate completions for its share of the step's
prompts, score them, and with dynamic sampling (DAPO) resample while too few groups carry
a learning signal.

Every rank reaches one collective after each rollout, which decides for all of them:
abandon the step (some rank was stopped mid-generation), resample, or go on. A rank that
aborted alone used to start saving while the others went on into the step's next
collective, and both hung.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_hpc.config.schema import Config
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.core.progress import TrainState
from grpo_hpc.tasks import problems as data
from grpo_hpc.train.algo.advantages import informative_groups
from grpo_hpc.train.algo.batching import Scored
from grpo_hpc.train.distributed import dist
from grpo_hpc.train.measure.profiling import phase
from grpo_hpc.train.measure.tracking import Tracker
from grpo_hpc.train.rewards import functions as rewards
from grpo_hpc.train.rewards.code import code_workers
from grpo_hpc.train.rewards.streaming import StreamingJudge, completion_text
from grpo_hpc.train.rewards.verifier import VERIFIER
from grpo_hpc.train.rollout import per_group
from grpo_hpc.train.rollout.engines import GenerationAborted, RolloutBatch
from grpo_hpc.train.rollout.types import row_range

ABORT, RESAMPLE, DONE = 2.0, 1.0, 0.0
"""Each rank's vote after a rollout; the all-reduced maximum is the verdict."""


@dataclass
class Collected:
    """What one step's rollouts produced on this rank."""

    scored: list[Scored]
    """One entry per rollout round (more than one only with dynamic sampling)."""
    generate_s: float
    """Seconds spent generating, over all rounds."""
    score_s: float
    """Seconds spent computing rewards, over all rounds."""
    verify_items: int = 0
    """Completions math-verify judged (the rest were settled by the pre-judge)."""
    verify_slowest_s: float = 0.0
    """The longest math-verify took on any one of them."""
    verify_streamed: int = 0
    """Of those, the ones judged while the rollout was still decoding (guesses for rows
    still decoding included)."""
    streamed_rows: int = 0
    """Completions handed to scoring before their rollout ended (rollout.stream_scoring)."""

    def verify_counts(self) -> tuple[float, float, float, float, float]:
        """For the step report: math-verify items, the slowest one's seconds, items judged
        while decoding, rows handed over, and items judged after generation (what scoring
        still waited for)."""
        after = self.verify_items - self.verify_streamed
        return (
            self.verify_items,
            self.verify_slowest_s,
            self.verify_streamed,
            self.streamed_rows,
            after,
        )


@dataclass
class Collector:
    """Generates and scores a step's groups for one rank (the trainer's rollout half)."""

    cfg: Config
    """The run's resolved configuration."""
    info: dist.DistInfo
    """This rank's place in the job."""
    tok: Any
    """The policy's tokenizer (prompts are rendered with its chat template)."""
    train_set: list[dict]
    """Training problems ({"question", "gold", ...})."""
    sampler: data.Sampler
    """Which problems each step takes (its state is checkpointed by the trainer)."""
    custom: dict[str, Callable]
    """User reward functions from reward.custom."""
    tracker: Tracker
    """Progress file and heartbeat."""
    engine: Any
    """The rollout engine (native or HF generate)."""
    _draw: int = field(default=0, init=False, repr=False)
    """Where in the data order this round's prompts were drawn from (``seed_per_group``)."""
    ahead: bool = False
    """Generating an asynchronous run's next steps in a thread while the update runs
    (rollout/pipeline.py): the progress file's state is left alone (the trainer says
    TRAINING), and nothing is agreed with the other ranks (a collective from this thread
    would meet the update's; nothing can cut this rollout, and it runs one round)."""

    @property
    def per_rank(self) -> int:
        return self.cfg.rollout.prompts_per_step // self.info.world_size

    def collect(self) -> Collected:
        """Generate and score; with dynamic sampling, more rounds while groups are flat.
        Raises GenerationAborted on every rank when any rank was stopped mid-generation."""
        cfg = self.cfg
        out = Collected([], 0.0, 0.0)
        VERIFIER.take_stats()  # from here on: this step's judging (not an evaluation's)
        rounds = 1 + (cfg.rollout.max_resample_rounds if cfg.rollout.dynamic_sampling else 0)
        for r in range(rounds):
            mine = self._take()
            t = time.monotonic()
            batch, stream = self._generate(mine)  # None: a stop reached this rank (vote first)
            out.generate_s += time.monotonic() - t
            vote = ABORT
            if batch is not None:
                self._say(TrainState.SCORING)
                t = time.monotonic()
                with phase("score"):
                    ahead = stream.finish() if stream else None  # the head start's rest
                    out.scored.append(self.score(batch, mine, ahead))
                out.score_s += time.monotonic() - t
                out.verify_streamed += len(ahead.verdicts) if ahead else 0
                out.streamed_rows += stream.rows if stream else 0
                have = sum(int(informative_groups(s.rewards).sum()) for s in out.scored)
                vote = RESAMPLE if have < self.per_rank and r + 1 < rounds else DONE
            with phase("vote"):  # this rank waits here for the others' rollouts
                verdict = vote if self.ahead else dist.all_reduce_max(vote, self.info)
            if verdict == ABORT:
                raise GenerationAborted()
            if verdict == DONE:
                break
            self._say(TrainState.GENERATING)
        out.verify_items, out.verify_slowest_s = VERIFIER.take_stats()
        return out

    def collect_steps(self, steps: int) -> list[Collected]:
        """``steps`` steps' batches from one rollout (``rollout.steps_per_generation``):
        each step's prompts drawn in turn (the data order of as many synchronous steps),
        every row generated in one engine call, then cut into the steps' batches and
        scored each. Raises GenerationAborted on every rank when any rank was stopped
        mid-generation."""
        shares = [self._take() for _ in range(steps)]
        VERIFIER.take_stats()
        g = self.cfg.rollout.num_generations
        t = time.monotonic()
        batch = None
        try:
            with phase("generate"):
                batch = self.engine.generate(self._prompts([p for s in shares for p in s]), g)
        except GenerationAborted:
            pass  # the vote below tells every rank
        generate_s = time.monotonic() - t
        with phase("vote"):
            vote = ABORT if batch is None else DONE
            if dist.all_reduce_max(vote, self.info) == ABORT:
                raise GenerationAborted()
        assert batch is not None
        self._say(TrainState.SCORING)
        out, rows = [], self.per_rank * g
        for i, mine in enumerate(shares):
            t = time.monotonic()
            with phase("score"):
                scored = self.score(row_range(batch, i * rows, (i + 1) * rows), mine)
            # each batch its share of the rollout's seconds (tokens_per_s stays the rollout's)
            out.append(Collected([scored], generate_s / steps, time.monotonic() - t))
        out[0].verify_items, out[0].verify_slowest_s = VERIFIER.take_stats()
        return out

    def _say(self, state: TrainState) -> None:
        if not self.ahead:
            self.tracker.update(state)

    def _generate(self, mine: list[dict]) -> tuple[RolloutBatch | None, StreamingJudge | None]:
        """This round's completions (None when a stop reached this rank mid-generation)
        and the judge that scored its finished rows meanwhile, if one did."""
        stream = self._stream(mine)
        hand: dict[str, Any] = {}
        if stream:
            hand["on_done"] = stream.offer
            if self.cfg.rollout.judge_running:
                hand["on_running"] = stream.running
        g = self.cfg.rollout.num_generations
        try:
            with phase("generate"):
                batch = self._sample(self._prompts(mine), g, hand)
        except BaseException as e:
            if stream:
                stream.close()  # the rollout is abandoned: so is its head start
            if not isinstance(e, GenerationAborted):
                raise
            return None, None
        return batch, stream

    def _stream(self, mine: list[dict]) -> StreamingJudge | None:
        """A scorer of rows as they finish (``rollout.stream_scoring``), where the engine
        hands them over and correctness or code is scored."""
        cfg, rc = self.cfg, self.cfg.reward
        code = bool(rc.code) and any(p.get("tests") for p in mine)
        if not (cfg.rollout.stream_scoring and (rc.correctness or code)):
            return None
        if not getattr(self.engine, "hands_over_rows", False):
            return None
        samples = [p for p in mine for _ in range(cfg.rollout.num_generations)]
        decode = functools.partial(completion_text, self.tok)
        # While rows decode, one CPU stays with the decode loop: one sandbox fewer.
        workers = max(1, code_workers() - 1) if code else 0
        return StreamingJudge(
            samples, decode, rc.timeout_s, rc.require_marker, bool(rc.correctness), workers
        )

    def _sample(self, prompts: list[str], g: int, hand: dict[str, Any]) -> RolloutBatch:
        """The engine's completions; with ``rollout.seed_per_group`` one group at a time,
        each from its own stream (rollout/per_group.py), the same on any number of ranks."""
        if not self.cfg.rollout.seed_per_group:
            return self.engine.generate(prompts, g, **hand)
        first = self.info.rank * self.per_rank  # this rank's first group in the global draw
        seeds = [
            per_group.group_seed(self.cfg.training.seed, self._draw, first + j)
            for j in range(len(prompts))
        ]
        return per_group.generate_per_group(self.engine.generate, prompts, g, seeds, **hand)

    def draw(self) -> tuple[list[dict], int]:
        """This rank's share of the next prompts and where in the data order they were
        drawn (a split run's trainer draws, its generator generates: rollout/split.py)."""
        return self._take(), self._draw

    def _take(self) -> list[dict]:
        """This rank's share of the next prompts (whole groups per rank)."""
        return [self.train_set[i] for i in self.take_indices()]

    def take_indices(self) -> list[int]:
        """The training-set indices of this rank's share of the next prompts (whole groups
        per rank); the sampler moves on by a whole step's prompts."""
        self._draw = self.sampler.epoch * self.sampler.n + self.sampler.position
        idx = self.sampler.take(self.cfg.rollout.prompts_per_step)
        lo = self.info.rank * self.per_rank
        return idx[lo : lo + self.per_rank]

    def prompt_texts(self, problems: list[dict]) -> list[str]:
        """Each problem rendered as the policy's prompt (its chat template)."""
        return self._prompts(problems)

    def _prompts(self, problems: list[dict]) -> list[str]:
        system = self.cfg.data.system_prompt
        return [data.prompt_text(self.tok, p["question"], system) for p in problems]

    def score(
        self, batch: RolloutBatch, problems: list[dict], ahead: rewards.Ahead | None = None
    ) -> Scored:
        """Rewards of a rollout batch (``ahead``: what was scored while it was decoding); a
        custom reward failing on every completion is a bug in the function, said in one
        line."""
        g = self.cfg.rollout.num_generations
        samples = [p for p in problems for _ in range(g)]
        out = rewards.run_rewards(
            batch.texts,
            samples,
            self.cfg.reward,
            self.custom,
            lengths(batch, self.cfg, self.engine.max_new_tokens),
            ahead,
        )
        for name in self.custom:
            if out.errors.get(name, 0) == len(samples):
                raise ConfigError(
                    f"reward function {name!r} failed on every completion "
                    f"({out.error_examples.get(name, '?')}): fix it or remove it from reward.custom"
                )
        total = torch.tensor(out.total, dtype=torch.float32).view(-1, g)
        full = rewards.full_marks(out.components, self.cfg.reward)
        if self.cfg.faults.enabled and self.cfg.faults.zero_reward:
            total, full = torch.zeros_like(total), []
        questions = [str(p["question"]) for p in problems]
        return Scored(batch, total, out.components, dict(out.errors), questions, full)


def lengths(batch: RolloutBatch, cfg: Config, cap: int) -> rewards.Lengths:
    """Token counts and EOS flags of a batch generated with up to ``cap`` new tokens (the
    engine's: a rollback may have raised it), for the overlong reward."""
    tokens = batch.completion_mask.sum(1).tolist()
    finished = batch.finished.tolist() if batch.finished is not None else [True] * len(tokens)
    return rewards.Lengths(tokens, finished, cap, cfg.reward.overlong_buffer)
