"""Every canonical HumanEval solution scores 1 through the code reward (the real sandbox,
in parallel, about 5 s on two cores), and a wrong solution to each problem scores 0."""

from __future__ import annotations

import pytest

from grpo_hpc.tasks import code as code_data
from grpo_hpc.train.rewards import functions as rewards

pytestmark = pytest.mark.slow


def _completion(prompt: str, body: str) -> str:
    """How a model that follows the code prompt answers: the whole function, fenced."""
    return f"Here is the function.\n\n```python\n{prompt}{body}```\n"


def test_every_canonical_solution_scores_1_and_a_wrong_one_0() -> None:
    rows = code_data.humaneval_rows()
    assert len(rows) == 164
    problems = [code_data.humaneval_problem(r, r["task_id"]) for r in rows]
    right = [_completion(r["prompt"], r["canonical_solution"]) for r in rows]
    # Wrong: each function given the body of the next problem's solution.
    shifted = rows[1:] + rows[:1]
    pairs = zip(rows, shifted, strict=True)
    wrong = [_completion(r["prompt"], s["canonical_solution"]) for r, s in pairs]
    scores = rewards.code_scores(right + wrong, problems + problems)
    failed = [p["task_id"] for p, s in zip(problems, scores[:164], strict=True) if s != 1.0]
    passed_wrong = [p["task_id"] for p, s in zip(problems, scores[164:], strict=True) if s != 0.0]
    assert failed == [], f"canonical solutions that do not score 1: {failed}"
    assert passed_wrong == [], f"wrong solutions that score 1: {passed_wrong}"
