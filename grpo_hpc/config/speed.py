"""What ``auto`` means for the two speed switches of the update, ``dist.compile`` (each
decoder layer compiled) and ``algo.packing`` (a micro-batch's rows as one sequence). Pure.

Both change no math (their gradients equal the plain path's in fp32:
tests/e2e/test_ddp_compile.py, tests/unit/train/algo/test_packing.py), so ``auto`` turns
each on exactly where it was measured to pay, and leaves it off where it was not measured
or cannot pay:

- on a CUDA GPU of compute capability 8.0 or newer (A100, H100; Triton's fused kernels and
  the varlen flash kernel need it), full parameters, one GPU, DDP or FSDP2. On one H100
  (bench/results/LOG.md, where a step's time goes) compile + packing made the default
  step 1.32x (0.5B), 1.30x (1.5B), 1.23x (3B) and 1.32x (SmolLM2 at real GSM8K lengths)
  faster, and lowered its peak memory in every case. Under FSDP2 on 2x H100
  (bench/results/fsdp2_vs_ddp_h100x4_2026-11-26.md) they made the step 1.55x (0.5B) and 1.61x (1.5B)
  faster than FSDP2's eager layers and lowered the peak (24.2 against 32.4 GiB at 0.5B);
  the 7B FSDP2 plan took 11.6 s/step compiled against 14.3 s eager, at the same peak
  (bench/results/archive/trl_ladder_7b_h100x4_2026-11-26.md);
- packing also needs half precision (the varlen kernel takes bf16/fp16 only; elsewhere a
  packed forward runs attention row by row, which is slower than padding);
- off with LoRA: not measured compiled or packed on a GPU;
- off on a CPU (compilation costs more than it saves on small CPU runs; no varlen kernel).

``true`` and ``false`` are taken as given.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from grpo_hpc.config.schema import Config

AUTO = "auto"


@dataclass(frozen=True)
class Where:
    """The facts ``auto`` is decided from."""

    cuda: bool
    """Training on a CUDA device."""
    capability: tuple[int, int]
    """The device's compute capability; (0, 0) off CUDA."""
    precision: str
    """dist.precision: fp32, bf16 or fp16."""
    lora: bool
    """A LoRA policy (model.lora_rank > 0)."""
    varlen: bool
    """PyTorch's varlen flash attention is importable (grpo_hpc.train.algo.packing)."""
    packable: bool = True
    """The model's attention can run packed (:func:`packing_problem` found nothing)."""


def _measured(where: Where) -> bool:
    """Where compile and packing were measured to pay: see the module docstring."""
    return where.cuda and where.capability >= (8, 0) and not where.lora


def compile_on(setting: bool | str, where: Where) -> bool:
    """``dist.compile`` resolved."""
    return _measured(where) if setting == AUTO else bool(setting)


def packing_on(setting: bool | str, where: Where) -> bool:
    """``algo.packing`` resolved."""
    if setting != AUTO:
        return bool(setting)
    fast = _measured(where) and where.precision in ("bf16", "fp16") and where.varlen
    return fast and where.packable


def packing_problem(model_config: dict | None) -> str | None:
    """What of a model's ``config.json`` the packed attention cannot honour (one phrase), or
    None: attention logit soft-capping (Gemma 2), which neither the varlen kernel nor SDPA
    computes. ``auto`` then leaves packing off; an explicit ``true`` is refused by the packed
    attention itself at the first forward (grpo_hpc.train.algo.packing)."""
    if model_config and model_config.get("attn_logit_softcapping"):
        return "attention logit soft-capping"
    return None


def precision_problem(where: Where) -> str | None:
    """One line when ``dist.precision`` cannot run here, else None (see
    :func:`gpu_precision_problem`; nothing to refuse off CUDA)."""
    return gpu_precision_problem(where.precision, where.capability) if where.cuda else None


def gpu_precision_problem(precision: str, capability: tuple[int, int]) -> str | None:
    """bf16 needs a GPU of compute capability 8.0+ (a V100 has no bf16 arithmetic; a
    command-line override can ask for it on a profile whose GPUs lack it). The trainer asks
    with its device, grpo-submit with the profile's ``gpu_capability``."""
    if precision == "bf16" and capability < (8, 0):
        major, minor = capability
        return (
            f"dist.precision=bf16 but the GPU (compute capability {major}.{minor}) has no bf16 "
            "arithmetic: use dist.precision=fp16 (what the supercloud profile's V100s run) or fp32"
        )
    return None


def resolve(cfg: Config, where: Where) -> Config:
    """``cfg`` with both switches true or false (a copy; ``cfg`` is left as it is)."""
    return dataclasses.replace(
        cfg,
        dist=dataclasses.replace(cfg.dist, compile=compile_on(cfg.dist.compile, where)),
        algo=dataclasses.replace(cfg.algo, packing=packing_on(cfg.algo.packing, where)),
    )


def where_submitted(cfg: Config, capability: tuple[int, int] | None = None) -> Where:
    """The facts as a submission knows them, with no GPU at hand (the memory estimate,
    :mod:`grpo_hpc.memory.plan`). ``capability``: the profile's ``gpu_capability``. Where
    the profile does not say, the precision tells what it can: bf16 needs compute
    capability 8.0+ (a V100 has none), so a bf16 run is taken to have it; an fp16 or fp32
    run is not (there the estimate assumes eager layers, which keep more for backward: the
    safe side)."""
    bf16 = cfg.dist.precision == "bf16"
    if capability is None:
        capability = (8, 0) if bf16 else (0, 0)
    return Where(
        cuda=True,
        capability=capability,
        precision=cfg.dist.precision,
        lora=cfg.model.lora_rank > 0,
        varlen=bf16,
    )


def describe(before: Config, after: Config) -> str:
    """One line for the training log: each switch's resolved value, and where it was auto."""
    parts = []
    for name, old, new in (
        ("dist.compile", before.dist.compile, after.dist.compile),
        ("algo.packing", before.algo.packing, after.algo.packing),
    ):
        parts.append(f"{name}={str(new).lower()}" + (" (auto)" if old == AUTO else ""))
    if before.algo.micro_batch_tokens == AUTO:
        parts.append(f"algo.micro_batch_tokens={after.algo.micro_batch_tokens} (auto)")
    parts.append(f"dist.deterministic_kernels={str(after.dist.deterministic_kernels).lower()}")
    return "[Speed] " + ", ".join(parts)
