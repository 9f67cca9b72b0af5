"""Shared fixtures: an isolated logs directory and a way to run the real CLIs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_hpc.train.supervision import gc_schedule

from . import slowdown

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    """Measure the machine's slowdown once (tests/slowdown.py), in the process that starts
    the xdist workers (they inherit the variable), before any test runs."""
    if hasattr(config, "workerinput") or slowdown.ENV in os.environ:
        return
    os.environ[slowdown.ENV] = str(slowdown.factor_from(slowdown.measure_import_s()))


def _stretch_line() -> str:
    return f"time bounds stretched x{slowdown.factor()} (tests/slowdown.py)"


def pytest_report_header() -> str:
    return _stretch_line()


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 - pytest's reporter
    """The factor again at the end, where a ``-q`` run (CI's) shows it."""
    terminalreporter.write_line(_stretch_line())


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[None]:
    """Collection imports torch, transformers and the package into every pytest process
    that collects (each xdist worker): with Python's automatic collection off, and frozen
    after, as the trainer's entry point imports them
    (grpo_hpc.train.supervision.gc_schedule.imports_frozen): ~11.7 -> ~6 CPU s a process,
    and no later pass in a worker walks them again."""
    with gc_schedule.imports_frozen():
        yield


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """scripts/test.sh runs the suite on pytest-xdist workers (``--dist loadgroup``). The
    tests of the real Slurm cluster mostly wait on Slurm; they run in two groups, each one
    test after another on its own worker, while the other workers run the rest:
    ``slurm-multi``, the two-node tests on partition ``multi`` (nodes grpo-n1 and grpo-n2,
    which they kill and restart), and ``slurm``, every other one (partition ``debug`` on
    localhost's two CPUs; the fleet's step-0 hang job on grpo-n1, the node never killed).
    A module whose tests share a module-scoped fixture is a group of its own, so that the
    fixture is made once in the session, not once on each worker its tests reach.
    What the two groups share is kept apart by tests/integration/slurm_helpers.cluster_lock
    (slurmctld stopped only while no two-node test runs) and by up.sh running once a
    session (tests/integration/conftest.py). The session's converted SmolLM2 is converted
    once and shared by every worker (tests/e2e/conftest.py)."""
    here = REPO / "tests" / "integration"
    multi = {here / "test_multinode_slurm.py", here / "test_multinode_completing_slurm.py"}
    multi.add(here / "test_split_nodes_slurm.py")
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(
                pytest.mark.xdist_group("slurm-multi" if item.path in multi else "slurm")
            )
        elif _uses_module_fixture(item):
            # Its module's tests share what the fixture made (trained runs, saved models):
            # spread over workers, each worker made it again (the families' and algorithm
            # options' runs, the stop-in-evaluation runs twice each; export runs 3 times)
            item.add_marker(pytest.mark.xdist_group(str(item.path.relative_to(REPO))))
    # Longest first: xdist deals tests out in this order, so a long test dealt out last
    # would run on alone at the end while the other workers idle. The Slurm groups first,
    # then the end-to-end tests and modules with a test marked slow (whole modules, so a
    # module fixture is made once), then the quick ones.
    rank: dict[Path, int] = {}
    for item in items:
        kind = 2
        if item.path.is_relative_to(REPO / "tests" / "integration"):
            kind = 0
        elif item.get_closest_marker("slow") or item.path.is_relative_to(REPO / "tests" / "e2e"):
            kind = 1
        rank[item.path] = min(rank.get(item.path, 2), kind)
    items.sort(key=lambda item: rank[item.path])  # stable: the order within a module stays
    _stretch_timeout_marks(items)


def _stretch_timeout_marks(items: list[pytest.Item]) -> None:
    """A test's ``@pytest.mark.timeout(N)`` is a guard: stretched like the others
    (tests/slowdown.py). The stretched mark goes first, so it is the one pytest-timeout
    reads."""
    for item in items:
        mark = item.get_closest_marker("timeout")
        if mark is not None and mark.args:
            item.add_marker(pytest.mark.timeout(slowdown.guard(mark.args[0])), append=False)


def _uses_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a module-scoped fixture (pytest makes it once per process)."""
    info = getattr(item, "_fixtureinfo", None)  # absent on items that are not functions
    if info is None:
        return False
    return any(defs[-1].scope == "module" for defs in info.name2fixturedefs.values() if defs)


# torch.cuda.get_arch_list() of a CUDA 12.6 build (PyTorch's CUDA support matrix: Maxwell
# 5.0 through Hopper 9.0, Volta included), which covers every profile's gpu_capability.
CU126_ARCH_LIST = "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90"


@pytest.fixture(autouse=True)
def _torch_arch_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """grpo-submit refuses a torch without kernels for the profile's GPUs, a CPU build
    included (grpo_hpc.node.torch_build), and CI's torch is a CPU build: every test
    (and the CLIs it starts) sees a CUDA 12.6 build's arch list instead, so a dry run of a
    GPU profile tests what it means to, not this machine's torch. The tests of that check
    set their own list or remove this one (tests/unit/node/test_torch_arch.py)."""
    monkeypatch.setenv("GRPO_HPC_TORCH_ARCH_LIST", CU126_ARCH_LIST)
    monkeypatch.setenv("GRPO_HPC_TORCH_CUDA", "12.6")


@pytest.fixture
def logs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "logs"
    monkeypatch.setenv("GRPO_HPC_LOGS", str(d))
    return d


def run_cli(module_main: str, *args: str, env: dict | None = None, timeout: float = 600):
    """Run a console script's main through a fresh interpreter, like a user would."""
    mod, fn = module_main.split(":")
    code = f"import sys; from {mod} import {fn}; sys.exit({fn}(sys.argv[1:]))"
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=slowdown.guard(timeout),
        cwd=REPO,
    )


def make_checkpoint(paths, step: int, complete: bool = True) -> Path:  # noqa: ANN001
    """A small checkpoint directory of the trainer's gathered layout (placeholder bytes,
    a real manifest) that resume counts as complete (grpo_hpc.core.manifest.is_complete)."""
    from grpo_hpc.core.manifest import COMPLETE_MARKER, write_manifest

    d = paths.checkpoint(step)
    d.mkdir(parents=True)
    for name in ("model.pt", "optim.pt", "trainer.pt", "rng-rank0.pt"):
        (d / name).write_bytes(f"{name} {step}".encode())
    write_manifest(d, extra={"format": "gathered", "world_size": 1})
    if complete:
        (d / COMPLETE_MARKER).write_text("1\n")
    return d
