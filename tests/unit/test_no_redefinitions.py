"""No module defines one top-level function or class twice.

ruff's F811 stays silent when the first definition is referenced before the second one
(from a function body, say), yet the second silently replaces the first for every caller:
a test helper extracted twice under one name once made a test run another test's scenario
instead of its own (tests/integration/test_monitor_slurm.py, found 2026-12-02)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for d in ("grpo_hpc", "bench", "tests") for p in (REPO / d).rglob("*.py"))


def redefinitions(source: str) -> list[str]:
    """Top-level function and class names defined more than once, with their lines (a
    definition under ``if``/``try`` at top level is an alternative, not counted)."""
    seen: dict[str, int] = {}
    twice = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name in seen:
                twice.append(f"{node.name} (lines {seen[node.name]} and {node.lineno})")
            seen[node.name] = node.lineno
    return twice


def test_the_rule_sees_a_helper_defined_twice() -> None:
    source = "def a():\n    return b()\n\ndef b():\n    return 1\n\ndef b():\n    return 2\n"
    assert redefinitions(source) == ["b (lines 4 and 7)"]
    assert redefinitions("def a():\n    pass\n\nclass A:\n    pass\n") == []


def test_no_top_level_name_is_defined_twice() -> None:
    found = {str(p.relative_to(REPO)): redefinitions(p.read_text()) for p in SOURCES}
    found = {path: twice for path, twice in found.items() if twice}
    assert len(SOURCES) > 100 and found == {}
