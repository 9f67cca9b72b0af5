"""The cap-trap analysis (bench/collapse/cap_trap.py: its runs, hypotheses and samples in
cap_runs.py, cap_hypotheses.py, cap_samples.py) and its probe (cap_trap_probe.py): the pure
pieces."""

from __future__ import annotations

import pytest

from bench.collapse.cap_hypotheses import adam_coast
from bench.collapse.cap_runs import Run, auc, outcome
from bench.collapse.cap_samples import gold_of, repeated_ngram
from bench.collapse.cap_trap_probe import group_stats


def test_a_cut_right_answer_turns_a_finished_wrong_one_negative() -> None:
    # Seven cut rows scoring 0, one finished wrong row with the answer line (0.2): pushed up.
    up = group_stats([0, 0, 0, 0, 0, 0, 0, 0.2], [False] * 7 + [True])
    assert up["trains"] and up["positive_trained"] == 1 and up["push_to_end"] > 0
    # One cut row credited by its last number (1.0), the finished row wrong (0): pushed down.
    down = group_stats([1, 0, 0, 0, 0, 0, 0, 0.0], [False] * 7 + [True])
    assert down["trains"] and down["negative_trained"] == 1 and down["push_to_end"] < 0
    flat = group_stats([0.0] * 8, [False] * 7 + [True])
    assert not flat["trains"] and flat["push_to_end"] == 0


def test_adam_keeps_moving_on_zero_gradients() -> None:
    u = adam_coast(3)
    assert u[0] == pytest.approx(1.0)
    assert u[1] == pytest.approx(0.9 * 0.1 / (1 - 0.81) / (0.99 * 0.01 / (1 - 0.99**2)) ** 0.5)
    assert u[0] > u[1] > u[2] > 0


def test_auc_and_outcome() -> None:
    assert auc([2, 3], [1, 1]) == 1.0 and auc([1], [1]) == 0.5
    step = {"cut": 1.0, "grad_norm": 0.0, "reward": 0.0, "length": 48.0}
    trapped = Run("f", "s", 0, [step] * 10, [{"accuracy": 0.0}], [])
    assert outcome(trapped) == "trapped"
    fine = Run("f", "s", 0, [step | {"cut": 0.1}] * 10, [{"accuracy": 0.8}], [])
    assert outcome(fine) == "healthy"


def test_sample_helpers() -> None:
    assert gold_of("Ada has 7 coins. A friend gives Ada 12 more coins. How many?") == 19
    assert repeated_ngram("a b c d e f x a b c d e f") and not repeated_ngram("a b c d e f g")
