"""The answer conventions models write (``Answer:``, ``#### N``, ``\\boxed{}``, "the answer is"),
judged with the real math-verify worker: one table of completion, gold and expected reward."""

from __future__ import annotations

import pytest

from grpo_hpc.tasks.answers import extract_gold, find_answer
from grpo_hpc.train.rewards.functions import compute_rewards, correctness_reward, format_reward

# (completion, gold, correctness with default settings)
CASES = [
    # GSM8K's own format
    ("48/2 = 24 clips, so 1250 in all.\n#### 1250", "1250", 1.0),
    ("So 1,250 in all.\n#### 1,250", "1250", 1.0),
    ("#### 1250\n", "Natalia sold 48/2 = 24 clips.\n#### 1,250", 1.0),
    ("It drops by 7.\n#### -7", "-7", 1.0),
    ("#### 1249", "1250", 0.0),
    ("#### 12 or 13", "13", 0.0),  # a hedge on the answer line
    ("#### Step 1: add them\n3 + 4 = 7", "7", 0.0),  # a markdown heading is no answer
    # \boxed{...}: nested braces, fractions, units, percent
    ("So the share is $\\boxed{\\frac{3}{4}}$.", "0.75", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "3/4", 1.0),
    ("\\boxed{0.75}", "\\frac{3}{4}", 1.0),
    ("\\boxed{-\\frac{1}{2}}", "-0.5", 1.0),
    ("\\boxed{1,000,000}", "1000000", 1.0),
    ("\\boxed{\\$18}", "18", 1.0),
    ("\\boxed{18 \\text{ dollars}}", "18", 1.0),
    ("\\boxed{25\\text{ cm}^2}", "25", 1.0),
    ("\\boxed{50\\%}", "50", 1.0),
    ("\\boxed{50\\%}", "0.5", 1.0),  # math-verify reads the percent
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", 1.0),  # symbolic gold
    ("\\boxed{7}. Hmm, 3 + 5 is 8, so actually \\boxed{8}", "8", 1.0),  # self-correction
    ("\\boxed{7}. Hmm, 3 + 5 is 8, so actually \\boxed{8}", "7", 0.0),
    ("\\boxed{3 \\text{ or } 4}", "4", 0.0),
    ("\\boxed{2^{10}}", "1024", 0.0),  # a power, not a plain number
    ("\\boxed{\\frac{3}{4}", "0.75", 0.0),  # cut off before the closing brace
    # Answer: lines
    ("Answer: 1,000,000", "1000000", 1.0),
    ("Answer: -3.5", "-7/2", 1.0),
    ("Answer: \u22125", "-5", 1.0),  # unicode minus
    ("Answer: 1/2", "0.5", 1.0),
    ("Answer: 12%", "12", 1.0),
    ("**Answer:** 42", "42", 1.0),  # markdown bold
    ("Answer: **42**", "42", 1.0),
    ("Answer: 3 or 4", "4", 0.0),
    ("Answer: \\boxed{3} or 4", "3", 0.0),  # a box inside the line does not hide the hedge
    # the last convention wins
    ("Answer: 5\nOn second thought, \\boxed{6}", "6", 1.0),
    ("\\boxed{6}\nAnswer: 5", "6", 0.0),
    ("#### 5\nAnswer: 6", "6", 1.0),
    # "the answer is"
    ("The answer is 1,000,000.", "1000000", 1.0),
    ("So the final answer is $\\boxed{42}$.", "42", 1.0),
    ("The answer is 42. Check: 6 * 7 = 42.", "42", 1.0),
    ("I think the answer is 41 or 42.", "42", 0.0),
    # no convention: 0 by default (reward.require_marker=true)
    ("The total is 42.", "42", 0.0),
    ("", "42", 0.0),
]


@pytest.mark.parametrize(("completion", "gold", "expected"), CASES)
def test_answer_conventions(completion: str, gold: str, expected: float) -> None:
    assert correctness_reward(completion, gold) == expected


def test_table_is_big_enough() -> None:
    assert len(CASES) >= 30 and {e for *_, e in CASES} == {0.0, 1.0}


def test_require_marker_false_falls_back_to_the_last_number() -> None:
    completions = ["The total is 42.", "The total is 41.", "\\boxed{7} so 42 in all"]
    samples = [{"gold": "42"}] * 3
    strict = compute_rewards(completions, samples, {"correctness": 1.0})
    loose = compute_rewards(completions, samples, {"correctness": 1.0}, require_marker=False)
    assert strict.total == [0.0, 0.0, 0.0]
    # a convention, when there is one, still decides: the box says 7
    assert loose.total == [1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("x\n#### 1,250", "1,250"),
        ("\\boxed{\\frac{a}{\\sqrt{b}}} end", "\\frac{a}{\\sqrt{b}}"),
        ("Answer: 5 apples\n", "5 apples"),
        ("the answer is 3.5.", "3.5"),
        ("\\boxed{1} and \\boxed{2}", "2"),
        ("no convention 5", None),
    ],
)
def test_find_answer(completion: str, expected: str | None) -> None:
    assert find_answer(completion) == expected


def test_boxed_gold_is_extracted() -> None:
    # MATH-style golds are whole solutions ending in a box
    assert extract_gold("so $x = \\boxed{\\frac{1}{2}}$.") == "\\frac{1}{2}"


def test_format_bonus_still_needs_the_instructed_line() -> None:
    # The prompt asks for 'Answer:'; other conventions earn correctness, not the format bonus.
    assert format_reward("work\nAnswer: 1250") == 1.0
    assert format_reward("work\n#### 1250") == 0.0
    assert format_reward("work\n\\boxed{1250}") == 0.0
    assert format_reward("Answer: 5\nAnswer: 5") == 0.0
