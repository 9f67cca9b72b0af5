"""How much of each phase of a profiled real step kept the GPU busy? Read from the Chrome
traces that ``training.profile_steps`` writes (``torch_profile/rank<R>-steps<A>-<B>.json``,
gzipped or not).

Why it asks: a 135M model's update took 0.15-0.36 s for the same work in real 2-GPU runs. If
its GPU is busy most of the update, the GPU sets the pace; if it is idle most of it, the
host does (Python and kernel launches), and the update is as steady as the host's core.

    python -m bench.probes.trace_busy torch_profile/rank0-steps20-21.json.gz [--phase update]

One line per range of the phase (``grpo/<phase>``): its wall milliseconds, the GPU's busy
milliseconds inside it (the union of kernels, copies and sets on every stream), the
kernels launched, and the milliseconds of NCCL kernels (on a rank that reached a
collective first these are mostly waiting for the other).
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def union_length(spans: list[tuple[float, float]]) -> float:
    """Total length covered by ``spans`` ((start, end) pairs), overlaps counted once
    (pure)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def phase_rows(events: list[dict], phase: str) -> list[dict]:
    """Per range named ``grpo/<phase>`` (the CPU range), in trace order (pure): ``wall_ms``,
    ``gpu_busy_ms``, ``kernels``, ``nccl_ms``; GPU events clipped to the range."""
    ranges = [
        e
        for e in events
        if e.get("name") == f"grpo/{phase}"
        and e.get("ph") == "X"
        and e.get("cat") == "user_annotation"
    ]
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    rows = []
    for r in sorted(ranges, key=lambda e: e["ts"]):
        a, b = r["ts"], r["ts"] + r["dur"]
        inside = [(max(e["ts"], a), min(e["ts"] + e["dur"], b), e["name"]) for e in gpu]
        inside = [(s, t, n) for s, t, n in inside if t > s]
        nccl = sum(t - s for s, t, n in inside if "nccl" in n.lower())
        rows.append(
            {
                "wall_ms": r["dur"] / 1e3,
                "gpu_busy_ms": union_length([(s, t) for s, t, _ in inside]) / 1e3,
                "kernels": len(inside),
                "nccl_ms": nccl / 1e3,
            }
        )
    return rows


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("traces", type=Path, nargs="+")
    p.add_argument("--phase", default="update", help="generate, score, vote, update, report")
    args = p.parse_args()
    for path in args.traces:
        for i, r in enumerate(phase_rows(load(path), args.phase)):
            share = r["gpu_busy_ms"] / r["wall_ms"] if r["wall_ms"] else 0.0
            print(
                f"{path.name} grpo/{args.phase} #{i}: {r['wall_ms']:.1f} ms, GPU busy "
                f"{r['gpu_busy_ms']:.1f} ms ({share:.0%}), {r['kernels']} kernels, "
                f"NCCL {r['nccl_ms']:.1f} ms"
            )


if __name__ == "__main__":
    main()
