"""Benchmark: TRL's ``GRPOTrainer`` and grpo_hpc's trainer on the same machine, the same
model (random unless ``--model-dir``), prompts, batch, lengths and beta, in one command;
writes ``speedup_vs_trl``.

TRL is configured like the issue's reference run: HF generate (no vLLM), gradient
checkpointing, bf16 autocast over fp32 weights, ``prompts x G`` completions per
optimizer step in micro-batches of ``--micro`` completions. Steps are timed with a
callback (optimizer step to optimizer step, first step dropped as warm-up). grpo_hpc
runs through ``bench/speed/grpo_step.py`` (``torchrun -m grpo_hpc.train``) with the same shape.

    python -m bench.trl.baseline --shape qwen2.5-0.5b --engine native --out bench/results/x.json

TRL runs once; grpo_hpc runs once per ``--variants`` entry (the project defaults first),
each against that same TRL run. ``--nproc N``: TRL as a TRL user runs several GPUs,
``accelerate launch`` with FSDP2 (``--trl-mode``; bench/trl/multi.py), and grpo_hpc under
torchrun with N ranks (a variant's ``--strategy`` picks DDP or FSDP2); ``--prompts`` stays
the global count per step::

    python -m bench.trl.baseline --shape qwen2.5-1.5b --nproc 2 --prompts 16 --micro 16 \
        --engine native --variants "fsdp=--strategy fsdp" "ddp=--strategy ddp" --out F

The default prompts are grpo_hpc's synthetic arithmetic questions, and a random model
never emits EOS: every completion runs to ``--max-new``, the worst case. Real lengths:
``--prompts-from gsm8k`` gives both sides the same GSM8K train questions in the same
order (grpo_hpc's loader, system prompt and seeded sampler; TRL reads them unshuffled),
and a real model in ``--model-dir`` ends its completions at EOS. Each side reports its
mean completion length and the share cut at the cap (``lengths``)::

    python -m bench.trl.baseline --model-dir ~/.cache/grpo_hpc/models/smollm2-135m-instruct \
        --shape smollm2-135m --prompts-from gsm8k --max-new 512 --engine native \
        --variants default= --out bench/results/x.json

Model families (docs/models.md): ``--shape`` takes a bench/shapes config too (random weights of
it, saved once in fp32 with the char tokenizer; both sides train that directory), e.g.
Qwen3-1.7B's default step against TRL on one H100::

    python -m bench.trl.baseline --shape qwen3-1.7b --micro 16 --engine native \
        --variants default= --out bench/results/x.json

``--shape-dir DIR`` takes any directory with a config.json (a CPU dry run at fixture size).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import (
    SHAPES,
    build_model,
    env_info,
    save_random_config,
    shape_names,
    write_result,
)
from bench.trl import multi as trl_multi
from bench.trl.prompts import SEED, gsm8k_train_size
from bench.trl.trl_run import run_trl, trl_side

DEFAULT_VARIANTS = [
    "default=",
    "previous=--no-grad-ckpt --micro 16 --micro-tokens 8192",
    "tok16k=--micro-tokens 16384",
    "release=--release-engine",
    "packed=--packing",
    "plain=--no-compile --no-packing",
]
"""grpo_hpc's side, ``name=grpo_step.py flags``. ``default`` passes no memory flag: it runs
the project's defaults (grpo_hpc.config.schema), which is what the comparison with TRL judges."""


def project_defaults() -> dict:
    """The memory settings a run gets when it sets none (recorded beside the figures)."""
    from grpo_hpc.config.schema import AlgoConfig, ModelConfig, RolloutConfig

    algo, model = AlgoConfig(), ModelConfig()
    return {
        "model.gradient_checkpointing": model.gradient_checkpointing,
        "model.checkpoint_every": model.checkpoint_every,
        "algo.micro_batch_size": algo.micro_batch_size,
        "algo.micro_batch_tokens": algo.micro_batch_tokens,
        "rollout.release_engine_memory": RolloutConfig().release_engine_memory,
    }


def run_ours(
    args: argparse.Namespace, work: Path, name: str, flags: list[str], model: Path
) -> dict:
    """One grpo_hpc variant through grpo_step.py, on the model TRL trained (built once)."""
    out = work / f"ours-{name}.json"
    cmd = [
        sys.executable,
        "-m",
        "bench.speed.grpo_step",
        # a bench/shapes config is not grpo_step's to build: it trains the saved model
        *([f"--shape={args.shape}"] if args.shape in SHAPES and not args.shape_dir else []),
        f"--model-dir={model}",
        f"--precision={args.precision}",
        f"--prompts={args.prompts}",
        f"--G={args.G}",
        f"--max-new={args.max_new}",
        f"--steps={args.steps}",
        f"--engine={args.engine}",
        f"--cap-gib={args.cap_gib}",
        f"--seed={SEED}",
        f"--nproc={args.nproc}",
        *ours_data_flags(args),
        f"--out={out}",
        *flags,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.variant_timeout)
    except subprocess.TimeoutExpired:
        return {"flags": flags, "error": f"timed out after {args.variant_timeout} s"}
    if proc.returncode != 0:  # one variant failing (e.g. compile) must not lose the others
        return {"flags": flags, "error": proc.stderr[-3000:]}
    return {"flags": flags} | json.loads(out.read_text())


def ours_data_flags(args: argparse.Namespace) -> list[str]:
    """grpo_step.py's flags for the prompts TRL gets (nothing: its arithmetic default)."""
    if args.prompts_from != "gsm8k":
        return []
    return ["--source=gsm8k", f"--num-train={gsm8k_train_size(args)}"]


def compare(ours: dict, trl: dict | None) -> dict:
    """Speed-up and memory ratio of one grpo_hpc variant against TRL's run."""
    med = ours.get("median")
    if not trl or "error" in trl or not med:  # no TRL run, or it failed: no ratio
        return {"speedup_vs_trl": None, "memory_ratio_vs_trl": None}
    return {
        "speedup_vs_trl": trl["s_per_step_median"] / med["time/step"],
        # no peak on a CPU (plumbing checks): no ratio, not a division by zero
        "memory_ratio_vs_trl": (
            med.get("gpu_mem_gb", 0) / trl["peak_gib"] if trl["peak_gib"] else None
        ),
    }


def summary(args: argparse.Namespace, trl: dict | None, variants: dict[str, dict]) -> dict:
    """The result file: TRL's run, grpo_hpc's variants, the default's ratios, and the
    machine's environment."""
    head = variants.get("default", {})
    return {
        "benchmark": "trl_vs_grpo_hpc",
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "project_defaults": project_defaults(),
        "trl": trl,
        "grpo_hpc": variants,
        "speedup_vs_trl": head.get("speedup_vs_trl"),
        "memory_ratio_vs_trl": head.get("memory_ratio_vs_trl"),
        "env": env_info(),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--shape",
        choices=shape_names(),
        default="qwen2.5-0.5b",
        help="a Qwen2.5 shape (a random Llama) or a bench/shapes config (e.g. qwen3-1.7b: "
        "random weights of it, saved once, trained by both sides)",
    )
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-new", type=int, default=256)
    p.add_argument(
        "--prompts-from",
        choices=["arithmetic", "gsm8k"],
        default="arithmetic",
        help="both sides' prompts; gsm8k with a real --model-dir: real completion lengths",
    )
    p.add_argument("--micro", type=int, default=16, help="TRL's completions per micro-batch")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--beta", type=float, default=0.0)
    p.add_argument("--engine", default="auto", help="grpo_hpc rollout.engine")
    p.add_argument(
        "--variants",
        nargs="*",
        default=DEFAULT_VARIANTS,
        help="grpo_hpc runs as name=grpo_step.py flags ('default=' runs the project defaults)",
    )
    p.add_argument("--variant-timeout", type=int, default=300, help="seconds per variant")
    p.add_argument(
        "--precision", default="bf16", help="grpo_hpc's precision (fp32: a CPU smoke run)"
    )
    p.add_argument("--skip-trl", action="store_true", help="only grpo_hpc (debugging)")
    p.add_argument("--cap-gib", type=float, default=0.0, help="cap GPU memory (both sides) at this")
    p.add_argument("--lora-rank", type=int, default=0, help="TRL with peft LoRA on q/k/v/o")
    p.add_argument("--model-dir", type=Path, help="use this saved model, not a new one")
    p.add_argument(
        "--shape-dir",
        type=Path,
        help="random weights of DIR/config.json instead of --shape (a CPU dry run: "
        "tests/fixtures/families/qwen3)",
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="GPUs: TRL under accelerate launch (--trl-mode), grpo_hpc under torchrun",
    )
    p.add_argument(
        "--trl-mode", choices=trl_multi.MODES, default="fsdp2", help="TRL's launch with --nproc > 1"
    )
    p.add_argument(
        "--trl-fallback",
        choices=trl_multi.MODES,
        help="with --nproc > 1: TRL's launch mode to try when --trl-mode's launch fails",
    )
    p.add_argument("--trl-worker", type=Path, help=argparse.SUPPRESS)  # one accelerate rank
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if args.trl_worker:  # one rank of bench/trl/multi.py's launch: its own result only
        rank = os.environ.get("RANK", "0")
        with tempfile.TemporaryDirectory() as d:
            result = run_trl(args, args.model_dir, Path(d))
        Path(f"{args.trl_worker}.rank{rank}").write_text(json.dumps(result))
        return
    variants: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        model = args.model_dir or work / "model"
        if args.shape_dir and not args.model_dir:
            save_random_config(model, args.shape_dir)
        elif not args.model_dir:
            build_model(model, args.shape)
        trl = None if args.skip_trl else trl_side(args, model, work)
        # written after each side, so that a call cut at its time limit keeps what ran
        write_result(summary(args, trl, variants), args.out)
        for spec in args.variants:
            name, _, flags = spec.partition("=")
            variants[name] = run_ours(args, work, name, flags.split(), model)
            variants[name] |= compare(variants[name], trl)
            print(render_row(name, variants[name]), flush=True)
            write_result(summary(args, trl, variants), args.out)
    if trl and "error" in trl:
        print(f"TRL      failed: {trl['error'].strip().splitlines()[-1:]}")
    elif trl:
        print(
            f"TRL      {trl['s_per_step_median']:.2f} s/step  peak {trl['peak_gib']:.1f} GiB"
            f"  {render_lengths(trl['lengths'])}"
        )


def render_lengths(lengths: dict | None) -> str:
    """``len 212 (9% at cap)``: a reader sees whether completions ended at real EOS."""
    if not lengths or lengths.get("mean_length") is None:
        return "len n/a"
    return f"len {lengths['mean_length']:.0f} ({lengths['cut_share']:.0%} at cap)"


def render_row(name: str, v: dict) -> str:
    if "error" in v:
        return f"{name:14s} failed: {v['error'].strip().splitlines()[-1:]}"
    m = v["median"]
    line = (
        f"{name:14s} {m['time/step']:.2f} s/step (gen {m['time/generate']:.2f} + train "
        f"{m['time/train']:.2f})  peak {m.get('gpu_mem_gb', float('nan')):.1f} GiB"
        f"  {render_lengths(v.get('lengths'))}"
    )
    if v.get("speedup_vs_trl"):
        line += f"  {v['speedup_vs_trl']:.1f}x TRL's speed"
    if v.get("memory_ratio_vs_trl"):
        line += f" at {v['memory_ratio_vs_trl']:.2f}x its memory"
    return line


if __name__ == "__main__":
    main()
