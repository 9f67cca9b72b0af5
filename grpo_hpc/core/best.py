"""The best evaluation of a run so far: ``logs/<run>/best.json`` (keep-best, issue 56).

This module owns the file's format; the trainer writes it after an evaluation that beats
it (``grpo_hpc.train.state.best``), checkpoint retention, export, resume and grpo-status
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
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from grpo_hpc.core.fsutil import atomic_write_json
from grpo_hpc.core.paths import RunPaths

Mode = Literal["max", "min"]


@dataclass(frozen=True)
class BestRecord:
    """The evaluation that scored best so far, and the checkpoint holding its model."""

    step: int
    """Optimizer step of the evaluated model (the weights after that many updates)."""
    metric: str
    """The selection metric's name, e.g. ``accuracy`` (math) or ``pass@1`` (code)."""
    score: float
    """Its value on the validation split at ``step``."""
    checkpoint: str
    """The checkpoint directory's name under ``checkpoints/`` (``step-N``)."""
    mode: Mode = "max"
    """Whether a higher (``max``) or a lower (``min``) score is better."""
    split: str = ""
    """Which problems were scored (e.g. ``gsm8k train[-256:]``): never the test split."""
    problems: int = 0
    """How many problems the score averages over."""
    evaluations: int = 0
    """Evaluations compared so far in this run, across attempts (this one included)."""


def best_path(run_dir: Path) -> Path:
    return RunPaths(Path(run_dir)).best


def read_best(run_dir: Path) -> BestRecord | None:
    """The recorded best, or None when no evaluation has been recorded (or the file is
    unreadable: a reader then acts as if none were, and the next evaluation rewrites it)."""
    try:
        raw = json.loads(best_path(run_dir).read_text())
        fields = {f.name for f in dataclasses.fields(BestRecord)}
        return BestRecord(**{k: v for k, v in raw.items() if k in fields})
    except (OSError, ValueError, TypeError):
        return None


def write_best(run_dir: Path, record: BestRecord) -> None:
    """Replace the record atomically (temp file, fsync, rename)."""
    atomic_write_json(best_path(run_dir), dataclasses.asdict(record))


def better(new: float, old: float | None, mode: Mode = "max") -> bool:
    """Whether ``new`` beats ``old`` (None: nothing recorded, so any score does). Ties keep
    the older checkpoint: a later step that only matches it is no better, and keeping the
    earlier one leaves retention more room. A NaN never wins."""
    if new != new:  # NaN
        return False
    if old is None or old != old:
        return True
    return new > old if mode == "max" else new < old
