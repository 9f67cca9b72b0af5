"""One ladder row's plan (as ``bench/memory/ladder.py`` runs it) under the probe, and the per-rank
summary of probe files (:func:`summarize_probes`, also used by ``merge.py``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def ladder_run(args: argparse.Namespace) -> dict:
    """One ladder row's plan (bench/memory/ladder.py: the estimator's settings for the budget's
    2-GPU profile), run under the probe; the estimator's figures beside the measured ones."""
    from bench.memory import ladder
    from grpo_hpc.config.profiles import profile_from_dict
    from grpo_hpc.core.paths import RunPaths
    from grpo_hpc.memory import fit as memory_fit
    from grpo_hpc.submit.job import create_run

    largs = argparse.Namespace(
        device=args.device, prompts=args.prompts, G=args.G, max_new=args.max_new,
        micro_tokens=args.micro_tokens, nproc=args.nproc, steps=args.steps,
    )  # fmt: skip
    est = ladder.estimates(largs, args.shape, args.budget, args.mode)
    plan = est[args.nproc]
    if args.cpu_offload:  # the same plan with FSDP2's CPU offload (the profile allows it)
        offload = dataclasses.replace(plan.settings, cpu_offload=True)
        plan = memory_fit.fit(ladder.load_shape(args.shape), offload, None)
    s = plan.settings
    with tempfile.TemporaryDirectory() as work:
        paths = RunPaths(Path(work) / "run")
        prof = {"executor": "local", "precision": s.precision, "strategy": s.strategy}
        profile = profile_from_dict({**prof, "attn_implementation": "sdpa"}, name="probe")
        create_run(paths, profile, "tiny", ladder.row_overrides(largs, args.shape, s), force=True)
        cap = ladder.BUDGETS[args.budget][1] if args.device == "cuda" else 0
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={args.nproc}", "--max-restarts=0", "-m", "bench.memory.probe",
               "child", str(paths.root), "--cap-gib", str(cap)]  # fmt: skip
        os.environ["PROBE_OUT"] = str(args.out)
        t0 = time.monotonic()
        code, tail = ladder._run_group(cmd, args.timeout)
        wall = time.monotonic() - t0
        metrics = (
            [json.loads(x) for x in paths.metrics.read_text().splitlines()]
            if paths.metrics.exists()
            else []
        )
        progress = json.loads(paths.progress.read_text()) if paths.progress.exists() else {}
    ranks = sorted(args.out.glob("probe_rank*.json"))
    probes = [json.loads(p.read_text()) for p in ranks]
    e = plan.estimate
    return {
        "shape": args.shape, "budget": args.budget, "mode": args.mode, "gpus": args.nproc,
        "settings": s.describe(), "run_settings": dataclasses.asdict(s),
        "exit_code": code, "wall_s": round(wall, 1),
        "reason": progress.get("reason"), "stderr_tail": tail[-800:] if code else "",
        "estimate": {"peak_gib": round(e.peak_gib, 3), "total_gib": round(e.total_gib, 3),
                     "phase": e.peak_phase, "breakdown_gib": e.breakdown()},
        "switches": {k: v for k, v in os.environ.items() if k.startswith("PROBE_")},
        "metrics": [{k: m.get(k) for k in ("step", "time/step", "time/generate", "time/train",
                                            "gpu_mem_gb", "gpu_alloc_retries")}
                    for m in metrics if "loss" in m],
        "measured": summarize_probes(probes),
        "records": {f"rank{d['rank']}": d["records"] for d in probes},
    }  # fmt: skip


def summarize_probes(probes: list[dict]) -> dict:
    """Per rank: overall peak, the largest record per phase kind, step timings."""
    out = {}
    for doc in probes:
        by_phase: dict[str, dict] = {}
        for r in doc["records"]:
            key = r["phase"]
            best = by_phase.get(key)
            if best is None or r.get("peak_since_last_gib", 0) > best.get("peak_since_last_gib", 0):
                by_phase[key] = r
        steps = [s for s in doc["steps"] if s.get("step", 0) > 1 and not s.get("profiled")]
        med = {}
        for k in ("step_s", "generate_s", "refill_s", "update_s", "backward_s", "optimizer_step_s"):
            vals = [s[k] for s in steps if k in s]
            if vals:
                med[k] = round(statistics.median(vals), 4)
        out[f"rank{doc['rank']}"] = {
            "overall_peak_gib": doc["overall_peak_gib"],
            "max_record_per_phase": by_phase,
            "median_after_step1": med,
            "steps": doc["steps"],
            "history": doc.get("history"),
            "profile": doc.get("profile"),
        }
    return out
