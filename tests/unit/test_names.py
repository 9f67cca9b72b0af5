"""Names say what a thing is or does, never which issue or which day made it (the shared
architecture note: history belongs in bench/results/LOG.md and git). Read from the source:
the package's text, every test's name and text, and module-level names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "grpo_hpc"
ISSUE = re.compile(r"(?<![a-z])issues?[ _#-]*\d+", re.IGNORECASE)
"""``issue 38``, ``Issue 24``, ``issues 14 and 39``, ``issue_53``, ``issue#7``."""
WHEN_WORDS = re.compile(r"^(LEGACY|OLD|NEW)_|_(LEGACY|OLD|NEW)$")
"""Constants named for when they were written rather than what they hold."""


def package_text_files() -> list[Path]:
    return [
        p
        for p in sorted(PKG.rglob("*"))
        if p.is_file() and p.suffix in {".py", ".j2", ".yaml", ".md", ".txt"}
    ]


def issue_mentions(text: str) -> list[str]:
    return ISSUE.findall(text)


def test_the_pattern_finds_issue_numbers() -> None:
    found = issue_mentions("(issue 38: 0.1 s), Issue 24, third pass; issues 14 and 39")
    assert found == ["issue 38", "Issue 24", "issues 14"]
    assert issue_mentions("test_every_family_of_issue_53_is_here") == ["issue_53"]
    assert issue_mentions("the issued token; an issue with 3 ranks; tissue 5") == []


def test_no_issue_numbers_in_the_package() -> None:
    wrong = [
        f"{p.relative_to(ROOT)}:{n}: {m}"
        for p in package_text_files()
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        for m in issue_mentions(line)
    ]
    assert wrong == []


def test_no_issue_numbers_in_test_names() -> None:
    wrong = []
    for p in sorted((ROOT / "tests").rglob("*.py")):
        if issue_mentions(p.name):
            wrong.append(str(p.relative_to(ROOT)))
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and issue_mentions(node.name):
                wrong.append(f"{p.relative_to(ROOT)}: {node.name}")
    assert wrong == []


def test_no_issue_numbers_in_the_tests() -> None:
    """Test docstrings and comments say what a test proves, not which issue asked for it
    (this file's own examples of the pattern aside)."""
    wrong = [
        f"{p.relative_to(ROOT)}:{n}: {m}"
        for p in sorted((ROOT / "tests").rglob("*.py"))
        if p != Path(__file__).resolve()
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        for m in issue_mentions(line)
    ]
    assert wrong == []


def test_no_constants_named_for_when() -> None:
    wrong = []
    for p in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                if node.id.isupper() and WHEN_WORDS.search(node.id):
                    wrong.append(f"{p.relative_to(ROOT)}: {node.id}")
    assert wrong == []
