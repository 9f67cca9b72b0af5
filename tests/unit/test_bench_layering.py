"""Which part of bench/ may import which, read from the source (as test_layering.py does for
grpo_hpc/), and every ``python -m bench.X`` the repository writes names a module that exists.

bench/ stands in three layers: the shared modules at its top (``common.py``: shapes, models,
results; ``sums_task.py``: the task the learning and collapse benchmarks share), a folder per
subject above them, and ``probes/`` (one-question scripts) on top. A subject imports its own
folder and the shared modules, never another subject; nothing imports a probe but a probe;
no module imports back into a circle. A subject that needs another's code says so by moving
that code down into the shared layer (bench/README.md, "Changing a benchmark").
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

SHARED = {"common", "sums_task"}
SUBJECTS = {"learning", "collapse", "memory", "trl", "decode", "faults", "speed"}
PROBES = "probes"
DATA_FOLDERS = {"gpu", "results", "shapes"}  # stage files, result files, model configs: no code


def module_name(path: Path) -> str:
    """``bench/memory/ladder.py`` -> ``bench.memory.ladder``; a package's ``__init__.py`` is
    the package itself."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def bench_modules() -> dict[str, Path]:
    """Every Python module of bench/ (the result files hold none worth reading)."""
    found = {}
    for path in sorted(BENCH.rglob("*.py")):
        if path.relative_to(BENCH).parts[0] not in DATA_FOLDERS:
            found[module_name(path)] = path
    return found


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The bench modules a file imports, at its top or inside a function: ``from bench.x
    import y`` counts as ``bench.x.y`` where that is a module, else as ``bench.x``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m == "bench" or m.startswith("bench.")}


def part_of(module: str) -> str:
    """The shared module, subject or ``probes`` a module belongs to."""
    return module.split(".")[1] if "." in module else "bench"


def import_graph() -> dict[str, set[str]]:
    modules = bench_modules()
    known = set(modules)
    return {m: imports_of(p, known) & known - {m} for m, p in modules.items()}


def layering_breaks(graph: dict[str, set[str]]) -> list[str]:
    """Each import that points up or across: from the shared layer to anything but itself,
    from a subject to another subject or to a probe, from anywhere but probes to a probe."""
    wrong = []
    for module, targets in graph.items():
        own = part_of(module)
        for target in targets:
            other = part_of(target)
            if other in {own, "bench"}:
                continue
            if own in SHARED and other in SHARED:
                continue  # the shared layer may lean on itself
            if own in SHARED:
                wrong.append(f"{module} (shared) imports {target}")
            elif own in SUBJECTS and other not in SHARED:
                wrong.append(f"{module} ({own}) imports {target} ({other})")
            elif own not in SUBJECTS and own != PROBES:
                wrong.append(f"{module} sits in no layer")
    return sorted(wrong)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of a graph (its strongly connected parts of more than one module),
    by Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_sits_in_a_layer() -> None:
    """bench/'s top holds the shared modules only; every folder of code is a subject or the
    probes, and says what it holds in its ``__init__.py``."""
    top = {p.stem for p in BENCH.glob("*.py")} - {"__init__"}
    assert top == SHARED
    folders = {p.name for p in BENCH.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == SUBJECTS | {PROBES} | DATA_FOLDERS
    for name in SUBJECTS:
        init = BENCH / name / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), init


def test_imports_point_down_never_across() -> None:
    assert layering_breaks(import_graph()) == []


def test_no_import_circle() -> None:
    assert circles(import_graph()) == []


def test_the_checks_see_a_wrong_import() -> None:
    """The two checks above on a graph with a cross import and a circle added: both notice
    (a check that sees nothing passes anything)."""
    graph = import_graph()
    assert "bench.common" in graph["bench.memory.ladder"]  # the graph has the real edges
    graph["bench.learning.results"] = graph["bench.learning.results"] | {"bench.learning.run"}
    graph["bench.trl.baseline"] = graph["bench.trl.baseline"] | {"bench.speed.grpo_step"}
    assert layering_breaks(graph) == [
        "bench.trl.baseline (trl) imports bench.speed.grpo_step (speed)"
    ]
    assert ["bench.learning.results", "bench.learning.run"] in circles(graph)


MODULE_RE = re.compile(r"""(?:-m\s+|["']-m["'],\s*["'])(bench(?:\.\w+)+)(?!\w|\.<)""")
"""``python -m bench.x.y`` in prose and shell, ``"-m", "bench.x.y"`` in a Python list; not
one with a placeholder (``bench.probes.<name>``)."""


def quoted_commands() -> dict[str, set[str]]:
    """Each ``-m bench.X`` the repository writes, with the files that write it: code, stage
    files, tests, the READMEs and docs (not the result files: they record what ran then)."""
    files = [*BENCH.glob("*.py"), *BENCH.glob("*.sh"), *BENCH.glob("*.md")]
    for folder in [*SUBJECTS, PROBES, "gpu"]:
        files += [p for p in (BENCH / folder).rglob("*") if p.suffix in {".py", ".sh", ".md"}]
    files += [p for p in (ROOT / "tests").rglob("*.py") if p != Path(__file__).resolve()]
    files += [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    files += [BENCH / "results/LOG.md", *BENCH.glob("results/LOG-*.md")]
    found: dict[str, set[str]] = {}
    for path in files:
        for name in MODULE_RE.findall(path.read_text(encoding="utf-8")):
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def runnable(name: str) -> bool:
    """``python -m NAME`` finds a module, or a package with a ``__main__.py``."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


def test_every_quoted_bench_command_names_a_module() -> None:
    commands = quoted_commands()
    assert "bench.learning" in commands and "bench.memory.ladder" in commands  # finder works
    missing = {name: sorted(files) for name, files in commands.items() if not runnable(name)}
    assert missing == {}
