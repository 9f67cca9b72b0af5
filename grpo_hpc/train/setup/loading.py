"""The trainer's start-up (state LOADING) in functions of the config and this process: the
device check, the data splits, the model's directory and load dtype, the policy prepared
and wrapped beside its frozen reference and an asynchronous run's copy, the engine's
options. The trainer (:mod:`grpo_hpc.train.trainer`) calls them in order; the order is
part of the run's definition (the reference and the copy are taken before the policy is
wrapped, and nothing here draws a random number but the tiny model's build on rank 0)."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo_hpc.config.schema import Config
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.tasks import problems as data
from grpo_hpc.train.algo import logp_head, packing
from grpo_hpc.train.distributed import dist
from grpo_hpc.train.rollout import engines as rollout
from grpo_hpc.train.rollout.making import plain_copy
from grpo_hpc.train.setup import models

HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""The compute dtype of each low precision (fp32: none, no autocast)."""


def refuse_without_gpu(cfg: Config, device: torch.device) -> None:
    """A low precision asks for a GPU: on the CPU it would be refused later, less clearly."""
    if cfg.dist.precision in HALF and device.type != "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ConfigError(
            f"dist.precision={cfg.dist.precision} but this process sees no GPU "
            f"(CUDA_VISIBLE_DEVICES={visible!r}): give the profile gpus_per_node, or "
            "train on the CPU with precision fp32"
        )


def load_sets(cfg: Config) -> tuple[data.Splits, list[data.Problem]]:
    """The run's splits, and what its evaluation scores: the validation split, or the
    test split without one (which must then choose nothing: keep-best's metric is None)."""
    splits = data.load_splits(cfg.data, cfg.training.seed, cfg.training.eval_every > 0)
    return splits, splits.validation or splits.test


def model_directory(cfg: Config, run_dir: Path, info: dist.DistInfo) -> Path:
    """The policy's weights on disk, made once: rank 0 materializes them (the tiny model
    built, SmolLM2 converted) while the others wait, then each rank finds them on its own
    node (a node-local cache converts there)."""
    made = models.materialize(cfg.model, run_dir, cfg.training.seed) if info.is_main else None
    dist.barrier(info)
    return made or models.materialize(cfg.model, run_dir, cfg.training.seed)


def load_dtype(cfg: Config, device: torch.device) -> torch.dtype:
    """The dtype the policy is loaded in: fp32 master weights, but a LoRA policy's frozen
    base on a GPU needs no fp32 copy and stays in the compute dtype."""
    half = HALF.get(cfg.dist.precision)
    lora_base = cfg.model.lora_rank > 0 and device.type == "cuda" and half is not None
    return half if lora_base else torch.float32


@dataclass
class Policy:
    """The trainable policy and what is taken from it before it is wrapped."""

    model: torch.nn.Module
    """The policy, wrapped for DDP or FSDP2 (``dist.wrap``)."""
    ref: torch.nn.Module | None
    """The frozen reference (``algo.beta`` > 0), wrapped like the policy under FSDP2."""
    shadow: torch.nn.Module | None
    """The asynchronous thread placement's generating copy, a plain whole module."""
    attn: Any
    """The attention implementation transformers chose (for the kernels line)."""


def wrap_policy(
    model: torch.nn.Module, cfg: Config, info: dist.DistInfo, async_thread: bool
) -> Policy:
    """``model`` prepared (packing, LoRA, compile) and wrapped, the reference copied first
    and the asynchronous copy (``async_thread``) before the wrap: FSDP2 shards the module
    in place, and the copies must stay whole. For a moment that holds two full copies, 8
    bytes a parameter (docs/async.md: under the later peak with the native engine on up to
    8 ranks)."""
    if cfg.algo.packing:  # before the reference copy: both run packed forwards
        packing.use_packed_attention(model)
    attn = getattr(getattr(model, "config", None), "_attn_implementation", None)
    ref = copy.deepcopy(model).eval().requires_grad_(False) if cfg.algo.beta > 0 else None
    model = models.prepare_policy(model, cfg.model, info.device, bool(cfg.dist.compile))
    if cfg.dist.compile and info.device.type == "cuda":
        logp_head.compile_chunks()  # the fused head's softmax arithmetic, fused
    sharded = cfg.dist.strategy == "fsdp" and info.enabled  # dist.wrap's own condition
    shadow = plain_copy(model, share_frozen=not sharded) if async_thread else None
    wrapped = dist.wrap(model, cfg.dist, info)
    if ref is not None and cfg.dist.strategy == "fsdp":
        ref = dist.wrap(ref, cfg.dist, info)
    return Policy(wrapped, ref, shadow, attn)


def engine_options(
    cfg: Config, info: dist.DistInfo, tok: Any, problems: list[data.Problem]
) -> rollout.EngineOptions:
    """The rollout engine's options: the compute dtype, ranks kept in step under FSDP2,
    the longest prompt of ``problems`` (training and held-out) in tokens."""
    dtype = HALF.get(cfg.dist.precision) if info.device.type == "cuda" else None
    return rollout.EngineOptions.for_run(
        cfg,
        dtype or torch.float32,
        synced=info.enabled and cfg.dist.strategy == "fsdp",
        max_prompt_tokens=data.longest_prompt_tokens(tok, problems, cfg.data.system_prompt),
    )
