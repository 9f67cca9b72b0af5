"""Keep-best on the trainer's side: after each held-out evaluation, the record of the model
to hand over (``logs/<run>/best.json``) is updated by the rule of
:func:`grpo_hpc.core.best.next_best` (the newest evaluation within noise of the peak).

The record's format and the rule are ``grpo_hpc.core.best`` (re-exported here), so
login-node readers (grpo-status, the monitor) need no torch; this module adds what the
trainer does with them (save the chosen step's checkpoint before naming it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from grpo_hpc.core.best import BestRecord, Mode, better, next_best, read_best, write_best
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.train.distributed.dist import DistInfo, all_reduce_max

__all__ = [
    "BestRecord",
    "KeepBest",
    "Mode",
    "better",
    "checkpoint_name",
    "next_best",
    "read_best",
    "write_best",
]


def checkpoint_name(step: int) -> str:
    """The checkpoint a record names for ``step``: none for step 0, the start (its weights
    are the run's model directory, read again by an export or a rollback)."""
    return RunPaths(Path(".")).checkpoint(step).name if step > 0 else ""


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
            return replace(old, score=float("nan"), peak_score=float("nan"))
        return old

    def after_evaluation(
        self, step: int, metrics: dict[str, float], problems: int, save: Callable[[], None]
    ) -> bool:
        """Collective (every rank calls it): True when ``step`` is now the model to hand
        over. Rank 0 decides; the ranks agree before saving, which every rank takes part
        in. Rank 0 says which model that is and why, after every evaluation."""
        if self.metric is None:
            return False
        score = float(metrics[self.metric])
        old = self._standing() if self.info.is_main else None
        record, chosen = next_best(
            old,
            step,
            self.metric,
            score,
            split=self.split,
            problems=problems,
            checkpoint=checkpoint_name(step),
        )
        chosen = all_reduce_max(float(chosen and self.info.is_main), self.info) > 0
        if chosen and step > 0:
            save()  # before the record: best.json never names a checkpoint that is not there
        if self.info.is_main:
            write_best(self.paths.root, record)
            print(f"[Best] the model to hand over: {record.why()}", flush=True)
        return chosen
