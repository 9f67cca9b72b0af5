"""Benchmark: one GRPO step (generate + score + update) through the real trainer.

Builds a randomly initialised Llama of a realistic shape (weights do not change the
cost; a random model never emits EOS, so every completion has max_new_tokens — the
worst case), runs ``torchrun -m grpo_hpc.train`` for a few steps, and reports the
median per-phase times from metrics.jsonl (the first step, with warm-up, is dropped)
and the completions' mean length and share cut at the cap (over every step).

    python -m bench.speed.grpo_step --shape smollm2-135m --precision bf16 --out bench/results/x.json

With ``--model-dir`` (a real model) and ``--source gsm8k`` the prompts are GSM8K train
questions and completions end where the model puts EOS (``--num-train`` of them, drawn
in the trainer's seeded order: bench/trl/baseline.py gives TRL the same ones).

With ``--length-dist FILE`` each sampled row stops at a length drawn (seeded by ``--seed``)
from a recorded distribution scaled to ``--max-new`` (bench/speed/length_dist.py), through
a bench-side subclass of the native engine (bench/speed/imposed_lengths.py; ``--engine
native``); ``--record`` records every generation without imposing anything. Either way the
records (``generations-rank<R>.jsonl``) and the run's metrics are copied to ``--keep DIR``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bench.common import SHAPES, build_model, env_info, length_summary, write_result
from grpo_hpc.config.schema import (
    AlgoConfig,
    DistConfig,
    ModelConfig,
    RolloutConfig,
    TrainingConfig,
)

if TYPE_CHECKING:
    from grpo_hpc.core.paths import RunPaths


def refuse_missing_model(paths: RunPaths) -> None:
    """Stop with grpo-submit's one line (exit 2) where the run's model directory is missing,
    before torchrun and the trainer's imports (about 7 CPU s a run) find it out."""
    from grpo_hpc.config.load import load_resolved
    from grpo_hpc.submit.preflight import check_model

    problems = check_model(load_resolved(paths.config).model, is_offline=True)
    if problems:
        print(f"grpo_step: error: {problems[0]}", file=sys.stderr)
        raise SystemExit(2)


def run(args: argparse.Namespace, work: Path) -> dict:
    from grpo_hpc.config.profiles import profile_from_dict
    from grpo_hpc.core.paths import RunPaths
    from grpo_hpc.submit.job import create_run

    model_dir = args.model_dir or work / "model"
    if not args.model_dir:
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
        f"model.gradient_checkpointing={args.grad_ckpt or args.ckpt_every > 1}",
        f"model.checkpoint_every={args.ckpt_every}",
        f"rollout.prompts_per_step={args.prompts}",
        f"rollout.num_generations={args.G}",
        f"rollout.max_new_tokens={args.max_new}",
        f"algo.micro_batch_size={args.micro}",
        f"algo.micro_batch_tokens={args.micro_tokens}",
        f"algo.packing={args.packing}",
        f"training.max_steps={args.steps}",
        "training.save_every_steps=0",
        "training.save_final=false",  # steps are timed; a 7B checkpoint would not fit the disk
        "wandb.mode=disabled",
        "reward.correctness=1.0",
        "reward.custom={grpo_hpc.train.rewards.toy:digit_fraction: 1.0}",
        f"rollout.engine={args.engine}",
        f"dist.compile={args.compile}",
        f"rollout.release_engine_memory={args.release_engine}",
        f"training.seed={args.seed}",  # the prompt order: a caller may rebuild it from this
        f"training.num_threads={TrainingConfig().num_threads}",  # not the tiny preset's 1
        *data_overrides(args),
        *args.override,
    ]
    create_run(paths, profile, "tiny", overrides)
    refuse_missing_model(paths)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={args.nproc}",
        "--standalone",
        *([f"--numa-binding={args.numa_binding}"] if args.numa_binding else []),
        *child_command(args, paths.root),
    ]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(failure_summary(proc.stderr, paths))
    if args.keep:
        keep_run(paths, args.keep)
    logged = [json.loads(x) for x in paths.metrics.read_text().splitlines()]
    logged = [m for m in logged if "loss" in m]
    steps = logged[1:]
    keys = [
        "time/step",
        "time/generate",
        "time/score",
        "time/train",
        "tokens_per_s",
        "gen_len/mean",
        "rollout/truncated",
        "gpu_mem_gb",
        "gpu_alloc_retries",
    ]
    imposed = {}
    if args.length_dist:  # said in every result of such a run
        imposed = {"lengths": f"lengths imposed from {args.length_dist}"}
    return imposed | {
        "median": {k: statistics.median(m[k] for m in steps) for k in keys if k in steps[0]},
        "alloc_retries_total": logged[-1].get("gpu_alloc_retries"),
        "steps_measured": len(steps),
        "lengths": length_summary(logged, "gen_len/mean", "rollout/truncated"),
        "wall_s": wall,
    }


def child_command(args: argparse.Namespace, run_dir: Path) -> list[str]:
    """What torchrun runs on each rank: the trainer; under bench/memory/probe.py's instruments
    with ``--probe``; behind the ladder's memory cap with ``--cap-gib``."""
    cap = ["--cap-gib", str(args.cap_gib)] if args.cap_gib else []
    if args.length_dist or args.record:
        if args.probe or args.cap_gib:
            raise SystemExit("--length-dist/--record run without --probe and --cap-gib")
        lengths = ["--lengths", str(args.length_dist), "--seed", str(args.seed)]
        switch = ["--switch-interval-ms", str(args.switch_interval_ms)]
        return [
            "-m", "bench.speed.imposed_lengths", str(run_dir),
            "--record", str(run_dir / RECORD_DIR), *(lengths if args.length_dist else []),
            *(switch if args.switch_interval_ms else []),
        ]  # fmt: skip
    if args.probe:
        return ["-m", "bench.memory.probe", "child", str(run_dir), *cap]
    if args.cap_gib:  # the ladder's child caps each rank's memory at the budget first
        return ["-m", "bench.memory.ladder", "--child", str(run_dir), *cap]
    return ["-m", "grpo_hpc.train", str(run_dir)]


RECORD_DIR = "generations"
"""The run's folder of generation records (bench/speed/imposed_lengths.py)."""
KEPT = ("metrics.jsonl", "samples.jsonl", "config.yaml", "progress.json", RECORD_DIR)


def keep_run(paths: RunPaths, into: Path) -> None:
    """Copy what an analysis reads of a finished run (metrics, samples, config, progress,
    generation records) out of the temporary run directory."""
    into.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        src = paths.root / name
        if src.is_dir():
            shutil.copytree(src, into / name, dirs_exist_ok=True)
        elif src.is_file():
            shutil.copy2(src, into / name)


def data_overrides(args: argparse.Namespace) -> list[str]:
    """The prompts' source: the ``tiny`` config's arithmetic unless ``--source`` says
    otherwise. GSM8K holds out no test questions here: the longest prompt sizes the
    engine's cache, so only the questions trained on may set it. GSM8K runs a real model,
    whose completion lengths follow the policy: the ``tiny`` config's rate (1e-3, for a
    random model) wrecks it in one update, after which every completion runs to the cap,
    so it trains at TRL's rate in bench/trl/baseline.py (1e-6)."""
    if args.source == "arithmetic":
        return [f"data.num_train={args.num_train}"] if args.num_train else []
    return [
        f"data.source={args.source}",
        f"data.num_train={args.num_train}",
        "data.num_eval=0",
        "optim.lr=1e-6",
    ]


def failure_summary(stderr: str, paths: RunPaths) -> str:
    """torchrun's tail, then what says why (error lines of every rank, the trainer's
    progress record) last, where a caller that keeps only the end of stderr still sees it."""
    errors = [ln for ln in stderr.splitlines() if "Error" in ln or "error:" in ln][-8:]
    progress = paths.progress.read_text() if paths.progress.exists() else "no progress.json"
    return "\n".join([stderr[-2500:], "-- errors:", *errors, "-- progress:", progress])


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="bf16")
    p.add_argument("--strategy", choices=["ddp", "fsdp"], default="ddp")
    p.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument(
        "--numa-binding",
        choices=["node", "socket", "exclusive", "core-complex"],
        help="torchrun's --numa-binding: each rank on the CPUs near its GPU (default: unbound)",
    )
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-new", type=int, default=256)
    p.add_argument(
        "--source",
        choices=["arithmetic", "gsm8k"],
        default="arithmetic",
        help="data.source: gsm8k with a real --model-dir gives real completion lengths",
    )
    p.add_argument(
        "--num-train", type=int, default=0, help="data.num_train (0: the config's, all GSM8K)"
    )
    p.add_argument("--seed", type=int, default=0, help="training.seed (sets the prompt order)")
    # Memory settings default to the project's defaults (grpo_hpc.config.schema), so that a plain
    # run measures what a user gets without setting them.
    algo, model, rollout = AlgoConfig(), ModelConfig(), RolloutConfig()
    p.add_argument(
        "--micro", type=int, default=algo.micro_batch_size, help="most rows per micro-batch"
    )
    p.add_argument(
        "--micro-tokens",
        type=int,
        default=algo.micro_batch_tokens,
        help="most tokens per micro-batch",
    )
    p.add_argument(
        "--packing",
        action=argparse.BooleanOptionalAction,
        default=algo.packing,
        help="algo.packing: each micro-batch as one packed sequence (default: auto)",
    )
    p.add_argument("--steps", type=int, default=4)
    p.add_argument(
        "--grad-ckpt", action=argparse.BooleanOptionalAction, default=model.gradient_checkpointing
    )
    p.add_argument(
        "--ckpt-every", type=int, default=model.checkpoint_every,
        help="checkpoint one layer in N (implies --grad-ckpt)",
    )  # fmt: skip
    p.add_argument(
        "--release-engine",
        action=argparse.BooleanOptionalAction,
        default=rollout.release_engine_memory,
        help="rollout.release_engine_memory",
    )
    p.add_argument("--engine", choices=["auto", "native", "hf"], default="auto")
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=DistConfig().compile,
        help="dist.compile (training forward; default: the project's, auto)",
    )
    p.add_argument("--cap-gib", type=float, default=0.0, help="cap each GPU's memory at this")
    p.add_argument(
        "--model-dir",
        type=Path,
        help="use this saved model, not a new one (or random:bench/shapes/S: built at load)",
    )
    p.add_argument(
        "--length-dist",
        type=Path,
        help="impose each sampled row's length, drawn from this recorded distribution "
        "scaled to --max-new (needs --engine native; bench/speed/length_dist.py)",
    )
    p.add_argument("--record", action="store_true", help="record every generation (real lengths)")
    p.add_argument(
        "--switch-interval-ms",
        type=float,
        default=0.0,
        help="with --length-dist/--record: the trainer process's sys.setswitchinterval, in ms "
        "(0: Python's 5 ms); an experiment: does an asynchronous run's decode thread wait "
        "for the GIL while the update's Python holds it?",
    )
    p.add_argument("--keep", type=Path, help="copy the run's metrics and records here")
    p.add_argument("--work", type=Path, help="the run's folder (default: a temporary one)")
    p.add_argument(
        "--probe",
        action="store_true",
        help="run the trainer under bench/memory/probe.py (its files go to $PROBE_OUT)",
    )
    p.add_argument(
        "--override", action="append", default=[], help="another config key=value (repeatable)"
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if args.work:  # kept: a caller that stops the run still finds its metrics there
        result = run(args, args.work)
    else:
        with tempfile.TemporaryDirectory() as d:
            result = run(args, Path(d))
    paths = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    result["config"] = paths
    result["env"] = env_info()
    print(json.dumps(result, indent=2))
    write_result(result, args.out)


if __name__ == "__main__":
    main()
