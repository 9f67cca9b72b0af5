"""Replay every recorded seed of the learning benchmark through the collapse detector.

    python bench/collapse/replay.py [RESULT.json ...] [--out OUT.json]

For each seed: whether it ended healthy (final held-out accuracy >= 0.5), the verdicts the
detector (grpo_hpc/train/supervision/collapse.py, default thresholds) would have drawn
and at which step, and so whether a collapse was caught, missed, or a healthy seed
falsely alarmed. Also a small sweep of the two thresholds that decide when
``no_signal`` fires, to show how the defaults were chosen. CPU only, a second or two.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from grpo_hpc.train.supervision.collapse import Thresholds, replay  # noqa: E402

DEFAULT = [
    "bench/results/learning_2term_mask_h100x4_2026-11-27.json",
    *sorted(str(p) for p in Path("bench/results/archive").glob("learning_2term*.json")),
]
HEALTHY = 0.5


def seeds_of(path: Path) -> list[tuple[str, dict]]:
    """(system, seed record) of every seed with per-step metrics in a result file."""
    d = json.loads(path.read_text())
    return [
        (system, r)
        for system, runs in d.get("systems", {}).items()
        for r in runs
        if r.get("steps") and r.get("evals")
    ]


def judge(record: dict, th: Thresholds, masked: bool, problems: int = 0) -> dict:
    """One seed's replay: verdicts, the first one, and how to count it."""
    verdicts = replay(record["steps"], record["evals"], th, masked, problems)
    final = record["evals"][-1]["accuracy"]
    healthy = final >= HEALTHY
    first = verdicts[0] if verdicts else None
    zero = sum(1 for s in record["steps"] if s.get("grad_norm") == 0)
    return {
        "seed": record["seed"],
        "final_accuracy": round(final, 4),
        "healthy": healthy,
        "zero_grad_steps": zero,
        "caught_at": first.step if first else None,
        "signal": first.signal if first else None,
        "outcome": ("false_alarm" if first else "quiet")
        if healthy
        else ("caught" if first else "missed"),
        "verdicts": [v.line() for v in verdicts],
    }


def summary(rows: list[dict]) -> dict:
    bad = [r for r in rows if not r["healthy"]]
    good = [r for r in rows if r["healthy"]]
    caught = [r for r in bad if r["caught_at"] is not None]
    return {
        "seeds": len(rows),
        "collapsed": len(bad),
        "caught": len(caught),
        "missed": [r["seed"] for r in bad if r["caught_at"] is None],
        "healthy": len(good),
        "false_alarms": [r["seed"] for r in good if r["caught_at"] is not None],
        "mean_catch_step": round(sum(r["caught_at"] for r in caught) / len(caught), 1)
        if caught
        else None,
    }


def sweep(records: list[dict], masked: bool) -> list[dict]:
    """``no_signal`` alone (other signals off) at a few (patience, window) pairs."""
    out = []
    for window in (6, 8, 10, 12, 15):
        for patience in sorted({window - 2, window - 1, window, max(1, window * 2 // 3)}):
            th = Thresholds(
                window=window,
                patience=patience,
                cut_off_patience=0,
                pinned_share=0,
                entropy_floor=0,
                eval_patience=0,
            )
            rows = [judge(r, th, masked) for r in records]
            out.append({"window": window, "patience": patience, **summary(rows)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="*", default=DEFAULT)
    ap.add_argument("--out", default=f"bench/results/collapse_replay_{date.today()}.json")
    args = ap.parse_args(argv)
    th = Thresholds()
    report: dict = {"thresholds": asdict(th), "healthy_if_final_at_least": HEALTHY, "files": {}}
    for name in args.results:
        path = Path(name)
        d = json.loads(path.read_text())
        masked = d.get("config", {}).get("overlong") == "mask"
        problems = int(d.get("config", {}).get("num_eval", 0))
        for system, rec in seeds_of(path):
            report["files"].setdefault(path.name, {}).setdefault(system, []).append(
                judge(rec, th, masked, problems)
            )
        records = [r for s, r in seeds_of(path) if s == "grpo_hpc"]
        if records:
            report.setdefault("sweep_no_signal", {})[path.name] = sweep(records, masked)
    for fname, systems in report["files"].items():
        for system, rows in systems.items():
            s = summary(rows)
            report.setdefault("summary", {}).setdefault(fname, {})[system] = s
            print(f"{fname} [{system}]: {json.dumps(s)}")
            for r in rows:
                at = f"step {r['caught_at']:>2} {r['signal']}" if r["caught_at"] else "-"
                print(
                    f"  seed {r['seed']:>3} final {r['final_accuracy']:.2f} "
                    f"zero-grad {r['zero_grad_steps']:>2} {r['outcome']:<11} {at}"
                )
    out = Path(args.out)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
