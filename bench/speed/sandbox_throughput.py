"""Throughput of the code reward's sandbox: programs judged per second with N parallel
workers, on HumanEval programs (what a code run scores).

    python -m bench.speed.sandbox_throughput --workers 1,2,4,8 [--repeat 2] [--out FILE.json]

Programs: HumanEval's 164 canonical solutions (each passes its tests) and 164 wrong ones
(each function given the next problem's solution: most fail on the first assert), judged
through ``code_scores`` exactly as a training step scores them (one sandboxed
child per program: bwrap where it works, else the audit-hook sandbox). For each worker
count the best of ``--repeat`` passes over all 328 programs is kept, with the seconds a
step of ``--step-programs`` completions (code-qwen.yaml: 16 prompts x 8) would spend scoring
at that rate: set it against ``time/generate`` of the same step in metrics.jsonl.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from bench.common import env_info, write_result
from grpo_hpc.tasks import code as code_data
from grpo_hpc.train.rewards import sandbox
from grpo_hpc.train.rewards.code import code_scores, code_workers


def programs() -> tuple[list[str], list[dict], int]:
    """(completions, problems, how many should pass): right then wrong HumanEval programs."""
    rows = code_data.humaneval_rows()
    problems = [code_data.humaneval_problem(r, r["task_id"]) for r in rows]
    shifted = rows[1:] + rows[:1]

    def fence(prompt: str, body: str) -> str:
        return f"```python\n{prompt}{body}```\n"

    right = [fence(r["prompt"], r["canonical_solution"]) for r in rows]
    pairs = zip(rows, shifted, strict=True)
    wrong = [fence(r["prompt"], s["canonical_solution"]) for r, s in pairs]
    return right + wrong, problems + problems, len(right)


def measure(workers: int, repeat: int, texts: list[str], problems: list[dict]) -> dict:
    best, passed = float("inf"), 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        scores = code_scores(texts, problems, workers=workers)
        best = min(best, time.perf_counter() - t0)
        passed = int(sum(scores))
    return {"workers": workers, "seconds": round(best, 3), "programs_per_s": len(texts) / best,
            "passed": passed}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workers", default="1,2,4,8", help="comma-separated worker counts")
    ap.add_argument("--repeat", type=int, default=2, help="passes per worker count (best kept)")
    ap.add_argument("--step-programs", type=int, default=128, help="completions in one step")
    ap.add_argument("--out", type=Path, help="write the result JSON here")
    args = ap.parse_args(argv)
    texts, problems, should_pass = programs()
    iso = sandbox.proven_isolation()
    load_before = os.getloadavg()[0]  # a shared machine: say how busy it was
    rows = []
    for w in (int(x) for x in args.workers.split(",")):
        row = measure(w, args.repeat, texts, problems)
        row["step_score_s"] = round(args.step_programs / row["programs_per_s"], 2)
        row["programs_per_s"] = round(row["programs_per_s"], 1)
        print(
            f"workers={w}: {row['programs_per_s']} programs/s ({row['seconds']} s for "
            f"{len(texts)}; {row['passed']}/{should_pass} passed); a {args.step_programs}-"
            f"completion step scores in {row['step_score_s']} s",
            flush=True,
        )
        if row["passed"] != should_pass:
            print(f"warning: {row['passed']} passed, expected {should_pass}", file=sys.stderr)
        rows.append(row)
    result = {
        "command": "python -m bench.speed.sandbox_throughput " + " ".join(argv or sys.argv[1:]),
        "isolation": f"{iso.name}: {iso.detail}",
        "cpus_usable": len(os.sched_getaffinity(0)),
        "programs": len(texts),
        "expected_pass": should_pass,
        "default_workers": code_workers(),
        "step_programs": args.step_programs,
        "load_avg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "rows": rows,
        "env": env_info(),
    }
    write_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
