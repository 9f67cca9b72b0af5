"""One module writes each file of a run directory (docs/ARCHITECTURE.md, "One source of truth
per thing"): read from the source, as test_layering.py reads the imports, so a second writer
fails here rather than in a run whose files two modules disagree about.

A *write* is a low-level file operation (fsutil's appends and atomic writes, ``open``,
``Path.write_text``...) given a run file's path, ``paths.<file>`` (RunPaths in
core/paths.py). Everyone else goes through the owner's functions (``write_progress``,
``write_best``, ``events.append``...). events.jsonl is stricter: its path is handed to
core/events.py's functions only, for reading too.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "grpo_hpc"

OWNER = {
    "events": "core/events.py",  # the monitor's, a --resume's and the trainer's records
    "jobs": "submit/job.py",  # record_job (an adopted job too: submit.job.adopt)
    "config": "submit/job.py",  # written once, at submission
    "profile": "submit/job.py",
    "progress": "core/progress.py",  # write_progress / ProgressWriter; callers choose the record
    "best": "core/best.py",  # write_best, through train/state/best.py
    "metrics": "core/progress.py",  # ProgressWriter's appends (the Tracker hands it lines)
    "samples": "core/progress.py",
    "eval_samples_at": "train/measure/tracking.py",
    "job_summary": "node/launch.py",
    "training_log": "node/launch.py",
    "monitor_lock": "monitor/attempts.py",
    "trainer_lock": "train/state/checkpoint.py",
}
"""Each run file (its RunPaths attribute) and the one module that writes it."""
WRITES = {
    "append_jsonl",
    "append_text",
    "atomic_write_text",
    "atomic_write_json",
    "atomic_write_bytes",
    "open",
    "write_text",
    "write_bytes",
    "copyfile",
    "copy",
    "replace",
    "rename",
}
"""Calls that write (or open) the path they are given or called on."""
READS = {"read_jsonl", "tail_jsonl", "read_text", "read_bytes", "loads"}
"""Calls that read a file by hand: events.jsonl is read through its owner only."""
EVENTS_OWNER = "grpo_hpc.core.events"


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (str(p.relative_to(PKG)), ast.parse(p.read_text(encoding="utf-8")))
        for p in sorted(PKG.rglob("*.py"))
    ]


def _run_files(node: ast.AST) -> set[str]:
    """The run files a piece of an expression names: ``<anything>.<file>`` attributes, and
    literal names of events.jsonl; not inside a call of its own (that call is judged alone)."""
    if isinstance(node, ast.Call):
        return set()
    found = set()
    if isinstance(node, ast.Attribute) and node.attr in OWNER:
        found.add(node.attr)
    elif isinstance(node, ast.Constant) and node.value == "events.jsonl":
        found.add("events")
    for child in ast.iter_child_nodes(node):
        found |= _run_files(child)
    return found


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


def _handled(call: ast.Call) -> tuple[set[str], set[str]]:
    """(files given as arguments, files the call is a method of)."""
    args = set()
    for a in [*call.args, *(k.value for k in call.keywords)]:
        args |= _run_files(a)
    receiver = _run_files(call.func.value) if isinstance(call.func, ast.Attribute) else set()
    return args, receiver


def _owner_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(module aliases of core/events.py, functions imported from it) in one module."""
    aliases, functions = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module == "grpo_hpc.core":
            aliases |= {a.asname or a.name for a in n.names if a.name == "events"}
        elif isinstance(n, ast.ImportFrom) and n.module == EVENTS_OWNER:
            functions |= {a.asname or a.name for a in n.names}
        elif isinstance(n, ast.Import):
            aliases |= {a.asname or a.name for a in n.names if a.name == EVENTS_OWNER}
    return aliases, functions


def _through_owner(call: ast.Call, aliases: set[str], functions: set[str]) -> bool:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id in functions
    return isinstance(f, ast.Attribute) and ast.unparse(f.value) in aliases


def writers(modules: list[tuple[str, ast.Module]]) -> dict[str, set[str]]:
    """Each run file -> the modules that write it with a low-level write."""
    found: dict[str, set[str]] = {}
    for rel, tree in modules:
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            if _call_name(call) not in WRITES:
                continue
            args, receiver = _handled(call)
            for name in args | receiver:
                found.setdefault(name, set()).add(rel)
    return found


def events_outside_owner(modules: list[tuple[str, ast.Module]]) -> list[str]:
    """Calls outside core/events.py that hand events.jsonl to anything but core/events.py
    (a write, a read by hand, or a helper that would do either)."""
    wrong = []
    for rel, tree in modules:
        if rel == OWNER["events"]:
            continue
        aliases, functions = _owner_names(tree)
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            args, receiver = _handled(call)
            if "events" in receiver or (
                "events" in args and not _through_owner(call, aliases, functions)
            ):
                wrong.append(f"{rel}:{call.lineno}: {ast.unparse(call)[:80]}")
    return wrong


def test_each_run_file_has_one_writer() -> None:
    """No run file is written by a module other than its owner (OWNER)."""
    found = writers(_modules())
    wrong = {f: sorted(m - {OWNER[f]}) for f, m in found.items() if m - {OWNER[f]}}
    assert wrong == {}


def test_owners_exist() -> None:
    """The table names modules that exist (a move must update it)."""
    assert all((PKG / rel).is_file() for rel in OWNER.values())


def test_events_jsonl_goes_through_its_owner_only() -> None:
    """Every module hands events.jsonl's path to core/events.py's functions, never to a
    write or a read of its own."""
    assert events_outside_owner(_modules()) == []


def test_the_scan_sees_a_second_writer_of_events() -> None:
    """The scan itself: a stray append, an open by literal name and a hand-made read are
    each found (so the tests above can fail)."""
    stray = ast.parse(
        "from grpo_hpc.core import events as event_log\n"
        "from grpo_hpc.core.fsutil import append_jsonl, read_jsonl\n"
        "def f(paths):\n"
        "    event_log.append(paths.events, None)\n"  # through the owner: fine
        "    append_jsonl(paths.events, {'phase': 'decision'})\n"
        "    open(paths.root / 'events.jsonl', 'a')\n"
        "    return read_jsonl(paths.events)\n"
    )
    found = events_outside_owner([("monitor/stray.py", stray)])
    assert [line.split(": ", 1)[0] for line in found] == [
        "monitor/stray.py:5",
        "monitor/stray.py:6",
        "monitor/stray.py:7",
    ]
    assert writers([("monitor/stray.py", stray)])["events"] == {"monitor/stray.py"}
