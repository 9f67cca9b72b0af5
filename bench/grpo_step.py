"""Benchmark: one GRPO step (generate + score + update) through the real trainer.

Builds a randomly initialised Llama of a realistic shape (weights do not change the
cost; a random model never emits EOS, so every completion has max_new_tokens — the
worst case), runs ``torchrun -m grpo_hpc.train`` for a few steps, and reports the
median per-phase times from metrics.jsonl (the first step, with warm-up, is dropped).

    python bench/grpo_step.py --shape smollm2-135m --precision bf16 --out bench/results/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {
    # hidden, layers, heads, kv_heads, intermediate, vocab
    "smollm2-135m": (576, 30, 9, 3, 1536, 49152),
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151936),
    "tiny": (64, 2, 4, 2, 128, 1024),
}


def build_model(out: Path, shape: str) -> None:
    from grpo_hpc.train.models import LlamaShape, save_random_llama

    h, n_layers, heads, kv, inter, vocab = SHAPES[shape]
    save_random_llama(out, LlamaShape(h, n_layers, heads, kv, inter), seed=0, vocab_size=vocab)


def run(args: argparse.Namespace, work: Path) -> dict:
    from grpo_hpc.paths import RunPaths
    from grpo_hpc.profiles import profile_from_dict
    from grpo_hpc.submit import create_run

    model_dir = work / "model"
    build_model(model_dir, args.shape)
    profile = profile_from_dict(
        {
            "executor": "local",
            "precision": args.precision,
            "strategy": args.strategy,
            "attn_implementation": args.attn,
            "nproc_per_node": args.nproc,
        },
        name="bench",
    )
    paths = RunPaths(work / "run")
    overrides = [
        f"model.name_or_path={model_dir}",
        f"model.gradient_checkpointing={args.grad_ckpt}",
        f"rollout.prompts_per_step={args.prompts}",
        f"rollout.num_generations={args.G}",
        f"rollout.max_new_tokens={args.max_new}",
        f"algo.micro_batch_size={args.micro}",
        f"training.max_steps={args.steps}",
        "training.save_every_steps=0",
        "wandb.mode=disabled",
        "reward.correctness=1.0",
        "reward.custom={grpo_hpc.train.toy_rewards:digit_fraction: 1.0}",
    ]
    create_run(paths, profile, "tiny", overrides)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={args.nproc}",
        "--standalone",
        "-m",
        "grpo_hpc.train",
        str(paths.root),
    ]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-4000:])
    steps = [json.loads(x) for x in paths.metrics.read_text().splitlines()]
    steps = [m for m in steps if "loss" in m][1:]
    keys = [
        "time/step",
        "time/generate",
        "time/score",
        "time/train",
        "tokens_per_s",
        "gen_len/mean",
        "gpu_mem_gb",
    ]
    return {
        "median": {k: statistics.median(m[k] for m in steps) for k in keys if k in steps[0]},
        "steps_measured": len(steps),
        "wall_s": wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="bf16")
    p.add_argument("--strategy", choices=["ddp", "fsdp"], default="ddp")
    p.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-new", type=int, default=256)
    p.add_argument("--micro", type=int, default=16)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--grad-ckpt", action="store_true")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        result = run(args, Path(d))
    import torch
    import transformers

    result["config"] = vars(args) | {"out": str(args.out) if args.out else None}
    result["env"] = {
        "device": torch.cuda.get_device_name(0)
        if torch.cuda.is_available()
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
