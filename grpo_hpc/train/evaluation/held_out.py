"""The trainer's held-out evaluation during training: each rank generates its share of the
held-out set (the validation split, ``data.num_val``; the test split only when there is
none), the ranks sum their counts, and the tracker logs eval/accuracy (or eval/pass@k for
code problems) and every completion, scored, to ``eval_samples/step_N.jsonl``.

The building blocks (shares, chunks, generation, judging, pass@k) are
:mod:`grpo_hpc.train.evaluation.scoring`'s, shared with ``grpo-eval``; this module adds what only a
training run has: ranks that sum their counts, the tracker, and a stop agreed between
chunks.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from grpo_hpc.config.schema import Config
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.core.progress import TrainState
from grpo_hpc.tasks import problems as data
from grpo_hpc.train.distributed import dist
from grpo_hpc.train.evaluation import scoring
from grpo_hpc.train.measure.tracking import Tracker
from grpo_hpc.train.rollout.types import RolloutEngine


def eval_seed(seed: int, step: int, rank: int) -> int:
    """The random stream of ``rank``'s sampled evaluation at ``step`` (pure): named by the
    run's seed and the step, not by what drew before it (schedule.rollout_seed's
    derivation, in a namespace of its own)."""
    digest = hashlib.sha256(f"grpo_hpc eval {seed} {step} {rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # torch.manual_seed takes < 2**63


@contextlib.contextmanager
def own_stream(seed: int, info: dist.DistInfo) -> Iterator[None]:
    """Sample from the stream ``seed`` and leave the process's random state as it was.
    Without it a sampled evaluation drew from the training's stream: turning evaluation
    on, or changing ``training.eval_every``, changed every later rollout of a synchronous
    run, and its samples depended on what ran before (a generator thread's reseed, or
    none in a split run's trainer)."""
    devices = [info.device] if info.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


class EvaluationStopped(Exception):
    """Every rank agreed to stop between two evaluation chunks."""


@dataclass(frozen=True)
class EvalResult:
    """What one evaluation scored (the same on every rank: the counts are summed)."""

    step: int
    metrics: dict[str, float]
    """``accuracy`` and ``accuracy_strict`` (math), ``pass@k`` (code): what keep-best may
    select on (training.select_metric)."""
    problems: int
    code: bool


def select_metric(select: str, splits: data.Splits) -> str | None:
    """The metric keep-best compares (pure): ``training.select_metric``, ``auto`` being
    ``pass@1`` for code problems and ``accuracy`` otherwise; None without a validation
    split (the evaluation then scores the test problems, which must choose nothing)."""
    if not splits.validation:
        return None
    code = all(scoring.is_code_problem(p) for p in splits.validation)
    metric = select if select != "auto" else ("pass@1" if code else "accuracy")
    if code != (metric == "pass@1"):
        kind = "code problems report pass@k" if code else "math problems report accuracy"
        raise ConfigError(
            f"training.select_metric={select}: this run's {kind}; use auto (the default)"
        )
    return metric


def steering_line(cfg: Config, evaluated: int, validates: bool) -> str | None:
    """What the run's evaluation may steer, said once at the start (pure): ``evaluated``
    problems scored at each evaluation, ``validates`` whether they are the validation split.
    Without one the evaluation scores the test problems, which steer nothing (keep-best
    and the collapse watch's evaluation signals read only the validation split)."""
    if not cfg.training.eval_every or not evaluated:
        return None
    if not validates:
        return (
            f"[Eval] no validation split (data.num_val={cfg.data.num_val}): the evaluation "
            f"scores {evaluated} test problems and steers nothing (no keep-best, no eval_drop "
            "or reward_hacking collapse signal); set data.num_val to choose the model handed "
            "over and to watch for a fall"
        )
    if evaluated < cfg.data.num_val:
        return (
            f"[Eval] validation split: {evaluated} problems of the data.num_val="
            f"{cfg.data.num_val} asked (no more fresh questions): its noise is larger than planned"
        )
    return None


def sample_rows(
    step: int, problems: list[data.Problem], texts: list[str], verdicts: list[float], reward: Any
) -> list[dict[str, Any]]:
    """One row per completion, for a person to read (pure): the question, the completion,
    the answer the judge read from it (None for code, which is run, not read), the gold and
    the verdict (1.0 correct / passed every test)."""
    from grpo_hpc.tasks.answers import extract_answer

    n = len(texts) // max(len(problems), 1)
    rows = []
    for i, text in enumerate(texts):
        p = problems[i // n]
        code = scoring.is_code_problem(p)
        answer = None if code else extract_answer(text, not reward.require_marker)
        rows.append(
            {"step": step, "question": p["question"], "completion": text, "answer": answer,
             "gold": None if code else p.get("gold"), "verdict": float(verdicts[i])}
        )  # fmt: skip
    return rows


@dataclass(frozen=True)
class HeldOutEval:
    """What the held-out evaluation needs of the trainer, held once after its setup."""

    cfg: Config
    info: dist.DistInfo
    tok: Any
    engine: RolloutEngine
    eval_set: list[data.Problem]
    tracker: Tracker
    stop_agreed: Callable[[], bool]
    """True when the ranks agree to stop (a collective: every rank calls it as often)."""

    @torch.no_grad()
    def run(self, step: int) -> EvalResult | None:
        """Greedy accuracy on the held-out set (split across ranks), logged as eval/accuracy;
        for code problems pass@1 (and pass@k with training.eval_samples), as eval/pass@k.
        False when a stop was agreed between two chunks: the evaluation is dropped (a long
        one must not eat the signal lead that the checkpoint needs)."""
        self.tracker.update(TrainState.EVALUATING)
        try:
            return self._evaluate(step)
        except EvaluationStopped:
            return None

    def _samples(self, step: int, mine: list, texts: list[str], verdicts: list[float]) -> None:
        """Every rank's completions, scored, to rank 0 (one gather per evaluation: a few
        hundred short strings), written there as ``eval_samples/step_N.jsonl``."""
        rows = sample_rows(step, mine, texts, verdicts, self.cfg.reward)
        if self.info.enabled:
            parts: list[Any] = [None] * self.info.world_size
            torch.distributed.all_gather_object(parts, rows, group=self.info.group)
            rows = [r for part in parts for r in part]
        self.tracker.log_eval_samples(step, rows)

    def _evaluate(self, step: int) -> EvalResult | None:
        info, cfg = self.info, self.cfg
        start, stop, pad = scoring.rank_share(len(self.eval_set), info.rank, info.world_size)
        mine = self.eval_set[start:stop]
        questions = [p["question"] for p in mine] + [self.eval_set[0]["question"]] * pad
        prompts = [data.prompt_text(self.tok, q, cfg.data.system_prompt) for q in questions]
        chunk = scoring.eval_chunk(
            cfg.rollout.prompts_per_step, cfg.rollout.num_generations, info.world_size
        )

        def progress(done: int, seconds: float) -> None:  # long evaluations say how far
            if info.is_main and len(prompts) > chunk:
                print(f"[Eval] step {step}: {done}/{len(prompts)} prompts ({seconds:.0f} s)")
            if done < len(prompts) and self.stop_agreed():  # every rank has as many chunks
                raise EvaluationStopped()

        t0 = time.monotonic()
        if all(scoring.is_code_problem(p) for p in self.eval_set):
            return self._evaluate_code(step, mine, prompts, chunk, progress, t0)
        texts = scoring.generate_greedy(self.engine, prompts, chunk, progress)[: len(mine)]
        golds = [p["gold"] for p in mine]
        verdicts = scoring.judge(texts, golds, cfg.reward)
        score = scoring.score_eval(texts, golds, cfg.reward, verdicts)
        total, strict, n = dist.all_reduce_sum(
            [float(score.correct), float(score.strict), float(len(mine))], info
        )
        acc = total / max(n, 1)
        seconds = time.monotonic() - t0
        self.tracker.log_eval(step, acc, int(total), int(n), strict / max(n, 1), seconds)
        self._samples(step, mine, texts, verdicts)
        metrics = {"accuracy": acc, "accuracy_strict": strict / max(n, 1)}
        return EvalResult(step, metrics, int(n), code=False)

    def _evaluate_code(
        self,
        step: int,
        mine: list[data.Problem],
        prompts: list[str],
        chunk: int,
        progress: scoring.Progress,
        t0: float,
    ) -> EvalResult:
        """pass@1 (and pass@k with training.eval_samples > 1) of held-out code problems,
        judged in the code reward's sandbox."""
        n = self.cfg.training.eval_samples
        if n == 1:
            texts = scoring.generate_greedy(self.engine, prompts, chunk, progress)
        else:
            with own_stream(eval_seed(self.cfg.training.seed, step, self.info.rank), self.info):
                texts = scoring.generate_samples(self.engine, prompts, n, chunk, progress)
        texts = texts[: len(mine) * n]
        each = [p for p in mine for _ in range(n)]
        judged = scoring.judge_problems(texts, each, self.cfg.reward)
        per_problem = [judged[i * n : (i + 1) * n] for i in range(len(mine))]
        ks = scoring.reported_ks(n)
        sums = scoring.pass_at_k_sums(per_problem, ks)
        totals = dist.all_reduce_sum(
            [sums[k] for k in ks] + [float(len(mine)), float(sum(judged))], self.info
        )
        problems, passed = totals[-2], totals[-1]
        rates = {k: v / max(problems, 1) for k, v in zip(ks, totals, strict=False)}
        seconds = time.monotonic() - t0
        self.tracker.log_pass_at_k(step, rates, int(passed), int(problems) * n, seconds)
        self._samples(step, mine, texts, judged)
        return EvalResult(step, {f"pass@{k}": v for k, v in rates.items()}, int(problems), True)
