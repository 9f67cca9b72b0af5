"""TRL on several GPUs as a TRL user runs it: ``accelerate launch`` with FSDP, one process
per GPU, each running ``bench.trl.baseline``'s TRL side (``--trl-worker``). Used by
``python -m bench.trl.baseline --nproc N``; grpo_hpc's side runs under torchrun through
``bench.speed.grpo_step --nproc N``.

What the launch sets, and why:

- ``fsdp2`` (default): accelerate's FSDP plugin, ``fsdp_version: 2`` (``fully_shard``),
  FULL_SHARD over the decoder layers (``TRANSFORMER_BASED_WRAP`` on the model's own layer
  class), parameters resharded after forward, bf16 mixed precision, activation
  checkpointing by the plugin. The gradient checkpointing of TRL's single-GPU runs moves
  into the plugin because transformers' Trainer advises against both at once under FSDP
  (the Trainer's flag adds an all-gather per layer in the backward). ``fsdp1``: the same
  with FSDP1 (``FullyShardedDataParallel``), the older setup many recipes still use.
- ``ddp``: accelerate's plain data parallel (``MULTI_GPU``, or ``MULTI_CPU`` on a CPU, the
  only mode that runs there: the plumbing check of ``tests/e2e/test_trl_multi_cpu.py``).

The global batch stays that of the one-GPU runs: ``prompts x G`` completions per optimizer
step over all ranks, ``--micro`` per rank per forward, so each rank accumulates
``prompts x G / (micro x N)`` micro-batches. Each rank writes its own result; the merge
takes rank 0's step times (every rank steps together) and the largest peak.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from pathlib import Path

import yaml

MODES = ("fsdp2", "fsdp1", "ddp")


def layer_class(model_dir: Path) -> str:
    """The decoder layer class FSDP wraps, from the model's ``architectures``
    (``LlamaForCausalLM`` -> ``LlamaDecoderLayer``)."""
    arch = json.loads((model_dir / "config.json").read_text())["architectures"][0]
    return arch.removesuffix("ForCausalLM") + "DecoderLayer"


def free_port() -> int:
    """A TCP port no process on this host listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_config(mode: str, nproc: int, precision: str, layer: str, cpu: bool) -> dict:
    """The ``accelerate launch --config_file`` contents for ``mode`` (pure)."""
    if mode not in MODES:
        raise ValueError(f"unknown TRL mode {mode!r}: one of {', '.join(MODES)}")
    mixed = precision if precision in ("bf16", "fp16") else "no"
    cfg: dict = {
        "compute_environment": "LOCAL_MACHINE",
        "num_machines": 1,
        "num_processes": nproc,
        "machine_rank": 0,
        "mixed_precision": mixed,
        "use_cpu": cpu,
        "rdzv_backend": "static",
        "same_network": True,
    }
    if mode == "ddp":
        # MULTI_GPU launches through torchrun on a CPU too (MULTI_CPU starts one process)
        return cfg | {"distributed_type": "MULTI_GPU"}
    fsdp = {
        "fsdp_version": 2 if mode == "fsdp2" else 1,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": layer,
        "fsdp_reshard_after_forward": True if mode == "fsdp2" else "FULL_SHARD",
        "fsdp_activation_checkpointing": True,
        "fsdp_offload_params": False,
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
    }
    if mode == "fsdp1":
        fsdp |= {"fsdp_use_orig_params": True, "fsdp_sync_module_states": True}
    return cfg | {"distributed_type": "FSDP", "fsdp_config": fsdp}


def worker_args(args: argparse.Namespace, model: Path, out: Path) -> list[str]:
    """``bench.trl.baseline``'s arguments for one TRL rank: the shape of the comparison,
    the saved model, and where the rank writes its result."""
    return [
        f"--shape={args.shape}",
        f"--prompts={args.prompts}",
        f"--G={args.G}",
        f"--max-new={args.max_new}",
        f"--prompts-from={args.prompts_from}",
        f"--micro={args.micro}",
        f"--steps={args.steps}",
        f"--beta={args.beta}",
        f"--precision={args.precision}",
        f"--cap-gib={args.cap_gib}",
        f"--lora-rank={args.lora_rank}",
        f"--model-dir={model}",
        f"--trl-worker={out}",
    ]


def merge(ranks: list[dict]) -> dict:
    """One TRL result from the ranks' own (pure): rank 0's times and lengths, the largest
    peak, every rank's peak kept."""
    if not ranks:
        raise ValueError("no TRL rank wrote a result")
    head = dict(ranks[0])
    head["peak_gib"] = max(r["peak_gib"] for r in ranks)
    head["peak_gib_per_rank"] = [r["peak_gib"] for r in ranks]
    return head


def not_distributed(mode: str, wrapping: dict) -> str | None:
    """Why TRL's model was not trained the way ``mode`` asks (pure): the Trainer decides the
    wrapping itself, and on a CPU it wraps nothing (each rank then trains alone)."""
    if mode == "fsdp2":
        ok = wrapping.get("dtensor_params", 0) > 0
    else:
        wrapper = "FullyShardedDataParallel" if mode == "fsdp1" else "DistributedDataParallel"
        ok = wrapping["class"] == wrapper
    return None if ok else f"TRL's model ran unsharded as {wrapping['class']}, not {mode}"


def run(args: argparse.Namespace, model: Path, work: Path) -> dict:
    """TRL's run on ``args.nproc`` processes; a failed launch is returned as its error."""
    import torch

    cpu = not torch.cuda.is_available()
    cfg = accelerate_config(args.trl_mode, args.nproc, args.precision, layer_class(model), cpu)
    # a port of its own: another run (torchrun --standalone) may share the host
    cfg["main_process_port"] = free_port()
    cfg_path, out = work / "accelerate.yaml", work / "trl-rank"
    cfg_path.write_text(yaml.safe_dump(cfg))
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", f"--config_file={cfg_path}",
        "-m", "bench.trl.baseline", *worker_args(args, model, out),
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.variant_timeout)
    except subprocess.TimeoutExpired:
        return {"mode": args.trl_mode, "error": f"timed out after {args.variant_timeout} s"}
    files = sorted(work.glob("trl-rank.rank*"), key=lambda f: int(f.suffix.removeprefix(".rank")))
    if proc.returncode != 0 or len(files) != args.nproc:
        return {"mode": args.trl_mode, "error": proc.stderr[-3000:], "accelerate": cfg}
    result = merge([json.loads(f.read_text()) for f in files])
    problem = not_distributed(args.trl_mode, result["wrapping"])
    if problem and not cpu:  # a GPU figure must be what it says; a CPU run checks plumbing
        result["error"] = problem
    return result | {"mode": args.trl_mode, "accelerate": cfg, "distributed_problem": problem}
