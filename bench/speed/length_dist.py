"""A recorded completion-length distribution and the seeded draws that impose it (pure).

Random weights never emit EOS, so a speed benchmark on them runs every row to the cap: the
worst case, and not the long tail of a real run, where most rows end early and a few run
long. ``bench/speed/longtail.py --length-dist FILE`` makes each generated row stop at a
length drawn from a file this module reads: real lengths recorded from a real model
(``bench/speed/record_lengths.py``), scaled to the run's cap.

File (JSON): ``lengths`` (completion tokens, EOS included), ``cap`` (the cap they were
sampled under), ``at_cap`` (per length: the row hit the cap without EOS; its true length is
unknown, at least the cap), ``provenance`` (model, data, sampling, command).

Scaling to a cap C: a length L becomes ``round(L * C / cap)`` (at least 1, at most C) and a
row that hit the recorded cap runs to C without EOS: the shape of the distribution (the
share of rows ending before each fraction of the cap) is kept, the tail included.
"""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class LengthDist:
    """Recorded completion lengths (tokens, EOS included) under ``cap``."""

    lengths: list[int]
    cap: int
    at_cap: list[bool] = field(default_factory=list)
    """Per length: the row ran to the cap without EOS (empty: none did)."""
    provenance: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.lengths:
            raise ValueError("a length distribution needs at least one length")
        if self.at_cap and len(self.at_cap) != len(self.lengths):
            raise ValueError("at_cap must have one flag per length")
        if any(n < 1 or n > self.cap for n in self.lengths):
            raise ValueError(f"every length must be in [1, {self.cap}]")


def load(path: Path) -> LengthDist:
    d = json.loads(Path(path).read_text())
    return LengthDist(
        lengths=[int(n) for n in d["lengths"]],
        cap=int(d["cap"]),
        at_cap=[bool(b) for b in d.get("at_cap", [])],
        provenance=d.get("provenance", {}),
    )


def save(dist: LengthDist, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "provenance": dist.provenance,
        "cap": dist.cap,
        "summary": summary(dist),
        "lengths": dist.lengths,
        "at_cap": dist.at_cap,
    }
    path.write_text(json.dumps(body, indent=1) + "\n")


def scaled(dist: LengthDist, cap: int) -> list[int]:
    """The targets of ``dist`` at ``cap``: each length scaled by ``cap / dist.cap``; a row
    that hit the recorded cap becomes ``cap + 1`` (runs to the cap, no EOS forced)."""
    if cap < 1:
        raise ValueError("cap must be positive")
    flags = dist.at_cap or [False] * len(dist.lengths)
    out = []
    for n, hit in zip(dist.lengths, flags, strict=True):
        out.append(cap + 1 if hit else min(cap, max(1, round(n * cap / dist.cap))))
    return out


def draw(targets: list[int], n: int, seed: int, call: int, rank: int = 0) -> list[int]:
    """``n`` targets drawn with replacement, seeded by (seed, call, rank): the same call of
    a synchronous and an asynchronous run with the same seed draws the same lengths, so the
    two meet the same tail step for step."""
    rng = random.Random(f"length-draw-{seed}-{call}-{rank}")  # str seeds hash stably
    return [rng.choice(targets) for _ in range(n)]


def completion_length(target: int, cap: int) -> int:
    """The completion length a row with ``target`` gets under ``cap``: the target, or the
    cap when the target is past it (EOS included in the count, as the trainer's mask)."""
    return min(target, cap)


def summary(dist: LengthDist) -> dict:
    """Mean, median, 90th percentile, max and share at the cap (for the file's reader)."""
    xs = sorted(dist.lengths)
    p90 = xs[min(len(xs) - 1, int(0.9 * len(xs)))]
    return {
        "n": len(xs),
        "mean": round(statistics.fmean(xs), 1),
        "median": statistics.median(xs),
        "p90": p90,
        "max": xs[-1],
        "at_cap_share": round(sum(dist.at_cap) / len(xs), 3) if dist.at_cap else 0.0,
    }
