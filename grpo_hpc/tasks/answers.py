"""Where the final answer is: the last answer convention in a completion (``Answer:``,
``#### N``, ``\\boxed{}``, "the answer is"), the gold, and the exact numeric pre-judge that
settles most items without math-verify."""

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
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
# "####" must be followed by a number: a markdown heading ("#### Step 2") is not an answer.
_LINE_RE = re.compile(
    r"Answer:|####(?=[ \t]*[-+\u2212$\\(]?[ \t]*[\d.])"
    r"|(?P<phrase>(?i:\b(?:final )?answer is\b)):?"
)
_SENTENCE_END_RE = re.compile(r"\.(?=\s|$)")
_EDGE_BOLD_RE = re.compile(r"^\s*\*\*|\*\*\s*\.?\s*$")
_BOLD_RE = re.compile(r"\*\*([^*]+)\*\*")
# LaTeX unit text ("\text{ cm}^2") and a unit's exponent ("cm^2"): not part of the number.
_UNIT_RE = re.compile(
    r"\\(?:text|textbf|mathrm|mbox)\s*\{[^{}]*\}(?:\s*\^\s*(?:\{\s*[23]\s*\}|[23]))?"
    r"|(?<=[A-Za-z])\^(?:\{\s*[23]\s*\}|[23])"
)


def _boxed_spans(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, content)`` of every complete ``\boxed{...}``/``\fbox{...}`` (braces
    balanced; a box cut off by the token limit is no answer)."""
    spans = []
    for m in _BOXED_RE.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            spans.append((m.start(), i, text[m.end() : i - 1].strip()))
    return spans


def _line_spans(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, text)`` of every ``Answer:`` line, ``#### N`` line and "the answer is"
    sentence: the marker to the end of its line (of its sentence, for the phrase)."""
    spans = []
    for m in _LINE_RE.finditer(text):
        end = text.find("\n", m.end())
        end = len(text) if end < 0 else end
        if m.group("phrase"):
            stop = _SENTENCE_END_RE.search(text, m.end(), end)
            end = stop.start() if stop else end
        spans.append((m.start(), end, text[m.end() : end].strip()))
    return spans


def find_answer(completion: str) -> str | None:
    """The final answer: the text of the **last** answer convention in ``completion``, or None.

    Conventions: an ``Answer:`` line (what the prompt asks for), a GSM8K ``#### N`` line,
    a ``\boxed{...}`` (what math-tuned models write) and "the (final) answer is ...". The
    last one wins, so a self-correction (``\boxed{7} ... actually \boxed{8}``) is judged by
    its correction. A box inside an answer line belongs to that line: "Answer: \boxed{3}
    or 4" is judged as the whole line (a hedge), not as its box.
    """
    lines = _line_spans(completion)
    boxes = [b for b in _boxed_spans(completion) if not any(s <= b[0] < e for s, e, _ in lines)]
    candidates = lines + boxes
    if not candidates:
        return None
    return _strip_markdown(max(candidates)[2])


def _strip_markdown(text: str) -> str:
    """``**Answer:** 42`` and ``Answer: **42**``: drop the bold, which reads as a power."""
    return _BOLD_RE.sub(r"\1", _EDGE_BOLD_RE.sub("", text)).strip()


def extract_answer(completion: str, last_number_fallback: bool = False) -> str | None:
    """The final answer (:func:`find_answer`); None if the completion has no convention.

    With ``last_number_fallback`` a completion without any convention is judged by its last
    number instead: small models (SmolLM2-135M) seldom follow the format at first, and
    this gives GRPO a signal to start from (``reward.require_marker=false``).
    """
    answer = find_answer(completion)
    if answer is None and last_number_fallback:
        numbers = re.findall(r"[-\u2212]?\d[\d,]*(?:\.\d+)?", completion)
        return numbers[-1] if numbers else None
    return answer


def extract_gold(answer_text: str) -> str:
    """The gold answer: GSM8K's last ``####`` (first line, commas stripped), else a MATH-style
    solution's last ``\boxed{...}``, else the text itself (stripped, otherwise untouched)."""
    text = str(answer_text)
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        return tail.split("\n", 1)[0].replace(",", "").strip()
    boxes = _boxed_spans(text)
    return boxes[-1][2] if boxes else text.strip()


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
    plain = _UNIT_RE.sub(" ", answer)
    values = numeric_values(plain)
    if not values or len(values) != 1 or _BLOWUP_RE.search(plain):
        return 0.0
    return 1.0 if values == {gold_number} else None  # e.g. 0.333333 vs 1/3: math-verify


# The prompt's instruction for math tasks: the answer convention the rewards look for first.
ANSWER_INSTRUCTION = (
    "Solve the problem. Reason step by step, then end your reply with a final line of the "
    "form 'Answer: <number>' containing only the number (no units). Write 'Answer:' only once."
)
