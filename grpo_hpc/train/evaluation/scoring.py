"""Held-out evaluation scored by the run's own judge.

A held-out accuracy is only worth reading if it means what the training reward means:
``score_eval`` judges each completion with :func:`rewards.score_correctness` under the
run's ``reward`` settings (its answer convention, its math-verify time limit), and reports
the strict figure (an answer convention required: ``Answer:``, ``#### N``, ``\\boxed{}``,
"the answer is") beside it, so that a run that judges by the last number also shows how
often the model writes a proper answer line.

Code problems (tests, no gold: :mod:`grpo_hpc.tasks.code`) are judged by running them
in the code reward's sandbox (a child process, never the trainer's), and report pass@k:
:func:`judge_problems` is the one place that chooses how a completion is judged.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from grpo_hpc.config.schema import RewardConfig
from grpo_hpc.tasks import code as code_data
from grpo_hpc.train.rewards import functions as rewards
from grpo_hpc.train.rewards.code import code_scores
from grpo_hpc.train.rollout.types import RolloutEngine

Progress = Callable[[int, float], None]
"""``progress(done prompts, seconds)``, called after each generate call."""


def no_progress(done: int, seconds: float) -> None:
    """The default :data:`Progress`: says nothing."""


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


def score_eval(
    texts: Sequence[str],
    golds: Sequence[str],
    reward: RewardConfig,
    scores: Sequence[float] | None = None,
) -> EvalScore:
    """Score held-out completions against their golds with the run's reward settings
    (``scores``: their :func:`judge` verdicts, when the caller has them already)."""
    scores = judge(texts, golds, reward) if scores is None else list(scores)
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


def eval_chunk(prompts_per_step: int, num_generations: int, world: int) -> int:
    """Rows of one held-out generate call on each rank: a rollout's rows of that rank (the
    engine's cache and CUDA graphs are sized for those already). ``grpo-eval`` batches the
    same way, so that a near-tie decodes as it did in the trainer."""
    return max(1, prompts_per_step // world) * num_generations


def generate_greedy_ranked(
    engine: RolloutEngine,
    prompts: Sequence[str],
    chunk: int,
    world: int,
    progress: Progress = no_progress,
) -> list[str]:
    """Greedy completions of ``prompts`` generated in the batches the trainer's evaluation
    uses on ``world`` ranks, one rank after another on this one engine: each rank's share
    (:func:`rank_share`, padded with the first prompt as the trainer pads), ``chunk`` at a
    time. A batch's composition (its longest prompt sets the left padding, its rows the
    row bucket) changes the kernels' shapes and so, at a near-tie, a greedy token."""
    texts: list[str] = []
    for rank in range(world):
        start, stop, pad = rank_share(len(prompts), rank, world)
        mine = list(prompts[start:stop]) + [prompts[0]] * pad

        def step(done: int, seconds: float, before: int = start, n: int = stop - start) -> None:
            progress(before + min(done, n), seconds)

        texts += generate_greedy(engine, mine, chunk, step)[: stop - start]
    return texts


def generate_greedy(
    engine: RolloutEngine,
    prompts: Sequence[str],
    chunk: int,
    progress: Progress = no_progress,
) -> list[str]:
    """Greedy completions of ``prompts``, ``chunk`` at a time (a rollout's rows: the engine's
    cache and CUDA graphs are sized for those already); ``progress(done, seconds)`` after
    each chunk."""
    return _generate_in_calls(engine, prompts, 1, chunk, progress, greedy=True)


# ------------------------------------------------------------------ code problems: pass@k

PASS_AT = (1, 5, 10, 20, 50, 100)
"""The k of pass@k reported for n samples per problem: those <= n, and n itself."""


def is_code_problem(problem: dict[str, Any]) -> bool:
    """A problem judged by running its tests (it has tests and no gold answer)."""
    return code_data.is_code(problem) and not problem.get("gold")


def judge_problems(
    texts: Sequence[str], problems: Sequence[dict[str, Any]], reward: RewardConfig
) -> list[float]:
    """How a completion of each problem is judged, 1.0 or 0.0: the one place that decides.
    A code problem runs its setup, the completion's code and its tests in the code reward's
    sandbox (all or nothing, as ``reward/code`` scores it); any other problem is judged as
    the run's correctness reward judges its final answer (:func:`judge`)."""
    scores = [0.0] * len(texts)
    code = [i for i, p in enumerate(problems) if is_code_problem(p)]
    other = [i for i, p in enumerate(problems) if not is_code_problem(p)]
    if code:
        judged = code_scores([texts[i] for i in code], [problems[i] for i in code])
        for i, s in zip(code, judged, strict=True):
            scores[i] = s
    if other:
        golds = [str(problems[i].get("gold") or "") for i in other]
        for i, s in zip(other, judge([texts[i] for i in other], golds, reward), strict=True):
            scores[i] = s
    return scores


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem from ``n`` samples of which ``c`` passed:
    1 - C(n-c, k) / C(n, k) (Chen et al. 2021); k > n is undefined."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@{k} needs 0 < k <= n={n} and 0 <= c <= n, got c={c}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def reported_ks(n: int) -> list[int]:
    """The k of pass@k reported for ``n`` samples per problem (pure)."""
    return sorted({k for k in PASS_AT if k <= n} | {n})


def pass_at_k_sums(scores: Sequence[Sequence[float]], ks: Sequence[int]) -> dict[int, float]:
    """pass@k summed over problems (divide by the problem count after summing ranks);
    ``scores[i]`` holds problem i's n judged samples."""
    sums = {k: 0.0 for k in ks}
    for row in scores:
        c = int(sum(1 for s in row if s >= 1.0))
        for k in ks:
            sums[k] += pass_at_k(len(row), c, k)
    return sums


def generate_samples(
    engine: RolloutEngine,
    prompts: Sequence[str],
    n: int,
    rows: int,
    progress: Progress = no_progress,
) -> list[str]:
    """``n`` sampled completions per prompt (prompt-major), about ``rows`` completions per
    engine call; ``progress(done prompts, seconds)`` after each call."""
    return _generate_in_calls(engine, prompts, n, max(1, rows // n), progress, greedy=False)


def _generate_in_calls(
    engine: RolloutEngine,
    prompts: Sequence[str],
    n: int,
    per_call: int,
    progress: Progress,
    greedy: bool,
) -> list[str]:
    """``n`` completions per prompt (prompt-major), ``per_call`` prompts per engine call;
    ``progress(done prompts, seconds)`` after each call."""
    texts: list[str] = []
    t0 = time.monotonic()
    for i in range(0, len(prompts), per_call):
        texts += engine.generate(list(prompts[i : i + per_call]), n, greedy=greedy).texts
        progress(min(i + per_call, len(prompts)), time.monotonic() - t0)
    return texts
