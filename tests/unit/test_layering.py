"""Which package may import which: read from the source, so
a new import that points the wrong way fails here, not in a newcomer's head.

The packages stand in layers (docs/ARCHITECTURE.md draws them); a module imports its own
package and the layers below, never one above or beside it. Inside train/ the same: the loop
(trainer.py, __main__.py) on top, and beneath it packages in layers of their own.
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
    "node": 2,  # compute node: the per-node launcher submit pickles, the job's torch check
    "submit": 3,  # login node: preflight, plan, render, submit
    "train": 3,  # compute node: the trainer (never imports submit, nor submit it)
    "monitor": 4,  # decisions and attempts (starts jobs through submit)
    "export": 5,  # checkpoints out: reads the trainer's checkpoint format
    "status": 6,  # grpo-status: shows monitor decisions and export state
    "evaluate": 7,  # grpo-eval: models, export, a job through submit
    "cli": 8,  # the thin mains
}
# The packages a login node runs (grpo-submit, grpo-status, grpo-monitor): no torch.
# node/ runs on compute nodes, but submit pickles its launcher: torch-free at import too.
LOGIN_NODE = ("core", "config", "memory", "tasks", "node", "submit", "monitor", "status")
# Imports that point up on purpose, each with its reason.
ALLOWED_UP = {
    # The trainer writes final/ with grpo-export's own writer: one writer of that format.
    ("train/trainer.py", "grpo_hpc.export"),
    ("train/trainer.py", "grpo_hpc.export.run"),
}
# Inside train/: the loop (trainer.py, __main__.py, the only modules at its top) imports any
# of these packages; none of them imports the loop. A package imports its own modules and
# the layers below it, never one above or beside it, but for the step's work (algo/,
# rollout/, rewards/), whose packages import one another.
TRAIN_LAYER = {
    "distributed": 0,  # the ranks: process group, wrapping, agreement, each rank's CPUs
    "measure": 1,  # progress and metrics (tracking), the step's row, profiler, stall sampler
    "algo": 2,  # the step's work: advantages, loss, the update
    "rollout": 2,  # the step's work: generation, the native engine, one step's rollouts
    "rewards": 2,  # the step's work: rewards, verifier, sandbox
    "state": 3,  # its state on disk: checkpoints, their space, state digests
    "supervision": 3,  # signals, pulses, breakers, the gc schedule, fault injection
    "evaluation": 3,  # held-out scoring (shared with grpo-eval) and the trainer's run of it
    "setup": 3,  # the model and tokenizer, each auto setting resolved for this device
}
# generator.py: a split run's generator process (rollout.placement=split), a loop of its own
TRAIN_LOOP = ("__init__.py", "__main__.py", "trainer.py", "generator.py")
TRAIN_TOGETHER = {"algo", "rollout", "rewards"}
# Imports inside train/ that point up on purpose, each with its reason.
TRAIN_ALLOWED_UP = {
    # One step's metrics row is made of the step's selection (its rewards, its batches).
    ("train/measure/step_report.py", "grpo_hpc.train.algo.batching"),
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


def test_train_top_holds_the_loop_and_packages_only() -> None:
    """train/'s top level: the loop and its entry point; everything else in a package of a
    layer of TRAIN_LAYER."""
    train = PKG / "train"
    assert sorted(p.name for p in train.glob("*.py")) == sorted(TRAIN_LOOP)
    packages = {p.name for p in train.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(TRAIN_LAYER)


def test_train_packages_point_down_and_never_import_the_loop() -> None:
    """Inside train/: no package imports trainer.py or __main__.py, nor a package above its
    own or beside it (the step's work, algo/ rollout/ rewards/, excepted among itself)."""
    loop = {f"grpo_hpc.train.{m.removesuffix('.py')}" for m in TRAIN_LOOP if m != "__init__.py"}
    wrong = []
    for rel in modules():
        parts = rel.split("/")
        if parts[0] != "train" or len(parts) < 3:
            continue
        own = parts[1]
        for m in imports_of(rel):
            names = m.split(".")
            if names[:2] != ["grpo_hpc", "train"] or len(names) < 3:
                continue
            other = names[2]
            if m in loop or other in {n.removesuffix(".py") for n in TRAIN_LOOP}:
                wrong.append(f"{rel} imports the loop: {m}")
            elif other == own or any(
                rel == r and (m == a or m.startswith(f"{a}.")) for r, a in TRAIN_ALLOWED_UP
            ):
                continue
            elif other not in TRAIN_LAYER:
                wrong.append(f"{rel} imports {m}, in no package of TRAIN_LAYER")
            elif own in TRAIN_TOGETHER and other in TRAIN_TOGETHER:
                continue
            elif TRAIN_LAYER[other] >= TRAIN_LAYER[own]:
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
