"""The model to hand over so far: ``logs/<run>/best.json`` (keep-best).

This module owns the file's format and the rule that fills it (:func:`next_best`): the
model to hand over is the newest evaluated one whose validation score is not significantly
below the peak score seen (more than :func:`eval_noise` below it); the record keeps that
model's step and score and the peak's. The trainer writes it after each evaluation
(``grpo_hpc.train.state.best``); checkpoint retention, export, resume and grpo-status
read it through :func:`read_best`. It lives in ``core`` (no torch) because grpo-status
and the monitor, which run on login nodes and never import ``train``, read it too.

The record names the checkpoint directory of the evaluated step, so keep-k retention
knows which one to spare and ``grpo-export --best`` which one to export. It lives in the
run directory, not in a checkpoint, so a resumed or resubmitted attempt (which starts
from the newest complete checkpoint, maybe older or newer than the best) compares its
own evaluations against it instead of starting from scratch.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from grpo_hpc.core.fsutil import atomic_write_json
from grpo_hpc.core.paths import RunPaths

Mode = Literal["max", "min"]

EVAL_SIGMAS = 2.0
"""Standard errors of a validation score that its split's noise may explain: keep-best's
and the collapse detector's (``Thresholds.eval_sigmas``) significance test."""


def eval_noise(score: float, problems: int, sigmas: float = EVAL_SIGMAS) -> float:
    """How far an accuracy measured on ``problems`` problems may differ from ``score`` by
    chance: ``sigmas`` standard errors, sqrt(p (1 - p) / problems). 0 when the number of
    problems is unknown (0) or the score is no proportion (NaN, outside [0, 1])."""
    if problems <= 0 or not 0.0 <= score <= 1.0:
        return 0.0
    return sigmas * (score * (1 - score) / problems) ** 0.5


@dataclass(frozen=True)
class BestRecord:
    """The model to hand over (the newest evaluation within noise of the peak), the
    checkpoint holding it, and the peak it was compared with."""

    step: int
    """Optimizer step of the model to hand over (the weights after that many updates; 0:
    the model the run started from)."""
    metric: str
    """The selection metric's name, e.g. ``accuracy`` (math) or ``pass@1`` (code)."""
    score: float
    """Its value on the validation split at ``step``."""
    checkpoint: str
    """The checkpoint directory's name under ``checkpoints/`` (``step-N``); empty for step
    0, the start, which has no checkpoint of its own (its weights are the run's model
    directory)."""
    mode: Mode = "max"
    """Whether a higher (``max``) or a lower (``min``) score is better."""
    split: str = ""
    """Which problems were scored (e.g. ``gsm8k train[-256:]``): never the test split."""
    problems: int = 0
    """How many problems the score averages over."""
    evaluations: int = 0
    """Evaluations compared so far in this run, across attempts (this one included)."""
    peak_score: float | None = None
    """The best score of any evaluation so far (None in a file written before the peak
    was kept: that record's ``score`` was the peak)."""
    peak_step: int | None = None
    """The step that scored ``peak_score`` first (None: ``step``). A collapse rolls back
    to it (its checkpoint is kept), not to the model to hand over."""
    start_score: float | None = None
    """The score of the start (step 0's evaluation; None: not evaluated, or a file written
    before it was kept). A later model is handed over within noise of the peak only when it
    is significantly better than the start: below that, the runs of the learning benchmark
    that collapsed from a peak at the start handed over a stalled model that noise could
    not tell from the start (2026-12-04, seeds 407 and 408)."""

    @property
    def peak(self) -> tuple[float, int]:
        """(the peak score, its step), for a record of any age."""
        if self.peak_score is None:
            return self.score, self.step
        return self.peak_score, self.step if self.peak_step is None else self.peak_step

    @property
    def noise(self) -> float:
        """How far below the peak (above it, ``min``) a score may be and still match it."""
        return eval_noise(self.peak[0], self.problems)

    def why(self) -> str:
        """Which model is the one to hand over and why, in words (pure)."""
        peak, at = self.peak
        what = "step 0, the start" if self.step == 0 else f"step {self.step}"
        if self.step == 0 and at == 0 and self.evaluations > 1:
            return f"{what}: {self.metric} {self.score:.3f} beat every later evaluation"
        if at == self.step:
            return f"{what}: {self.metric} {self.score:.3f}, the peak"
        if self.score == peak:  # a tie: no noise to speak of
            return f"{what}: {self.metric} {self.score:.3f}, equal to the peak at step {at}"
        return (
            f"{what}: {self.metric} {self.score:.3f}, within noise (±{self.noise:.3f}, "
            f"{self.problems} problems) of the peak {peak:.3f} at step {at}"
        )


def best_path(run_dir: Path) -> Path:
    return RunPaths(Path(run_dir)).best


def read_best(run_dir: Path) -> BestRecord | None:
    """The recorded best, or None when no evaluation has been recorded (or the file is
    unreadable, not a JSON object among them: a reader then acts as if none were, and the
    next evaluation rewrites it). Fields a newer version added read as their defaults."""
    try:
        raw = json.loads(best_path(run_dir).read_text())
        if not isinstance(raw, dict):
            return None
        fields = {f.name for f in dataclasses.fields(BestRecord)}
        return BestRecord(**{k: v for k, v in raw.items() if k in fields})
    except (OSError, ValueError, TypeError):
        return None


def unreadable(run_dir: Path) -> bool:
    """Whether ``best.json`` is there but cannot be read (what a user who asked for the
    best is told, rather than "no evaluation recorded")."""
    return best_path(run_dir).exists() and read_best(run_dir) is None


def write_best(run_dir: Path, record: BestRecord) -> None:
    """Replace the record atomically (temp file, fsync, rename)."""
    atomic_write_json(best_path(run_dir), dataclasses.asdict(record))


def better(new: float, old: float | None, mode: Mode = "max") -> bool:
    """Whether ``new`` beats ``old`` (None: nothing recorded, so any score does); a tie
    does not (the peak keeps its first step). A NaN never wins."""
    if new != new:  # NaN
        return False
    if old is None or old != old:
        return True
    return new > old if mode == "max" else new < old


def beyond_noise(score: float, start: float, problems: int, mode: Mode = "max") -> bool:
    """Whether ``score`` is significantly better than ``start``: above it by more than
    its noise (``max``), below it by more (``min``). A NaN never is."""
    if score != score:
        return False
    noise = eval_noise(start, problems)
    return score > start + noise if mode == "max" else score < start - noise


def within_noise(score: float, peak: float, problems: int, mode: Mode = "max") -> bool:
    """Whether ``score`` is not significantly worse than ``peak``: at least ``peak`` less
    its noise (``max``), at most ``peak`` plus it (``min``). A NaN never is."""
    if score != score:
        return False
    noise = eval_noise(peak, problems)
    return score >= peak - noise if mode == "max" else score <= peak + noise


def next_best(
    old: BestRecord | None,
    step: int,
    metric: str,
    score: float,
    *,
    mode: Mode = "max",
    split: str = "",
    problems: int = 0,
    checkpoint: str = "",
) -> tuple[BestRecord, bool]:
    """(the record after an evaluation at ``step``, whether ``step`` is now the model to
    hand over): pure.

    The peak is the best score seen. The model to hand over is the newest evaluated one
    within noise of the peak (:func:`within_noise`) that is significantly better than the
    start (:func:`beyond_noise`), else the peak: a later model that only matches the peak
    within the noise replaces an earlier one (it trained longer, and nothing measured says
    it is worse); one significantly below the peak never does, nor one that noise cannot
    tell from the start (a stalled model after a peak at the start). Comparing with the
    peak, not with the current choice, keeps a slow drift down from walking the choice.

    ``checkpoint`` names the step's checkpoint (empty for step 0, the start). A record of
    another metric (the config changed between attempts), or one whose peak is NaN (its
    checkpoint gone: compare afresh), is not comparable: the new evaluation replaces it.
    The count of evaluations carries on either way."""
    count = (old.evaluations if old else 0) + 1
    fresh = old is None or old.metric != metric or old.peak[0] != old.peak[0]
    new_peak = fresh or better(score, old.peak[0], mode)
    peak: tuple[float, int] = (score, step) if new_peak else old.peak
    start = score if step == 0 else (None if fresh else old.start_score)
    learned = start is None or step == 0 or beyond_noise(score, start, problems, mode)
    if not new_peak and not (within_noise(score, peak[0], problems, mode) and learned):
        kept = replace(old, evaluations=count, peak_score=peak[0], peak_step=peak[1])
        return replace(kept, start_score=start), False
    new = BestRecord(
        step=step,
        metric=metric,
        score=score,
        checkpoint=checkpoint,
        mode=mode,
        split=split,
        problems=problems,
        evaluations=count,
        peak_score=peak[0],
        peak_step=peak[1],
        start_score=start,
    )
    return new, True
