"""How steady a real run's steps are: its ``metrics.jsonl`` read back, steps after warm-up
grouped by size, and the spread of their times within each group.

A benchmark times fixed shapes; a user's run does not have them: completion lengths vary,
groups with no reward variance train nothing, a new shape compiles or captures a graph.
This report separates those. After ``--warmup`` steps, each step is put in a size group by
its trained tokens (``train/tokens``, within ``--tolerance`` of the group's first step; a
step that trained nothing is its own group "no update"); for each group it gives the
steps, their times (``time/step``, split into generate and train), and the slowest over
the fastest. Steps whose ``compile/graphs`` or ``engine/captures`` grew are marked: their
time includes a compilation or a CUDA graph capture on some rank; the spread without them
(``worst_steady_spread``) is the steps' own variation.

    python -m bench.speed.step_spread logs/RUN/metrics.jsonl
    python -m bench.speed.step_spread bench/results/slurm_gpu_h100x2_2026-11-26/metrics.jsonl \
        --warmup 1
    python -m bench.speed.step_spread logs/RUN/metrics.jsonl --steps   # and every step's parts

The issue's target: after warm-up, steps of similar token counts within 20 % of each other
(``--target 1.2``: exit 1 when a group's slowest step is further than that).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

COUNTERS = ("compile/graphs", "engine/captures")
"""Cumulative counters whose growth in a step explains a slow one."""


@dataclass
class Group:
    """Steps of about one size (trained tokens), after warm-up."""

    tokens: float
    """The first step's trained tokens (0: steps that trained nothing)."""
    steps: list[dict] = field(default_factory=list)

    def times(self, key: str = "time/step") -> list[float]:
        return [s.get(key, 0.0) for s in self.steps]

    @property
    def spread(self) -> float:
        """Slowest over fastest step time (1.0 for one step)."""
        t = self.times()
        return max(t) / min(t) if min(t) > 0 else float("inf")


def training_steps(lines: list[dict]) -> list[dict]:
    """The logged steps (lines with a loss), last record per step number: a resumed run
    logs again the steps after its checkpoint, and the later attempt is the one that
    counted."""
    by_step = {m["step"]: m for m in lines if "loss" in m and "step" in m}
    return [by_step[k] for k in sorted(by_step)]


def grown(prev: dict | None, step: dict) -> list[str]:
    """The counters that grew in ``step`` since ``prev`` (pure)."""
    if prev is None:
        return []
    return [c for c in COUNTERS if c in step and step[c] > prev.get(c, step[c])]


def size(step: dict) -> float:
    """A step's size (pure): the completion tokens it trained (``train/tokens``; 0 when no
    group had reward variance). Logs from before that metric: completions x mean length,
    and 0 when the update took under 0.1 s (nothing trained)."""
    if "train/tokens" in step:
        return float(step["train/tokens"])
    if step.get("time/train", 0.0) < 0.1:
        return 0.0
    return float(step.get("completions", 0)) * float(step.get("gen_len/mean", 0.0))


def group_steps(steps: list[dict], warmup: int, tolerance: float) -> list[Group]:
    """Steps after ``warmup`` in size groups (pure): a step joins the first group whose
    tokens are within ``tolerance`` (a share) of its own; one that trained nothing joins
    the group of 0."""
    groups: list[Group] = []
    for s in steps:
        if s["step"] <= warmup:
            continue
        tokens = size(s)
        home = next(
            (
                g
                for g in groups
                if (g.tokens == 0) == (tokens == 0)
                and abs(tokens - g.tokens) <= tolerance * max(g.tokens, 1.0)
            ),
            None,
        )
        if home is None:
            home = Group(tokens)
            groups.append(home)
        home.steps.append(s)
    return groups


def report(steps: list[dict], warmup: int, tolerance: float) -> dict:
    """The spread report (pure): per group, its steps, times and spread; the marked steps;
    the worst spread among groups of two or more trained steps."""
    marks = {}
    prev = None
    for s in steps:
        g = grown(prev, s)
        if g and s["step"] > warmup:
            marks[s["step"]] = g
        prev = s
    groups = group_steps(steps, warmup, tolerance)
    rows = [
        {
            "tokens": g.tokens,
            "steps": [s["step"] for s in g.steps],
            "time_step": g.times(),
            "time_generate": g.times("time/generate"),
            "time_train": g.times("time/train"),
            # what a peer waited for: one rank's later generation, a rank's GC pause
            "time_generate_skew": g.times("time/generate_skew"),
            "time_gc": g.times("time/gc"),
            "time_score_max": g.times("time/score_max"),  # the slowest rank's scoring
            "median_s": statistics.median(g.times()),
            "spread": g.spread,
            "parts": part_ranges(g),
        }
        for g in groups
    ]
    trained = [r["spread"] for r in rows if r["tokens"] > 0 and len(r["steps"]) > 1]
    steady = [steady_spread(g, marks) for g in groups if g.tokens > 0]
    steady = [x for x in steady if x is not None]
    return {
        # a step that trained nothing logs no train/tokens: the trained steps say
        "size": "train/tokens" if any("train/tokens" in s for s in steps) else "proxy",
        "host": host_summary([s for s in steps if s["step"] > warmup]),
        "warmup": warmup,
        "tolerance": tolerance,
        "groups": rows,
        "marked_steps": marks,
        "worst_spread": max(trained) if trained else None,
        "worst_steady_spread": max(steady) if steady else None,
    }


PARTS = (
    ("generate", "time/generate"),
    ("score_max", "time/score_max"),
    ("update", "time/train"),
)
"""The parts of a step whose spread :func:`part_ranges` reports."""


def part_ranges(group: Group) -> dict[str, tuple[float, float]]:
    """(fastest, slowest) of each part of a group's steps, and of ``other``: the step
    without its update (pure). Which part varied: a group whose update ranges 0.15-0.32 s
    while the rest of its steps stay within 10 % is unsteady in its update."""
    out = {}
    for name, key in PARTS:
        t = group.times(key)
        out[name] = (min(t), max(t))
    other = [s.get("time/step", 0.0) - s.get("time/train", 0.0) for s in group.steps]
    out["other"] = (min(other), max(other))
    return out


THREADS = ("main", "autograd", "native", "python")
"""grpo_hpc.train.measure.profiling.THREAD_GROUPS, spelled out: this log reader imports no torch."""


def host_summary(steps: list[dict]) -> dict | None:
    """Rank 0's updates on the host, over the trained steps that log them by thread
    (pure; logs from 2026-11-27 7b6b5a3 on): each thread group's CPU seconds (fastest,
    slowest), the share of the update's wall that the main and autograd threads were
    on a core together (``busy``), and the longest any thread waited for a core in one
    update (``waited_max``). A ``busy`` near 1 with no waiting: the update was one thread
    at a time, always running, and took as long as the host's core needed."""
    rows = [s for s in steps if s.get("train/tokens") and "time/train_waited" in s]
    if not rows:
        return None
    cpu = {g: [s.get(f"time/train_cpu_{g}", 0.0) for s in rows] for g in THREADS}
    busy = [(cpu["main"][i] + cpu["autograd"][i]) / s["time/train"] for i, s in enumerate(rows)]
    return {
        "steps": len(rows),
        "cpu": {g: (min(v), max(v)) for g, v in cpu.items()},
        "busy": (min(busy), max(busy)),
        "waited_max": max(s["time/train_waited"] for s in rows),
    }


def steady_spread(group: Group, marks: dict[int, list[str]]) -> float | None:
    """A group's spread over its steps that neither compiled nor captured (pure); None
    with fewer than two such steps. What is left once first meetings with a shape are
    set aside: the step's own variation."""
    t = [s.get("time/step", 0.0) for s in group.steps if s["step"] not in marks]
    if len(t) < 2:
        return None
    return max(t) / min(t) if min(t) > 0 else float("inf")


STEP_COLUMNS = (
    ("step", "time/step"),
    ("gen", "time/generate"),
    ("score", "time/score"),
    ("score_max", "time/score_max"),
    ("train", "time/train"),
)


def step_table(steps: list[dict]) -> list[str]:
    """Every step in one line (pure): its time and parts; ``rest``, the time outside its
    own generation, scoring and update (the wait for the other ranks' rollouts, the
    report, progress writes); ``skew``, how far apart the ranks finished generating;
    ``gap``, the wall time since the previous step's row (a save or an evaluation
    between them shows here, not in the step's own time); ``train_cpu``, the CPU seconds
    of rank 0's process during its update (every thread; logs from before 2026-11-27
    f630cd0 hold the main thread's there), ``-`` where the log has none: near ``train``
    means the update was bound by the host."""
    tail = ("rest", "skew", "gap", "train_cpu")
    head = "  step " + " ".join(f"{n:>9}" for n in [*(n for n, _ in STEP_COLUMNS), *tail])
    out, prev = [head], None
    for s in steps:
        parts = [s.get(k, 0.0) for _, k in STEP_COLUMNS]
        rest = parts[0] - parts[1] - parts[2] - parts[4]
        gap = s["time"] - prev["time"] if prev is not None and "time" in s else 0.0
        cells = [f"{c:>9.2f}" for c in (*parts, rest, s.get("time/generate_skew", 0.0), gap)]
        cpu = s.get("time/train_cpu")
        cells.append(f"{cpu:>9.2f}" if cpu is not None else f"{'-':>9}")
        out.append(f"  {s['step']:>4} " + " ".join(cells))
        prev = s
    return out


def render(rep: dict) -> str:
    """The report as lines for a terminal."""
    out = [f"after {rep['warmup']} warm-up step(s); size groups within {rep['tolerance']:.0%}:"]
    if rep["size"] == "proxy":
        out.append("  (no train/tokens in this log: size = completions x mean length)")
    for r in rep["groups"]:
        name = "no update" if r["tokens"] == 0 else f"~{r['tokens']:.0f} tokens"
        times = " ".join(f"{t:.2f}" for t in r["time_step"])
        out.append(
            f"  {name:>16}: steps {r['steps']} s/step {times}  median {r['median_s']:.2f}"
            f"  slowest/fastest {r['spread']:.2f}"
        )
        keys = ("generate_skew", "gc", "score_max")
        waits = [(k, max(r.get(f"time_{k}", []), default=0.0)) for k in keys]
        if any(w > 0 for _, w in waits):
            out.append(
                " " * 18 + "  most per step: " + ", ".join(f"{k} {w:.2f} s" for k, w in waits)
            )
        if r["tokens"] > 0 and len(r["steps"]) > 1:
            out.append(" " * 18 + "  parts (s): " + _ranges(r["parts"]))
    host = rep.get("host")
    if host:
        cpu = ", ".join(f"{g} {lo:.3f}-{hi:.3f}" for g, (lo, hi) in host["cpu"].items())
        lo, hi = host["busy"]
        out.append(
            f"  rank 0's update on the host ({host['steps']} steps): main + autograd running"
            f" {lo:.0%}-{hi:.0%} of it, longest wait for a core {host['waited_max'] * 1e3:.1f} ms"
        )
        out.append(f"    CPU s by thread: {cpu}")
    for step, what in rep["marked_steps"].items():
        out.append(f"  step {step}: {' and '.join(what)} grew (a compilation or a capture)")
    for label, key in (("", "worst_spread"), (" without those steps", "worst_steady_spread")):
        worst = rep[key]
        shown = "n/a" if worst is None else f"{worst:.2f}"
        out.append(f"worst spread of trained steps{label}: {shown}")
    return "\n".join(out)


def _ranges(parts: dict[str, tuple[float, float]]) -> str:
    """``update 0.15-0.32 (2.17x)``: each part's range in seconds, and its ratio where both
    ends are above 10 ms (a ratio of near-zero times says nothing)."""
    cells = []
    for name, (lo, hi) in parts.items():
        ratio = f" ({hi / lo:.2f}x)" if lo > 0.01 else ""
        cells.append(f"{name} {lo:.2f}-{hi:.2f}{ratio}")
    return ", ".join(cells)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("metrics", type=Path, help="a run's metrics.jsonl")
    p.add_argument("--warmup", type=int, default=2, help="steps left out at the start")
    p.add_argument("--tolerance", type=float, default=0.1, help="token share of a size group")
    p.add_argument("--target", type=float, default=0.0, help="exit 1 above this spread")
    p.add_argument("--json", type=Path, help="also write the report here")
    p.add_argument("--steps", action="store_true", help="also every step in one line")
    args = p.parse_args()
    if not args.metrics.is_file():
        raise SystemExit(f"no metrics file at {args.metrics}: give a run's metrics.jsonl")
    lines = [json.loads(x) for x in args.metrics.read_text().splitlines() if x.strip()]
    rep = report(training_steps(lines), args.warmup, args.tolerance)
    print(render(rep))
    if args.steps:
        print("\n".join(step_table(training_steps(lines))))
    if args.json:
        args.json.write_text(json.dumps(rep, indent=1))
    if args.target and rep["worst_spread"] is not None and rep["worst_spread"] > args.target:
        sys.exit(1)


if __name__ == "__main__":
    main()
