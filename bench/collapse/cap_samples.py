"""The length cap of the cap-trap runs and what one sampled completion shows, with the two
small statistics the analysis (cap_trap.py) and the checkpoint probe (cap_trap_probe.py)
share: apart so that neither imports the other."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence

CAP = 48
"""The runs' ``--max-new``: a completion this long was cut off."""


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def describe(xs: Sequence[float]) -> dict:
    return {
        "n": len(xs),
        "mean": round(mean(xs), 4),
        "median": round(statistics.median(xs), 4),
        "min": round(min(xs), 4),
        "max": round(max(xs), 4),
    }


NUMBER = re.compile(r"\d+")


def gold_of(question: str) -> int:
    """The sum a benchmark question asks for (its operands are its numbers)."""
    return sum(int(x) for x in NUMBER.findall(question))


def repeated_line(text: str) -> bool:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return len(lines) != len(set(lines))


def repeated_ngram(text: str, n: int = 6) -> bool:
    """Some run of ``n`` words occurs twice (looping text)."""
    words = text.split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return len(grams) != len(set(grams))


def sample_kind(sample: dict, gold: int | None = None) -> dict:
    """What one sampled completion shows (pure); ``gold`` defaults to its question's sum."""
    text = sample["completion"]
    gold = gold_of(sample["question"]) if gold is None else gold
    numbers = [int(x) for x in NUMBER.findall(text)]
    return {
        "at_cap": sample["tokens"] >= CAP,
        "gold_written": gold in numbers,
        "answer_line": "Answer:" in text,
        "repeated_line": repeated_line(text),
        "repeated_6gram": repeated_ngram(text),
        "correct": sample["reward"] >= 1.0,
        "format": round(sample["reward"] * 5) % 5 == 1,  # 0.2 or 1.2
        "lines": len([x for x in text.splitlines() if x.strip()]),
    }
