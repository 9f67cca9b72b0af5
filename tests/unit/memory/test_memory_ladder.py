"""The memory estimator against the model-size ladders measured on a GPU
(bench/results/ladder_h100_2026-11-26.json, Qwen2.5 0.5B-7B on one and two GPUs, and
bench/results/ladder_families_h200_2026-11-28.json, the model families of docs/models.md;
written by bench/memory/ladder.py): within 15 % of every measured peak,
no measured peak above the line a plan must fit under (the stated headroom), and no row
the estimator let run ran out of memory."""

from __future__ import annotations

import json
from pathlib import Path

from grpo_hpc.memory import estimate as memory

ROOT = Path(__file__).resolve().parents[3]
LADDERS = [
    ROOT / "bench" / "results" / "ladder_h100_2026-11-26.json",
    ROOT / "bench" / "results" / "ladder_families_h200_2026-11-28.json",
]
TOLERANCE = 0.15


def _gpu_rows() -> list[dict]:
    """The ladders' current GPU rows. The ladders are committed: a missing file or one with
    no GPU row is a broken reference, and fails (it was a skip, which a rename would hide)."""
    measured = []
    for ladder in LADDERS:
        name = ladder.relative_to(ROOT)
        assert ladder.exists(), f"{name} is absent: bench/memory/ladder.py on a GPU"
        rows = json.loads(ladder.read_text())["rows"]
        # A stale row measured code that has changed since (its reason says what); the
        # ladder runs it again.
        mine = [
            r
            for r in rows
            if r.get("measured") and r.get("device") == "cuda" and not r.get("stale")
        ]
        assert mine, f"{name} has no row measured on a GPU"
        measured += mine
    return measured


def _estimate(row: dict) -> memory.Estimate:
    config = json.loads((ROOT / "bench" / "shapes" / row["shape"] / "config.json").read_text())
    s = dict(row["run_settings"])
    s["lora_targets"] = tuple(s["lora_targets"])
    return memory.estimate(memory.ModelShape.from_config(config), memory.Settings(**s))


def test_estimate_within_15_percent_of_every_measured_row() -> None:
    bad = []
    for row in _gpu_rows():
        name = f"{row['shape']} {row['budget']} {row['mode']}"
        if row["status"] == "oom":
            bad.append(f"{name}: the estimator let it run, but it ran out of memory")
            continue
        if row["status"] != "fits" or row.get("peak_gib") is None:
            continue  # timeouts and errors say nothing about memory
        est, got = _estimate(row).peak_gib, row["peak_gib"]
        if abs(est / got - 1) > TOLERANCE:
            bad.append(f"{name}: estimated {est:.1f} GiB, measured {got:.1f} GiB")
    assert not bad, "; ".join(bad)


def test_no_measured_peak_passes_the_line_a_plan_must_fit_under() -> None:
    """A plan is accepted when ``total_gib`` (peak x FRAGMENTATION + the CUDA context) fits
    the GPU; a run whose real peak went above its own ``total_gib`` could die in a plan
    accepted at the budget's edge. The headroom holds for every measured row."""
    over = []
    for row in _gpu_rows():
        if row["status"] != "fits" or row.get("peak_gib") is None:
            continue
        est = _estimate(row)
        if row["peak_gib"] > est.total_gib:
            name = f"{row['shape']} {row['budget']} {row['mode']} {row.get('gpus', 1)} GPU"
            over.append(f"{name}: measured {row['peak_gib']:.2f} GiB > {est.total_gib:.2f}")
    assert not over, "; ".join(over)
