"""Which package may import which (issues 14 and 39, "the house"): read from the source, so
a new import that points the wrong way fails here, not in a newcomer's head.

The packages stand in layers (docs/ARCHITECTURE.md draws them); a module imports its own
package and the layers below, never one above or beside it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "grpo_hpc"

LAYER = {
    "core": 0,  # files, progress, manifests, Slurm queries: below everything
    "config": 1,  # schema, loading, profiles, what auto means
    "memory": 2,  # the estimator and what both sides ask of it
    "tasks": 2,  # problems and answers, read by preflight and the trainer alike
    "submit": 3,  # login node: preflight, plan, render, submit
    "train": 3,  # compute node: the trainer (never imports submit, nor submit it)
    "monitor": 4,  # decisions and attempts (starts jobs through submit)
    "export": 5,  # checkpoints out: reads the trainer's checkpoint format
    "status": 6,  # grpo-status: shows monitor decisions and export state
    "evaluate": 7,  # grpo-eval: models, export, a job through submit
    "cli": 8,  # the thin mains
}
# The packages a login node runs (grpo-submit, grpo-status, grpo-monitor): no torch.
LOGIN_NODE = ("core", "config", "memory", "tasks", "submit", "monitor", "status")
# Imports that point up on purpose, each with its reason.
ALLOWED_UP = {
    # The trainer writes final/ with grpo-export's own writer: one writer of that format.
    ("train/trainer.py", "grpo_hpc.export"),
    ("train/trainer.py", "grpo_hpc.export.run"),
}


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


def package_of(module: str) -> str | None:
    """The top package of ``grpo_hpc.<package>...``; None for grpo_hpc itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYER else None


def modules() -> list[str]:
    return sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py"))


def test_every_package_has_a_layer_and_no_module_sits_flat() -> None:
    """The folder tree is the architecture: every module lives in a package of a layer."""
    tops = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert tops == set(LAYER)
    flat = [m for m in modules() if "/" not in m and m != "__init__.py"]
    assert flat == []


def test_imports_point_down() -> None:
    """No module imports a package above its own, or beside it in the same layer."""
    wrong = []
    for rel in modules():
        own = rel.split("/")[0]
        if own not in LAYER:
            continue
        for m in imports_of(rel):
            other = package_of(m)
            if other is None or other == own or (rel, m) in ALLOWED_UP:
                continue
            if LAYER[other] >= LAYER[own]:
                wrong.append(f"{rel} imports {m}")
    assert wrong == []


def test_login_node_packages_import_no_trainer_and_no_torch() -> None:
    """grpo-submit, grpo-status and grpo-monitor run on login nodes without a GPU stack: their
    packages import nothing of train/, and importing them loads no torch."""
    for rel in modules():
        if rel.split("/")[0] in LOGIN_NODE:
            assert not any(m.startswith("grpo_hpc.train") for m in imports_of(rel)), rel
    names = [f"grpo_hpc.{p}" for p in LOGIN_NODE] + [
        "grpo_hpc.cli.submit",
        "grpo_hpc.cli.status",
        "grpo_hpc.cli.monitor",
    ]
    mods = [rel.removesuffix(".py").replace("/", ".") for rel in modules()]
    names += [f"grpo_hpc.{m}" for m in mods if m.split(".")[0] in LOGIN_NODE]
    code = (
        "import importlib, sys\n"
        f"for n in {names!r}: importlib.import_module(n.removesuffix('.__init__'))\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_native_engine_does_not_import_rollout() -> None:
    """rollout builds the native engine; the engine gets the shared types from
    rollout.types, never from rollout.engines (they used to import each other)."""
    assert "grpo_hpc.train.rollout.engines" not in imports_of("train/rollout/native/engine.py")
    assert "grpo_hpc.train.rollout.engines" not in imports_of("train/rollout/types.py")
    assert not any(
        m.startswith("grpo_hpc.train.rollout.native") for m in imports_of("train/rollout/types.py")
    )


def test_one_home_for_starting_the_next_attempt() -> None:
    """grpo-submit --resume and the monitor both start attempts through monitor.attempts;
    the monitor's loop is not imported by the submit command, and attempts imports neither."""
    assert "grpo_hpc.monitor.loop" not in imports_of("cli/submit.py")
    assert "grpo_hpc.monitor.attempts.start_next_attempt" in imports_of("cli/submit.py")
    assert "grpo_hpc.monitor.attempts.start_next_attempt" in imports_of("monitor/loop.py")
    low = imports_of("monitor/attempts.py")
    assert not any(m.startswith(("grpo_hpc.monitor.loop", "grpo_hpc.cli")) for m in low)


def test_export_layers_point_one_way() -> None:
    """grpo-export in layers: run (planning) -> write (writing) -> sources (reading) -> plan
    (pure decisions); no layer imports one above it, and the trainer's held-out evaluation
    sits above train.evaluation.scoring, never below it."""
    layers = ["export/run.py", "export/write.py", "export/sources.py", "export/plan.py"]
    for i, rel in enumerate(layers):
        above = {f"grpo_hpc.{name.removesuffix('.py').replace('/', '.')}" for name in layers[:i]}
        found = imports_of(rel)
        assert not any(m in above or m.rsplit(".", 1)[0] in above for m in found), rel
    assert not any(m.startswith("grpo_hpc.") for m in imports_of("export/plan.py"))
    assert "grpo_hpc.train.evaluation.held_out" not in imports_of("train/evaluation/scoring.py")
    assert "grpo_hpc.train.trainer" not in imports_of("train/evaluation/held_out.py")
