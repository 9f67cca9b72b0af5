"""Where the final answer is: the ``Answer:`` line, the GSM8K gold, and the exact numeric
pre-judge that settles most items without math-verify."""

from __future__ import annotations

import re
from fractions import Fraction

MARKER = "Answer:"
MAX_ANSWER_CHARS = 300
"""Longer answer lines score 0 (padding, not an answer); this also bounds parse time."""

NUM = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+"
_TOKEN_RE = re.compile(rf"([-\u2212]?)({NUM})(?:\s*/\s*({NUM}))?")
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{\s*([-\u2212]?[\d.,]+)\s*\}\s*\{\s*([\d.,]+)\s*\}")
_BLOWUP_RE = re.compile(r"\^|\*\*|!")  # powers/factorials: not a plain number, can hang sympy


def extract_answer(completion: str, last_number_fallback: bool = False) -> str | None:
    """Text after the last ``Answer:`` marker, up to the end of that line; None if absent.

    With ``last_number_fallback`` a completion without the marker is judged by its last
    number instead: small models (SmolLM2-135M) seldom follow the format at first, and
    this gives GRPO a signal to start from (``reward.require_marker=false``).
    """
    idx = completion.rfind(MARKER)
    if idx < 0:
        if not last_number_fallback:
            return None
        numbers = re.findall(r"[-\u2212]?\d[\d,]*(?:\.\d+)?", completion)
        return numbers[-1] if numbers else None
    return completion[idx + len(MARKER) :].split("\n", 1)[0].strip()


def extract_gold(answer_text: str) -> str:
    """GSM8K gold: what follows the last ``####`` (first line, commas stripped).

    Text without ``####`` is taken as the gold itself (stripped, otherwise untouched).
    """
    text = str(answer_text)
    if "####" not in text:
        return text.strip()
    tail = text.rsplit("####", 1)[1].strip()
    return tail.split("\n", 1)[0].replace(",", "").strip()


def numeric_values(text: str) -> set[Fraction] | None:
    """Distinct numbers in ``text`` (``1,000`` is one number, ``3/4`` and ``\\frac{3}{4}`` one
    fraction); None if one cannot be represented (division by zero, absurd length)."""
    text = _FRAC_RE.sub(r"\1/\2", text)
    values: set[Fraction] = set()
    try:
        for sign, num, den in _TOKEN_RE.findall(text):
            value = Fraction(num.replace(",", "")) / Fraction(den.replace(",", "") or 1)
            values.add(-value if sign else value)
    except (ValueError, ZeroDivisionError):
        return None
    return values


def gold_value(gold: str) -> Fraction | None:
    """The gold as an exact number when it is a plain number (GSM8K), else None (symbolic)."""
    m = _TOKEN_RE.fullmatch(_FRAC_RE.sub(r"\1/\2", gold.strip().lstrip("$")))
    if m is None:
        return None
    values = numeric_values(m.group(0))
    return next(iter(values)) if values and len(values) == 1 else None


def prejudge(answer: str | None, gold: str) -> float | None:
    """Score without math-verify when the outcome is certain; None means "ask math-verify".

    For a numeric gold, the answer line must name exactly one distinct number: "3 or 4",
    "3, 4" or "18 (3 x 6)" score 0 even though math-verify (which takes the last number it
    finds) would accept "3 or 4" for a gold of 4 -- otherwise hedging is rewarded.
    """
    if not answer or not gold or len(answer) > MAX_ANSWER_CHARS:
        return 0.0
    gold_number = gold_value(gold)
    if gold_number is None:
        return None  # symbolic gold: math-verify alone decides
    values = numeric_values(answer)
    if not values or len(values) != 1 or _BLOWUP_RE.search(answer):
        return 0.0
    return 1.0 if values == {gold_number} else None  # e.g. 0.333333 vs 1/3: math-verify
