"""How fast a core of this host runs, and how busy the host is, every few tenths of a
second: beside a training job, to tell a job that slowed down from a host that did.

Real 2-GPU runs had the update of a 135M model drift down over a run, 1.0 s a
step early and 0.76 s late at the same size, on an update bound by the host (Python and
kernel launches on one thread). Whether the host's cores ran slower early (their clock,
a neighbour on the VM host, the job's own compile workers) or the trainer did more work is
what this probe and the trainer's ``time/train_cpu`` tell apart: each line times one fixed
piece of pure-Python work (``--work`` iterations, about a millisecond) and reads the share
of all cores busy since the last line from ``/proc/stat``.

    python -m bench.probes.host_clock --out clock.jsonl [--every 0.25] [--seconds 600]

One JSON line per sample: ``time`` (Unix seconds, as in metrics.jsonl), ``work_ms`` (the
fixed work's wall milliseconds: larger is a slower or shared core), ``busy`` (share of all
cores busy since the last sample) and ``load1``. Stops after ``--seconds`` or on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from pathlib import Path

WORK = 20_000
"""Iterations of the fixed work (about 1 ms on a 2020s server core)."""


def work(n: int) -> float:
    """Wall milliseconds of ``n`` iterations of a fixed pure-Python loop."""
    t0 = time.perf_counter()
    acc = 0
    for i in range(n):
        acc += i * i % 7
    return (time.perf_counter() - t0) * 1e3


def cpu_times(stat: str) -> tuple[int, int]:
    """(busy, total) jiffies of all cores from ``/proc/stat``'s first line (pure)."""
    fields = [int(x) for x in stat.splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """Share of all cores busy between two :func:`cpu_times` readings (pure)."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True, help="JSON lines file (appended)")
    p.add_argument("--every", type=float, default=0.25, help="seconds between samples")
    p.add_argument("--seconds", type=float, default=600, help="stop after this long")
    p.add_argument("--work", type=int, default=WORK, help="iterations of the fixed work")
    args = p.parse_args()
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    stat = Path("/proc/stat")
    before = cpu_times(stat.read_text())
    end = time.monotonic() + args.seconds
    with args.out.open("a") as f:
        while not stop and time.monotonic() < end:
            time.sleep(args.every)
            ms = work(args.work)
            after = cpu_times(stat.read_text())
            load1 = float(Path("/proc/loadavg").read_text().split()[0])
            row = {"time": time.time(), "work_ms": round(ms, 3), "load1": load1}
            row["busy"] = round(busy_share(before, after), 3)
            f.write(json.dumps(row) + "\n")
            f.flush()
            before = after


if __name__ == "__main__":
    main()
