"""The ladder's markdown table (bench/results/LOG.md) from ladder.json: measured figures
beside what the memory estimator says now for the same settings.

    python -m bench.memory.ladder_table bench/results/ladder_h100_2026-11-26.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # bench/


def current_estimate(row: dict) -> float | None:
    """The estimator's peak GiB per rank for the settings the row ran (None if not run)."""
    from grpo_hpc.memory import estimate as memory

    if "run_settings" not in row:
        return None
    config = json.loads((HERE / "shapes" / row["shape"] / "config.json").read_text())
    s = dict(row["run_settings"])
    s["lora_targets"] = tuple(s["lora_targets"])
    return memory.estimate(memory.ModelShape.from_config(config), memory.Settings(**s)).peak_gib


def line(row: dict) -> str:
    est = current_estimate(row)
    gpus = row.get("gpus", 1)
    plan = row[f"estimate_{gpus}gpu"]["settings"]
    peak = row.get("peak_gib")
    status = row["status"] if row["status"] != "estimated: does not fit" else "refused (estimate)"
    cells = [
        row["shape"].removeprefix("qwen2.5-").upper(),
        row["budget"],
        row["mode"],
        str(gpus),
        f"{status} (stale)" if row.get("stale") else status,
        f"{peak:.1f}" if peak is not None else "-",
        f"{est:.1f} ({100 * (est / peak - 1):+.0f} %)" if est and peak else "-",
    ]
    if row["status"] == "fits":
        cells += [
            f"{row['s_per_step']:.1f} = {row['generate_s']:.1f} + {row['update_s']:.1f}",
            f"{row['decode_tok_s_per_gpu']:,} ({row['decode_roofline_pct']:.0f} %)",
            f"{row['update_mfu_pct']:.0f} %",
        ]
    else:
        cells += ["-", "-", "-"]
    cells.append(trl_cell(row.get("trl")))
    cells.append(plan)
    return "| " + " | ".join(cells) + " |"


def trl_cell(trl: dict | None) -> str:
    """TRL 1.16 in the same budget (``ladder.py --trl``): s/step (peak GiB), or what stopped it."""
    if not trl:
        return "-"
    if trl["status"] == "fits":
        return f"{trl['s_per_step']:.1f} ({trl['peak_gib']:.1f})"
    return trl["status"]


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("ladder", type=Path, nargs="?", default=HERE / "results" / "ladder.json")
    args = p.parse_args()
    rows = json.loads(args.ladder.read_text())["rows"]
    order = {
        s: i for i, s in enumerate(("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b"))
    }
    rows.sort(key=lambda r: (order.get(r["shape"], 9), r["budget"], r["mode"], r.get("gpus", 1)))
    print(
        "| shape | budget | mode | GPUs | status | peak GiB/GPU | estimate now "
        "| s/step = gen + update | decode tok/s per GPU (% roofline) | update MFU "
        "| TRL s/step (peak GiB) | settings |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(line(row))


if __name__ == "__main__":
    main()
