"""Where does the test suite's time go? A pytest plugin that records when each test ran on
which pytest-xdist worker, and a report of what it recorded.

Record (a fresh clone, as CI runs it; ``PYTEST_ADDOPTS`` reaches the pytest that
``scripts/test.sh`` starts, and every xdist worker loads the plugin too)::

    GRPO_HPC_TIMELINE=/tmp/tl PYTEST_ADDOPTS="-p bench.probes.suite_timeline" bash .ci/run

Report::

    python -m bench.probes.suite_timeline /tmp/tl [--most 30]

It prints each worker's first start, last end and busy seconds, then the modules by their
summed test seconds. Whether the suite is bound by its critical path or by CPU time is in
the first part: a worker that ends long before the others idled while one group ran on;
workers that all end together on a 2-core machine were sharing the CPU to the last second
(then only less CPU time makes the suite faster: measure a module's CPU time alone, every
process's, e.g. from ``/proc/stat`` around ``pytest -n 0 MODULE``, as the 2026-12-05 cut
of the two-node group did; scripts/test.sh). Under load a test's seconds are not its CPU
time: on 2 cores and 5 workers CPU-bound modules measured about 0.37 CPU s a second.

Each span also records the machine's busy CPU seconds (all processes, from ``/proc/stat``)
at its start and end. With one worker (``bash scripts/test.sh -p no:cacheprovider -n 0``
in a fresh clone, under the same two variables; ``.ci/run`` passes no arguments) that
difference is the test's own CPU time, its subprocesses', Slurm jobs' and daemons'
included (and anything else the machine ran meanwhile: keep it otherwise idle), and the
report adds the modules by CPU seconds: the list to cut from when CPU bounds the suite.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ENV = "GRPO_HPC_TIMELINE"
"""The folder the plugin writes one ``<worker>.jsonl`` into (nothing is recorded without it)."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Setup, call and teardown of one test, timed as one span on this worker."""
    out = os.environ.get(ENV)
    start, cpu_start = time.time(), machine_cpu_seconds()
    yield
    if out:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        line = {
            "worker": worker,
            "test": item.nodeid,
            "start": start,
            "end": time.time(),
            "cpu_start": cpu_start,
            "cpu_end": machine_cpu_seconds(),
        }
        Path(out).mkdir(parents=True, exist_ok=True)  # a folder not made yet is made
        with open(Path(out) / f"{worker}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")


def machine_cpu_seconds(stat: Path = Path("/proc/stat")) -> float | None:
    """Busy CPU seconds of the whole machine since boot (user, nice, system, irq, softirq,
    steal; not idle or iowait), or None where ``/proc/stat`` cannot be read."""
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Span:
    worker: str
    test: str
    start: float
    end: float
    cpu: float | None = None
    """The machine's busy CPU seconds during the test (its own with one worker)."""

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def module(self) -> str:
        """The test's file (an xdist group's ``@group`` suffix is on the test name, not here)."""
        return self.test.split("::")[0]


@dataclass(frozen=True)
class WorkerLine:
    worker: str
    tests: int
    first: float
    """Seconds from the suite's first start to this worker's first."""
    last: float
    """Seconds from the suite's first start to this worker's last end."""
    busy: float


def workers(spans: list[Span]) -> list[WorkerLine]:
    """Each worker's first start, last end and busy seconds (pure)."""
    t0 = min(s.start for s in spans)
    out = []
    for w in sorted({s.worker for s in spans}):
        mine = [s for s in spans if s.worker == w]
        first, last = min(s.start for s in mine) - t0, max(s.end for s in mine) - t0
        out.append(WorkerLine(w, len(mine), first, last, sum(s.seconds for s in mine)))
    return out


def _by_module(spans: list[Span], value: Callable[[Span], float]) -> list[tuple[str, int, float]]:
    """(module, tests, summed ``value`` of its spans), the largest first (pure)."""
    total: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for s in spans:
        total[s.module] += value(s)
        count[s.module] += 1
    return [(m, count[m], t) for m, t in total.most_common()]


def modules(spans: list[Span]) -> list[tuple[str, int, float]]:
    """(module, tests, summed seconds), the longest first (pure)."""
    return _by_module(spans, lambda s: s.seconds)


def modules_by_cpu(spans: list[Span]) -> list[tuple[str, int, float]]:
    """(module, tests, summed machine CPU seconds), the most first; empty where a span
    has no CPU reading (pure)."""
    if not spans or any(s.cpu is None for s in spans):
        return []
    return _by_module(spans, lambda s: s.cpu or 0.0)


def report(spans: list[Span], most: int = 30) -> str:
    """The text the command prints (pure)."""
    total = sum(s.seconds for s in spans)
    per_worker = workers(spans)
    lines = [f"{len(spans)} tests, {total:,.0f} test-seconds on {len(per_worker)} workers"]
    lines += ["worker  tests  first s  last s  busy s"]
    lines += [
        f"{w.worker:<6} {w.tests:>6} {w.first:>8.0f} {w.last:>7.0f} {w.busy:>7.0f}"
        for w in per_worker
    ]
    lines += ["", "module seconds (share, summed share)"]
    summed = 0.0
    for m, n, t in modules(spans)[:most]:
        summed += t
        lines.append(f"{t:>7.0f} {100 * t / total:>5.1f}% {100 * summed / total:>5.1f}%  {m} ({n})")
    by_cpu = modules_by_cpu(spans)
    if by_cpu:
        cpu_total = sum(t for _, _, t in by_cpu)
        note = "" if len(per_worker) == 1 else ": shared by workers, not each test's own"
        lines += ["", f"module machine CPU seconds, {cpu_total:,.0f} in all{note}"]
        summed = 0.0
        for m, n, t in by_cpu[:most]:
            summed += t
            share = f"{100 * t / cpu_total:>5.1f}% {100 * summed / cpu_total:>5.1f}%"
            lines.append(f"{t:>7.0f} {share}  {m} ({n})")
    return "\n".join(lines)


def read(folder: Path) -> list[Span]:
    spans = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                a, b = d.get("cpu_start"), d.get("cpu_end")
                cpu = b - a if a is not None and b is not None else None
                spans.append(Span(d["worker"], d["test"], d["start"], d["end"], cpu))
    return spans


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("folder", type=Path, help=f"what the plugin wrote (${ENV})")
    ap.add_argument("--most", type=int, default=30, help="modules listed")
    a = ap.parse_args(argv)
    spans = read(a.folder)
    if not spans:
        raise SystemExit(f"no timeline in {a.folder}: record one first (see --help)")
    print(report(spans, a.most))


if __name__ == "__main__":
    main()
