"""The summary of a run on a task its model solves (bench/gpu/real.sh's stage ``solved``):
how it ended (state, exit code, reason), how many steps had every group answer correctly
(``rollout/solved`` = 1.0) and the longest run of them, the trainer's solved and collapse
events, which step's model ``final/`` holds, and the validation accuracy at each evaluation.
Read from the run directory; :func:`summarize` is pure.

    python -m bench.collapse.solved_summary /tmp/runs/solved-flag OUT/solved_flag_summary.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grpo_hpc.core import events as event_log
from grpo_hpc.core.events import Phase
from grpo_hpc.core.fsutil import read_jsonl


def _longest(flags: list[bool]) -> int:
    best = run = 0
    for f in flags:
        run = run + 1 if f else 0
        best = max(best, run)
    return best


def summarize(rows: list[dict], events: list[dict], progress: dict, final: dict | None) -> dict:
    """``rows``: metrics.jsonl; ``events``: events.jsonl; ``progress``: progress.json;
    ``final``: final/grpo_export.json (None: no final model) (pure)."""
    steps = [r for r in rows if "loss" in r]
    solved = [float(r.get("rollout/solved", 0.0)) >= 1.0 for r in steps]
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    return {
        "state": progress.get("state"),
        "exit_code": progress.get("exit_code"),
        "reason": progress.get("reason"),
        "steps": len(steps),
        "max_steps": progress.get("max_steps"),
        "steps_all_solved": sum(solved),
        "longest_all_solved": _longest(solved),
        "solved_share_by_step": [round(float(r.get("rollout/solved", 0.0)), 3) for r in steps],
        "solved_events": [e for e in events if e.get("phase") == Phase.SOLVED],
        "collapse_events": [e for e in events if e.get("phase") == Phase.COLLAPSE],
        "final_step": (final or {}).get("step"),
        "validation_accuracy": evals,
    }


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.collapse.solved_summary",
        description=__doc__.split("\n\n")[0],
        epilog="example: python -m bench.collapse.solved_summary logs/solved OUT/solved.json",
    )
    p.add_argument("run", type=Path, help="the run directory (logs/<run>)")
    p.add_argument("out", type=Path, help="the summary JSON to write")
    args = p.parse_args(argv)
    run, out = args.run, args.out
    summary = summarize(
        read_jsonl(run / "metrics.jsonl"),
        event_log.read(run / "events.jsonl"),
        _json(run / "progress.json") or {},
        _json(run / "final" / "grpo_export.json"),
    )
    out.write_text(json.dumps(summary, indent=1) + "\n")
    keys = ("state", "exit_code", "steps", "steps_all_solved", "longest_all_solved", "final_step")
    print({k: summary[k] for k in keys}, summary["reason"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
