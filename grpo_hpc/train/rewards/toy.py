"""Toy rewards for smoke tests with a random model (``configs/tiny.yaml``).

A randomly initialised model never writes ``Answer: 42``, so math rewards are all
zero, every group is flat and GRPO has nothing to learn: the pipeline would run
with zero gradients and prove nothing. These rewards vary between random samples,
so advantages and gradients are real and "reward goes up" is observable in seconds.
"""

from __future__ import annotations

from typing import Any


def digit_fraction(completion: str, sample: dict[str, Any]) -> float:
    """Fraction of the completion's characters that are digits (0 for empty text)."""
    if not completion:
        return 0.0
    return sum(c.isdigit() for c in completion) / len(completion)


def always_right(completion: str, sample: dict[str, Any]) -> float:
    """1.0 for every completion: a task every completion solves (every group flat at the
    full reward), to try what a solved task does (``training.on_solved``)."""
    return 1.0
