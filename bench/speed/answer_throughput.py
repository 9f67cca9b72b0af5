"""Throughput of answer extraction and correctness scoring (parse + verify), on CPU.

    python -m bench.speed.answer_throughput [--items 2000] [--repeat 3] [--out FILE.json]

Completions are GSM8K-style: ~900 characters of reasoning, then one of the answer
conventions (``Answer:``, ``#### N``, ``\\boxed{}``, "the answer is"). Four figures (best
of ``--repeat`` runs, items per second):

- ``find_answer``: locating the final answer in the completion (regex + brace matching);
- ``settled``: ``score_correctness_batch`` on items the exact pre-judge settles (exact and
  wrong numbers, hedges, missing answers): no math-verify call;
- ``worker``: ``score_correctness_batch`` on items that need math-verify (0.333333 vs 1/3,
  50\\% vs 0.5, symbolic golds), through the worker process;
- ``in_process``: math-verify ``parse`` + ``verify`` called directly on the same items
  (what the worker costs on top).
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import env_info, write_result
from grpo_hpc.tasks.answers import extract_gold, find_answer
from grpo_hpc.train.rewards.functions import score_correctness_batch

REASONING = (
    "Natalia sold 48 clips in April and half as many in May, so she sold 48 / 2 = 24 in May. "
    "Together that is 48 + 24 = 72 clips. Each clip costs $1.25, so she earned 72 * 1.25. "
) * 5

SETTLED = [
    ("Answer: {n}", "{n}"),
    ("#### {n:,}", "{n}"),
    ("So the answer is $\\boxed{{{n}}}$.", "{n}"),
    ("The answer is {n:,}.", "{n}"),
    ("Answer: {m}", "{n}"),
    ("\\boxed{{{m}}} or maybe \\boxed{{{n}}}", "{m}"),
    ("Answer: {m} or {n}", "{n}"),
    ("The total is {n}.", "{n}"),
]
NEEDS_VERIFY = [
    ("Answer: 0.333333", "1/3"),
    ("\\boxed{{50\\%}}", "0.5"),
    ("\\boxed{{\\frac{{\\sqrt{{2}}}}{{2}}}}", "\\frac{{1}}{{\\sqrt{{2}}}}"),
    ("Answer: 0.666667", "2/3"),
]


def make_items(templates: list[tuple[str, str]], n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        tail, gold = templates[i % len(templates)]
        a = rng.randint(1, 2_000_000)
        vals = {"n": a, "m": a + rng.randint(1, 9)}
        out.append((REASONING + tail.format(**vals), gold.format(**vals)))
    return out


def best_rate(fn: Callable[[], None], n: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return n / best


def in_process(items: list[tuple[str, str]]) -> None:
    from math_verify import parse, verify

    for completion, gold in items:
        answer = find_answer(completion) or ""
        verify(parse(f"${extract_gold(gold)}$"), parse(f"${answer}$"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=2000, help="items per measurement")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", type=Path, help="write the result JSON here")
    args = p.parse_args()
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    settled, verify_items = make_items(SETTLED, args.items), make_items(NEEDS_VERIFY, args.items)
    small = verify_items[: max(1, args.items // 4)]  # in-process math-verify is the slow one

    def score(items: list[tuple[str, str]]) -> Callable[[], None]:
        return lambda: score_correctness_batch([c for c, _ in items], [g for _, g in items])

    # The mixes score as designed (half of SETTLED is right, all of NEEDS_VERIFY), and
    # this starts the worker outside the timings.
    scores = {
        name: score_correctness_batch([c for c, _ in items], [g for _, g in items])
        for name, items in (("settled", settled), ("worker", verify_items))
    }
    means = {name: sum(v) / len(v) for name, v in scores.items()}
    if abs(means["settled"] - 0.5) > 1e-9 or means["worker"] != 1.0:
        raise SystemExit(f"unexpected scores {means}: the benchmark mix is broken")
    rates = {
        "find_answer": best_rate(lambda: [find_answer(c) for c, _ in settled], len(settled), 3),
        "settled": best_rate(score(settled), len(settled), args.repeat),
        "worker": best_rate(score(verify_items), len(verify_items), args.repeat),
        "in_process": best_rate(lambda: in_process(small), len(small), args.repeat),
    }
    from importlib.metadata import version

    result = {
        "bench": "answer_throughput",
        "items_per_s": {k: round(v, 1) for k, v in rates.items()},
        "items": args.items,
        "mean_score": means,
        "completion_chars": len(settled[0][0]),
        "math_verify": version("math-verify"),
        "env": env_info(),
    }
    write_result(result, args.out)
    for name, rate in rates.items():
        print(f"{name:12s} {rate:12,.0f} items/s")


if __name__ == "__main__":
    main()
