"""Fault campaign on the local test Slurm cluster (slurm/up.sh --nodes 2): one tiny run per
trial, driven by the real grpo-submit and grpo-monitor, with faults at random moments from
a seeded generator (bench/faults/plan.py). Per trial: finished or not, final weights against
an uninterrupted run with the same seed, jobs submitted, duplicate live jobs (squeue polled
throughout), checkpoints failing ``grpo-ckpt verify``, time to recover.

Results go to --out after every trial (temp file, then rename), so a campaign that is cut
short leaves usable partial results. Needs root (tmpfs mounts, slurmctld and node faults)
and the cluster up. The slurmctld and node faults disturb other users of the cluster for
seconds; the cluster is brought back (slurm/up.sh --nodes 2) after each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from bench.faults import ending_model
from bench.faults.plan import (
    EXCLUSIVE,
    PLACEMENT_OVERRIDES,
    PLACEMENTS,
    TrialPlan,
    TrialResult,
    batches,
    markdown_table,
    plan_trial,
    summarize,
    verdict,
)
from bench.faults.trial import (
    MAX_STEPS,
    MONITOR_FLAGS,
    REPO,
    RUN_OVERRIDES,
    Trial,
    restore_cluster,
    sh,
)
from grpo_hpc.core.fsutil import atomic_write_text


def git_commit() -> str:
    """The commit the campaign ran (with "+dirty" when the tree had changes)."""
    r = sh("git", "-C", str(REPO), "describe", "--always", "--dirty=+dirty", "--abbrev=12")
    return r.stdout.strip() or "unknown"


def trial_weights(result: TrialResult) -> str | None:
    return next((n.split()[1] for n in result.notes if n.startswith("weights ")), None)


# ------------------------------------------------------------------------- campaign


def reference_plans(plans: list[TrialPlan], placement: str = "sync") -> list[TrialPlan]:
    """One uninterrupted run per profile the trials use (index -1, -2, ...), in the
    campaign's placement."""
    profiles = sorted({p.profile for p in plans})
    return [TrialPlan(-1 - i, "reference", prof, (), placement) for i, prof in enumerate(profiles)]


def _run_trial(
    plan: TrialPlan, work: Path, seed: int, max_steps: int, extra: tuple[str, ...] = ()
) -> tuple[Trial, TrialResult]:
    name = f"reference-{plan.profile}" if plan.kind == "reference" else f"trial-{plan.index:03d}"
    trial = Trial(plan, work / name, seed, max_steps, extra)
    result = trial.run()
    if plan.kind in EXCLUSIVE or any(f.kind in EXCLUSIVE for f in plan.faults):
        why = restore_cluster()
        if why:
            result.notes.append(why)
    return trial, result


def write_results(out: Path, meta: dict, results: list[TrialResult]) -> None:
    doc = {**meta, "summary": summarize(results), "trials": [asdict(r) for r in results]}
    for r, row in zip(results, doc["trials"], strict=True):
        row["passed"], row["why"] = not verdict(r), verdict(r)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(doc, indent=1) + "\n")


EXAMPLES = """examples:
  python -m bench.faults --trials 10 --seed 1 --out bench/results/faults_cpu_2026-11-23.json
  python -m bench.faults --trials 100 --seed 1 --out bench/results/faults_cpu_2026-11-23.json
  python -m bench.faults --seed 1 --only 17,23 --out /tmp/rerun.json   # rerun two trials
  python -m bench.faults --plan --trials 20 --seed 1      # print the schedule, run nothing
  python -m bench.faults --table bench/results/faults_cpu_2026-11-23.json   # the README table
  python -m bench.faults --placement split --trials 12 --parallel 2 --out /tmp/split.json
  python -m bench.faults --placement split --trials 13 --parallel 2 --ending-model \\
      --override algo.max_staleness=2 --override rollout.partial_pool=2   # partial rollouts
      --override algo.max_staleness=2 --override rollout.partial_pool=2   # partial rollouts

Trial i of seed S is the same whatever --trials is (its kind is kinds[i % len(kinds)] of
its placement: kinds_for in bench/faults/plan.py; its moments come from a generator seeded
with S, i and the placement, the synchronous campaign's as before placements existed).
Needs root and slurm/up.sh --nodes 2.
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.faults", description=__doc__.split("\n\n")[0], epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--trials", type=int, default=10, help="number of trials (default 10)")
    p.add_argument("--seed", type=int, default=1, help="campaign seed (default 1)")
    p.add_argument("--max-steps", type=int, default=MAX_STEPS, help="steps per run (default 6)")
    p.add_argument("--only", help="comma-separated trial indices to run (of --seed)")
    p.add_argument(
        "--placement", choices=PLACEMENTS, default="sync",
        help="sync (default); thread: every run algo.max_staleness=1; split: a trainer and "
        "a generator process (profile slurm-local-split), algo.max_staleness=1",
    )  # fmt: skip
    p.add_argument(
        "--out", type=Path,
        help="results JSON (default bench/results/faults_cpu_2026-11-23.json for sync, "
        "/tmp/grpo-faults-<placement>.json otherwise)",
    )  # fmt: skip
    p.add_argument("--work", type=Path, help="scratch dir for the runs (default /tmp/...)")
    p.add_argument(
        "--parallel", type=int, default=1, metavar="K",
        help="trials at once (slurmctld/node faults always run alone; default 1)",
    )  # fmt: skip
    p.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE",
        help="a config override every run adds after its placement's (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--ending-model", action="store_true",
        help="run on a tiny model whose answers end at many lengths "
        "(bench/faults/ending_model.py, at its 48-token cap): partial rollouts continue them",
    )  # fmt: skip
    p.add_argument("--keep", action="store_true", help="keep every trial's run directory")
    p.add_argument("--plan", action="store_true", help="print the schedule and exit")
    p.add_argument("--table", type=Path, metavar="JSON", help="print a results file's table")
    args = p.parse_args(argv)
    if args.table:
        print(markdown_table(json.loads(args.table.read_text())["summary"]))
        return 0
    indices = [int(i) for i in args.only.split(",")] if args.only else range(args.trials)
    plans = [plan_trial(args.seed, i, args.placement) for i in indices]
    if args.out is None:
        sync = REPO / "bench/results/faults_cpu_2026-11-23.json"
        args.out = (
            sync if args.placement == "sync" else Path(f"/tmp/grpo-faults-{args.placement}.json")
        )
    if args.plan:
        for plan in plans:
            print(json.dumps(plan.to_json()))
        return 0
    work = args.work or Path(f"/tmp/grpo-faults-{args.seed}-{os.getpid()}")
    extra = tuple(args.override)
    if args.ending_model:  # built once, read by every run (the nodes share the disk)
        model = ending_model.save(work / "ending-model")
        cap = f"rollout.max_new_tokens={ending_model.MAX_NEW_TOKENS}"
        extra = (f"model.name_or_path={model}", cap, *extra)
    meta = {
        "campaign": {
            "seed": args.seed,
            "placement": args.placement,
            "trials": len(plans),
            "started": time.time(),
            "commit": git_commit(),
            "command": " ".join(["python", "-m", "bench.faults", *(argv or sys.argv[1:])]),
        },
        "run": {
            "config": "tiny",
            "overrides": [
                f"training.max_steps={args.max_steps}",
                *RUN_OVERRIDES,
                *PLACEMENT_OVERRIDES[args.placement],
                *extra,
            ],
            "monitor": MONITOR_FLAGS,
        },
    }
    why = restore_cluster()
    if why:
        raise SystemExit(f"faults.py: {why}")
    refs: dict[str, str | None] = {}
    results: list[TrialResult] = []
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        for batch in batches(reference_plans(plans, args.placement) + plans, args.parallel):
            runs = [
                pool.submit(_run_trial, p, work, args.seed, args.max_steps, extra) for p in batch
            ]
            for plan, fut in zip(batch, runs, strict=True):
                trial, r = fut.result()
                if plan.kind == "reference":
                    ok = r.finished and not r.error and r.max_live_jobs <= 1
                    refs[plan.profile] = trial_weights(r) if ok else None
                    meta["reference_weights"] = refs
                    print(f"reference {plan.profile}: {refs[plan.profile]}", flush=True)
                    if refs[plan.profile] is None:
                        raise SystemExit(f"faults.py: the uninterrupted run failed: {r}")
                    continue
                got = trial_weights(r)
                r.weights_match = None if got is None else got == refs[plan.profile]
                results.append(r)
                write_results(args.out, meta, sorted(results, key=lambda x: x.index))
                status = "ok" if not verdict(r) else "FAIL: " + "; ".join(verdict(r))
                line = f"trial {plan.index:3d} {plan.kind:26s} {r.wall_s:6.1f}s"
                print(f"{line} jobs {r.jobs_submitted} {status}", flush=True)
                if not verdict(r) and not args.keep:  # a failed trial's files stay
                    shutil.rmtree(trial.root, ignore_errors=True)
                    shutil.rmtree(trial.root.with_name(trial.root.name + "-files"), True)
    s = summarize(results)["total"]
    print(f"passed {s['passed']}/{s['trials']}; results in {args.out}")
    return 0 if s["passed"] == s["trials"] else 1


if __name__ == "__main__":
    sys.exit(main())
