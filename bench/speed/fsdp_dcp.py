"""Benchmark + check: FSDP2 with sharded (DCP) checkpoints, through the real trainer.

Runs ``torchrun -m grpo_hpc.train`` with FSDP2 on ``--nproc`` processes (NCCL on GPUs,
gloo on CPU) on a randomly initialised Llama of a realistic shape, saving sharded
checkpoints; then checks them with ``grpo-ckpt verify``, resumes from the first one on
the same world size (are the final weights bit-identical to the uninterrupted run's?)
and on one process (DCP resharding). Reports times, checkpoint sizes and the outcomes.

    # two GPUs (the H200-x2 run recorded in bench/results/):
    python -m bench.speed.fsdp_dcp --nproc 2 --shape smollm2-135m --precision bf16 \\
        --out bench/results/fsdp_dcp_h200x2_2026-11-23.json
    # CPU smoke test (gloo, tiny shape, ~1 min on 2 cores):
    python -m bench.speed.fsdp_dcp --nproc 2 --shape tiny --precision fp32 --max-new 8 \
        --prompts 2 --G 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import SHAPES, build_model, env_info, write_result
from grpo_hpc.train.state.checkpoint import model_weights


def make_run(args: argparse.Namespace, work: Path):
    from grpo_hpc.config.profiles import profile_from_dict
    from grpo_hpc.core.paths import RunPaths
    from grpo_hpc.submit.job import create_run

    model_dir = work / "model"
    build_model(model_dir, args.shape)
    profile = profile_from_dict(
        {"executor": "local", "precision": args.precision, "strategy": "fsdp",
         "nproc_per_node": args.nproc},
        name="bench-fsdp-dcp",
    )  # fmt: skip
    paths = RunPaths(work / "run")
    overrides = [
        f"model.name_or_path={model_dir}",
        f"rollout.prompts_per_step={args.prompts}",
        f"rollout.num_generations={args.G}",
        f"rollout.max_new_tokens={args.max_new}",
        f"algo.micro_batch_size={args.micro}",
        f"training.max_steps={args.steps}",
        f"training.save_every_steps={args.save_every}",
        "training.keep_last=0",
        "wandb.mode=disabled",
    ]
    create_run(paths, profile, "tiny", overrides)
    return paths


def torchrun(paths, nproc: int) -> float:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           "--standalone", "-m", "grpo_hpc.train", str(paths.root)]  # fmt: skip
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"torchrun failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return time.time() - t0


def max_abs_diff(a: dict, b: dict) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def ckpt_facts(ckpt: Path) -> dict:
    from grpo_hpc.core.manifest import verify_checkpoint

    manifest = json.loads((ckpt / "manifest.json").read_text())
    shards = sorted((ckpt / "dcp").glob("*.distcp")) if (ckpt / "dcp").is_dir() else []
    return {
        "format": manifest.get("format"),
        "world_size": manifest.get("world_size"),
        "bytes": sum(e["size"] for e in manifest["files"].values()),
        "shard_files": len(shards),
        "shard_bytes": [p.stat().st_size for p in shards],
        "verify_problems": verify_checkpoint(ckpt),
    }


def run(args: argparse.Namespace, work: Path) -> dict:
    from grpo_hpc.submit.job import rewind

    paths = make_run(args, work)
    result: dict = {"train_wall_s": torchrun(paths, args.nproc)}
    steps = [json.loads(x) for x in paths.metrics.read_text().splitlines()]
    steps = [m for m in steps if "loss" in m][1:]
    keys = ["time/step", "time/generate", "time/train", "gpu_mem_gb"]
    result["median"] = {k: statistics.median(m[k] for m in steps) for k in keys if k in steps[0]}
    first, last = args.save_every, args.steps
    result["checkpoint"] = ckpt_facts(paths.checkpoint(last))
    reference = model_weights(paths.checkpoint(last))

    rewind(paths, first)  # resume from the first checkpoint, same world size
    result["resume_same_world_wall_s"] = torchrun(paths, args.nproc)
    again = model_weights(paths.checkpoint(last))
    result["resume_same_world"] = {
        "bit_identical": all(bool((again[k] == reference[k]).all()) for k in reference),
        "max_abs_diff": max_abs_diff(again, reference),
    }

    rewind(paths, first)  # and in one process: DCP reshards the 2-rank checkpoint
    text = paths.config.read_text().replace(f"nproc_per_node: {args.nproc}", "nproc_per_node: 1")
    paths.config.write_text(text)
    result["resume_one_process_wall_s"] = torchrun(paths, 1)
    single = model_weights(paths.checkpoint(last))
    result["resume_one_process"] = {
        "finished": json.loads(paths.progress.read_text())["state"] == "finished",
        "checkpoint_format": ckpt_facts(paths.checkpoint(last))["format"],
        "max_abs_diff_vs_uninterrupted": max_abs_diff(single, reference),
    }
    return result


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="bf16")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--micro", type=int, default=16)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-every", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        result = run(args, Path(d))
    import torch

    result["config"] = vars(args) | {"out": str(args.out) if args.out else None}
    result["env"] = env_info() | {"backend": "nccl" if torch.cuda.is_available() else "gloo"}
    print(json.dumps(result, indent=2))
    write_result(result, args.out)


if __name__ == "__main__":
    main()
