"""Keep-best on the trainer's side: after each held-out evaluation, the record of the best
step (``logs/<run>/best.json``) is updated when the evaluation beats it.

The record's format is ``grpo_hpc.core.best`` (re-exported here: ``BestRecord``,
``read_best``, ``write_best``, ``better``), so login-node readers (grpo-status, the
monitor) need no torch; this module adds what the trainer decides with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from grpo_hpc.core.best import BestRecord, Mode, better, read_best, write_best
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.train.distributed.dist import DistInfo, all_reduce_max

__all__ = [
    "BestRecord",
    "KeepBest",
    "Mode",
    "better",
    "next_best",
    "read_best",
    "record_evaluation",
    "write_best",
]


def next_best(
    old: BestRecord | None,
    step: int,
    metric: str,
    score: float,
    *,
    mode: Mode = "max",
    split: str = "",
    problems: int = 0,
) -> tuple[BestRecord, bool]:
    """(the record after an evaluation at ``step``, whether it is a new best): pure.

    A record of another metric (the config changed between attempts) is not comparable:
    the new evaluation replaces it. The count of evaluations carries on either way."""
    count = (old.evaluations if old else 0) + 1
    if old is not None and old.metric == metric and not better(score, old.score, mode):
        return replace(old, evaluations=count), False
    new = BestRecord(
        step=step,
        metric=metric,
        score=score,
        checkpoint=RunPaths(Path(".")).checkpoint(step).name,
        mode=mode,
        split=split,
        problems=problems,
        evaluations=count,
    )
    return new, True


def record_evaluation(
    run_dir: Path,
    step: int,
    metric: str,
    score: float,
    *,
    mode: Mode = "max",
    split: str = "",
    problems: int = 0,
) -> bool:
    """Rank 0, after an evaluation at ``step``: update ``best.json``; True when this step
    is the new best (its checkpoint must then be saved and kept)."""
    record, improved = next_best(
        read_best(run_dir), step, metric, score, mode=mode, split=split, problems=problems
    )
    write_best(run_dir, record)
    return improved


@dataclass(frozen=True)
class KeepBest:
    """The trainer's keep-best: after each evaluation, a new best saves its step's
    checkpoint and only then names it in ``best.json`` (the record never names a
    checkpoint that is not complete). ``metric`` None: nothing is selected (no validation
    split: the evaluation scored the test problems, which must not choose the model)."""

    paths: RunPaths
    info: DistInfo
    metric: str | None
    split: str = ""

    def _standing(self) -> BestRecord | None:
        """The recorded best, unless its checkpoint is gone (set aside by ``grpo-submit
        --resume --from-step``, or deleted by hand): a best that cannot be handed over is
        not one to beat."""
        old = read_best(self.paths.root)
        if old is not None and old.checkpoint and old.step not in self.paths.checkpoint_steps():
            print(f"[Best] step {old.step}'s checkpoint is gone: comparing afresh", flush=True)
            return BestRecord(**{**old.__dict__, "score": float("nan")})
        return old

    def after_evaluation(
        self, step: int, metrics: dict[str, float], problems: int, save: Callable[[], None]
    ) -> bool:
        """Collective (every rank calls it): True when ``step`` is the new best. Rank 0
        decides; the ranks agree before saving, which every rank takes part in."""
        if self.metric is None:
            return False
        score = float(metrics[self.metric])
        old = self._standing() if self.info.is_main else None
        record, improved = next_best(
            old, step, self.metric, score, split=self.split, problems=problems
        )
        improved = all_reduce_max(float(improved and self.info.is_main), self.info) > 0
        if improved and step > 0:
            save()  # before the record: best.json never names a checkpoint that is not there
        if self.info.is_main:
            if step == 0:  # the start: a baseline to beat, with no checkpoint of its own
                record = BestRecord(**{**record.__dict__, "checkpoint": ""})
            write_best(self.paths.root, record)
            if improved:
                print(f"[Best] step {step}: {self.metric} {score:.3f}", flush=True)
        return improved
