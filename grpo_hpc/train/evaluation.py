"""Held-out evaluation scored by the run's own judge.

A held-out accuracy is only worth reading if it means what the training reward means:
``score_eval`` judges each completion with :func:`rewards.score_correctness` under the
run's ``reward`` settings (its answer convention, its math-verify time limit), and reports
the strict figure (an answer convention required: ``Answer:``, ``#### N``, ``\\boxed{}``,
"the answer is") beside it, so that a run that judges by the last number also shows how
often the model writes a proper answer line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from grpo_hpc.config import RewardConfig
from grpo_hpc.train import rewards
from grpo_hpc.train.rollout_types import RolloutEngine


@dataclass(frozen=True)
class EvalScore:
    """Counts of one held-out evaluation (summed over ranks by the caller)."""

    correct: int
    """Completions the run's correctness reward scores 1."""
    strict: int
    """Completions correct with an answer convention (``require_marker=true``)."""
    n: int
    """Completions scored."""

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else 0.0

    @property
    def strict_accuracy(self) -> float:
        return self.strict / self.n if self.n else 0.0


def judge(texts: Sequence[str], golds: Sequence[str], reward: RewardConfig) -> list[float]:
    """Per-completion correctness exactly as the run's training reward scores it."""
    return rewards.score_correctness(texts, golds, reward.timeout_s, reward.require_marker)[0]


def score_eval(texts: Sequence[str], golds: Sequence[str], reward: RewardConfig) -> EvalScore:
    """Score held-out completions against their golds with the run's reward settings."""
    scores = judge(texts, golds, reward)
    if reward.require_marker:
        strict = scores
    else:
        strict = rewards.score_correctness(texts, golds, reward.timeout_s, True)[0]
    return EvalScore(int(sum(scores)), int(sum(strict)), len(scores))


def rank_share(n: int, rank: int, world: int) -> tuple[int, int, int]:
    """(start, stop, padding) of ``rank``'s share of ``n`` held-out problems: equal shares
    (padded with repeats that are not counted) keep FSDP's synced generation in step."""
    per_rank = -(-n // world)
    start = min(rank * per_rank, n)
    stop = min(start + per_rank, n)
    return start, stop, per_rank - (stop - start)


def generate_greedy(
    engine: RolloutEngine,
    prompts: Sequence[str],
    chunk: int,
    progress: Callable[[int, float], None] = lambda done, seconds: None,
) -> list[str]:
    """Greedy completions of ``prompts``, ``chunk`` at a time (a rollout's rows: the engine's
    cache and CUDA graphs are sized for those already); ``progress(done, seconds)`` after
    each chunk."""
    texts: list[str] = []
    t0 = time.monotonic()
    for i in range(0, len(prompts), chunk):
        texts += engine.generate(list(prompts[i : i + chunk]), 1, greedy=True).texts
        progress(min(i + chunk, len(prompts)), time.monotonic() - t0)
    return texts
