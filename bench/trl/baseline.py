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
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import (
    SHAPES,
    build_model,
    env_info,
    length_summary,
    save_random_config,
    shape_names,
    write_result,
)
from bench.trl import multi as trl_multi


def digit_fraction(completions: list, **kwargs: object) -> list[float]:
    """Cheap reward (the cost under test is generation and update, not scoring)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]


SEED = 0
"""Both sides' seed: TRL's, and grpo_hpc's ``training.seed``, which orders its prompts."""


def chat(system: str, question: str) -> list[dict[str, str]]:
    """One prompt as the messages grpo_hpc's ``data.prompt_text`` renders: TRL applies the
    same tokenizer's chat template to them, so both sides prefill the same tokens."""
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def same_prompts(n: int) -> list[list[dict[str, str]]]:
    """The messages grpo_hpc's trainer sends (system instruction + arithmetic question,
    from its own data module), so both sides prefill and train on the same lengths."""
    from grpo_hpc.config.schema import DataConfig
    from grpo_hpc.tasks.problems import ANSWER_INSTRUCTION, load_problems

    train, _ = load_problems(DataConfig(num_train=n, num_eval=0), seed=0)
    return [chat(ANSWER_INSTRUCTION, p["question"]) for p in train]


def gsm8k_prompts(num_train: int, count: int, seed: int) -> list[list[dict[str, str]]]:
    """``count`` GSM8K train questions in the order grpo_hpc's trainer draws them from its
    first ``num_train`` (its loader, its default system prompt, its seeded sampler), so
    TRL, reading them unshuffled, trains on the same questions step for step."""
    from grpo_hpc.config.schema import DataConfig
    from grpo_hpc.tasks.problems import Sampler, default_instruction, load_problems

    train, _ = load_problems(DataConfig(source="gsm8k", num_train=num_train, num_eval=0), seed)
    system = default_instruction(train)
    return [chat(system, train[i]["question"]) for i in Sampler(len(train), seed).take(count)]


def gsm8k_train_size(args: argparse.Namespace) -> int:
    """Questions grpo_hpc trains from: each one once over the run's steps."""
    return args.prompts * args.steps


def bench_prompts(args: argparse.Namespace) -> list[list[dict[str, str]]]:
    """TRL's dataset: one step's prompts more than the run takes (its loader must not run
    dry); with GSM8K the extra step wraps into the sampler's next epoch, as grpo_hpc would."""
    n = args.prompts * (args.steps + 1)
    if args.prompts_from == "gsm8k":
        return gsm8k_prompts(gsm8k_train_size(args), n, SEED)
    return same_prompts(n)


def trl_lengths(log_history: list[dict]) -> dict:
    """TRL's logged completion lengths (``logging_steps=1``: one entry per step)."""
    return length_summary(log_history, "completions/mean_length", "completions/clipped_ratio")


def real_tok_per_s(completions: int, lengths: dict, s_per_step: float) -> float | None:
    """Completion tokens actually generated per second of a step (the ``upper`` figure
    assumes every completion ran to the cap)."""
    mean = lengths.get("mean_length")
    return None if mean is None else completions * mean / s_per_step


def sync() -> None:
    """Waits for the GPU before a clock read; nothing to wait for on a CPU (plumbing
    checks), where the CUDA calls would fail."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_trl(args: argparse.Namespace, model_dir: Path, work: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.t0 = 0.0

        def on_step_begin(self, *a: object, **k: object) -> None:
            sync()
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: object, **k: object) -> None:
            sync()
            self.times.append(time.perf_counter() - self.t0)

    # Under accelerate launch (--nproc, bench/trl/multi.py) this is one rank of several
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if args.cap_gib:  # the budget's memory, as bench/memory/ladder.py caps grpo_hpc's ranks
        total = torch.cuda.get_device_properties(local).total_memory / 2**30
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib / total), local)
    cuda = torch.cuda.is_available()
    data = Dataset.from_dict({"prompt": bench_prompts(args)})
    completions = args.prompts * args.G
    if completions % (args.micro * world):
        raise SystemExit(f"{completions} completions do not split into {world} x {args.micro}")
    peft_config, init_kwargs = None, None
    if args.lora_rank:  # as grpo_hpc's LoRA: the frozen base in the compute dtype
        from peft import LoraConfig

        targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
        peft_config = LoraConfig(
            r=args.lora_rank, lora_alpha=2 * args.lora_rank, target_modules=targets
        )
        dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(args.precision)
        init_kwargs = {"dtype": dtype} if dtype else None
    config = GRPOConfig(
        output_dir=str(work / "trl"),
        per_device_train_batch_size=args.micro,
        gradient_accumulation_steps=completions // (args.micro * world),
        num_generations=args.G,
        max_completion_length=args.max_new,
        beta=args.beta,
        learning_rate=1e-6,
        bf16=args.precision == "bf16",
        fp16=args.precision == "fp16",  # autocast + grad scaler, as a V100 forces
        # under FSDP the accelerate config checkpoints the layers (bench/trl/multi.py)
        gradient_checkpointing=not fsdp,
        max_steps=args.steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        temperature=1.0,
        top_p=1.0,
        seed=SEED,
        # GSM8K: the dataset is already in grpo_hpc's order; arithmetic keeps TRL's default
        shuffle_dataset=args.prompts_from != "gsm8k",
        model_init_kwargs=init_kwargs,
    )
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=digit_fraction,
        args=config,
        train_dataset=data,
        callbacks=[timer],
        peft_config=peft_config,
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    lengths = trl_lengths(trainer.state.log_history)
    wrapping = how_wrapped(trainer.model_wrapped)
    # grpo_hpc's variants run next, in child processes on the same GPU: give TRL's memory
    # back to the driver, or this process's allocator keeps it reserved (54 GiB at 3B).
    del trainer
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    steps = timer.times[1:]
    tokens = completions * args.max_new
    return {
        "s_per_step_median": statistics.median(steps),
        "s_per_step_all": timer.times,
        "completion_tok_per_s_upper": tokens / statistics.median(steps),
        "completion_tok_per_s": real_tok_per_s(completions, lengths, statistics.median(steps)),
        "lengths": lengths,
        "peak_gib": peak,
        "wrapping": wrapping,
        "reserved_gib_after_release": torch.cuda.memory_reserved() / 2**30 if cuda else 0.0,
    }


def how_wrapped(model: object) -> dict:
    """What the Trainer trained: the wrapper's class (FSDP1's ``FullyShardedDataParallel``,
    DDP's ``DistributedDataParallel``) and how many weights are FSDP2's sharded DTensors, so
    a multi-GPU figure says what ran (bench/trl/multi.py checks it)."""
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())  # type: ignore[attr-defined]
    return {
        "class": type(model).__name__,
        "dtensor_params": sum(isinstance(p, DTensor) for p in params),
        "params": len(params),
    }


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


def trl_side(args: argparse.Namespace, model: Path, work: Path) -> dict:
    """TRL's run: one process, or ``accelerate launch`` on ``--nproc`` GPUs; with
    ``--trl-fallback``, a multi-GPU launch that fails is tried once more in that mode (the
    first error kept beside the result)."""
    if args.nproc == 1:
        return run_trl(args, model, work)
    trl = trl_multi.run(args, model, work)
    if "error" in trl and args.trl_fallback and args.trl_fallback != args.trl_mode:
        print(f"TRL {args.trl_mode} failed: {trl['error'].strip().splitlines()[-1:]}", flush=True)
        first = {"mode": trl["mode"], "error": trl["error"]}
        again = argparse.Namespace(**{**vars(args), "trl_mode": args.trl_fallback})
        trl = trl_multi.run(again, model, work)
        trl["first_try"] = first
    return trl


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
