"""Time grpo-status for many runs: collect rows from synthetic run directories + render.

    python -m bench.probes.status_render [--runs 100] [--metrics 2000]

Slurm is faked (one in-process answer for all jobs), so this measures the file reading
(progress.json, jobs.jsonl, events.jsonl, the metrics.jsonl tail) and the rich rendering.
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from pathlib import Path

from rich.console import Console

from grpo_hpc.core.fsutil import append_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import ProgressRecord, TrainState, write_progress
from grpo_hpc.core.runs import SlurmView
from grpo_hpc.core.slurm import JobRecord
from grpo_hpc.status.report import collect_rows
from grpo_hpc.status.view import build_table


def make_runs(root: Path, n: int, metrics_lines: int) -> None:
    """n runs, each with a job, a progress record, a few events and a metrics log."""
    now = time.time()
    line = {
        "reward/mean": 0.4,
        "reward/correctness": 0.4,
        "kl": 0.01,
        "loss": 0.1,
        "tokens_per_s": 1000.0,
        "time/step": 2.0,
    }
    for i in range(n):
        paths = RunPaths(root / f"run-{i:03d}")
        paths.root.mkdir(parents=True)
        append_jsonl(
            paths.jobs,
            {
                "job_id": str(1000 + i),
                "attempt": 0,
                "submitted_at": now,
                "reason": "bench",
                "profile": "h100x2",
                "executor": "slurm",
            },
        )
        write_progress(
            paths.progress,
            ProgressRecord(
                run=paths.name,
                job_id=str(1000 + i),
                state=TrainState.GENERATING,
                step=i,
                max_steps=500,
                reward_mean=0.4,
                kl=0.01,
                tokens_per_s=1000.0,
            ),
        )
        for k in range(5):
            append_jsonl(
                paths.events,
                {
                    "time": now,
                    "job_id": str(1000 + i),
                    "phase": "decision",
                    "action": "NONE",
                    "class": None,
                    "reason": f"e{k}",
                },
            )
        with open(paths.metrics, "w") as f:
            f.writelines(json.dumps({"step": s, **line}) + "\n" for s in range(metrics_lines))


def fake_query(ids: list[str]) -> SlurmView:
    return SlurmView({j: JobRecord(j, "RUNNING") for j in ids}, set(ids))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--metrics", type=int, default=2000, help="metrics lines per run")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        make_runs(Path(tmp), args.runs, args.metrics)
        t0 = time.perf_counter()
        rows = collect_rows(Path(tmp), query=fake_query)
        t1 = time.perf_counter()
        console = Console(file=io.StringIO(), width=160)
        console.print(build_table(rows, time.time()))
        t2 = time.perf_counter()
    print(
        f"{args.runs} runs: collect {1e3 * (t1 - t0):.1f} ms, build+render "
        f"{1e3 * (t2 - t1):.1f} ms, total {1e3 * (t2 - t0):.1f} ms"
    )


if __name__ == "__main__":
    main()
