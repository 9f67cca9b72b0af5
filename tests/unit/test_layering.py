"""Which module may import which (issue 14, "the house"): read from the source, so a new
import that turns a one-way dependency into a cycle fails here."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "grpo_hpc"


def imports_of(rel: str) -> set[str]:
    """Every grpo_hpc module a file imports, at the top or inside a function."""
    tree = ast.parse((PKG / rel).read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m.startswith("grpo_hpc")}


def test_native_engine_does_not_import_rollout() -> None:
    """rollout builds the native engine; the engine gets the shared types from
    rollout_types, never from rollout (they used to import each other)."""
    assert "grpo_hpc.train.rollout" not in imports_of("train/native/engine.py")
    assert "grpo_hpc.train.rollout" not in imports_of("train/rollout_types.py")
    assert not any(
        m.startswith("grpo_hpc.train.native") for m in imports_of("train/rollout_types.py")
    )


def test_one_home_for_starting_the_next_attempt() -> None:
    """grpo-submit --resume and the monitor both start attempts through grpo_hpc.attempts;
    the command-line layer imports no monitor internals, and attempts imports neither."""
    assert not any(m.startswith("grpo_hpc.monitor") for m in imports_of("cli.py"))
    assert "grpo_hpc.attempts.start_next_attempt" in imports_of("cli.py")
    assert "grpo_hpc.attempts.start_next_attempt" in imports_of("monitor.py")
    low = imports_of("attempts.py")
    assert not any(m.startswith(("grpo_hpc.monitor", "grpo_hpc.cli")) for m in low)
    assert not (PKG / "adoption.py").exists()


def test_export_layers_point_one_way() -> None:
    """grpo-export in layers: export (planning, command line) -> export_write (writing) ->
    export_sources (reading) -> export_plan (pure decisions); no layer imports one above it,
    and the trainer's held-out evaluation sits above train.evaluation, never below it."""
    layers = ["export.py", "export_write.py", "export_sources.py", "export_plan.py"]
    for i, rel in enumerate(layers):
        above = {f"grpo_hpc.{name.removesuffix('.py')}" for name in layers[:i]}
        found = imports_of(rel)
        assert not any(m in above or m.rsplit(".", 1)[0] in above for m in found), rel
    assert not any(m.startswith("grpo_hpc.") for m in imports_of("export_plan.py"))
    assert "grpo_hpc.train.held_out" not in imports_of("train/evaluation.py")
    assert "grpo_hpc.train.trainer" not in imports_of("train/held_out.py")
