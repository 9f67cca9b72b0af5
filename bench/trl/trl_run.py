"""TRL's side of bench/trl/baseline.py: ``GRPOTrainer`` in this process (one GPU, or one
rank under ``accelerate launch``), or on several GPUs through bench/trl/multi.py, timed step
by step, with its completion lengths, peak memory and how the model was wrapped."""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from pathlib import Path

from bench.common import length_summary
from bench.trl import multi as trl_multi
from bench.trl.prompts import SEED, bench_prompts, digit_fraction


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
