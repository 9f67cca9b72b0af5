"""One shape's result as a markdown table (ms and share of each phase's kernel time), and
its JSON and table written under ``--out``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.speed.profile_attribution import CATEGORIES, PHASES


def markdown(shape: str, tag: str, result: dict) -> str:
    """The short table for bench/results: ms and share of each phase's kernel time."""
    phases = [p for p in PHASES if p in result["phases"]]
    unit = "kernel" if result["on_gpu"] else "CPU op"
    head = f"### {shape}{' (' + tag + ')' if tag else ''}: one step, {result['env']['device']}"
    lines = [head, "", "| category | " + " | ".join(f"{p} ms (%)" for p in phases) + " |"]
    lines.append("|---|" + "---|" * len(phases))
    for cat in CATEGORIES:
        cells = []
        for p in phases:
            ph = result["phases"][p]
            ms = ph["by_category_ms"][cat]
            share = 100 * ms / ph["kernel_ms"] if ph["kernel_ms"] else 0.0
            cells.append(f"{ms:.1f} ({share:.0f})")
        lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    for key, label in (("kernel_ms", f"{unit} time"), ("wall_ms", "wall time")):
        cells = [f"{result['phases'][p][key]:.1f}" for p in phases]
        lines.append(f"| **{label}** | " + " | ".join(cells) + " |")
    plain = result.get("unprofiled_metrics", {})
    cells = [f"{1e3 * plain[f'time/{key}']:.1f}" if f"time/{key}" in plain else "-"
             for key in ("generate" if p == "generate" else "train" for p in phases)]  # fmt: skip
    lines.append("| **wall time, unprofiled step** | " + " | ".join(cells) + " |")
    idle = [result["phases"][p]["idle_share"] for p in phases]
    cells = [f"{100 * x:.0f} %" if x is not None else "-" for x in idle]
    lines.append(f"| **{'GPU idle' if result['on_gpu'] else 'host overhead'}** | "
                 + " | ".join(cells) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def write(shape: str, args: argparse.Namespace, result: dict) -> Path:
    stem = f"profile_{shape}{'_' + args.tag if args.tag else ''}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    md = args.out / f"{stem}.md"
    md.write_text(markdown(shape, args.tag, result))
    return md
