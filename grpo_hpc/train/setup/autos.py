"""What each ``auto`` setting means in this training process (the thin I/O shell around
the pure decisions of :mod:`grpo_hpc.config.speed` and :mod:`grpo_hpc.memory.plan`): the
device's facts are read here, once, at setup, and the rest of the trainer sees only
resolved values."""

from __future__ import annotations

from dataclasses import replace

import torch

from grpo_hpc.config import speed as auto_speed
from grpo_hpc.config.schema import Config
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.memory import plan as memory_plan
from grpo_hpc.memory.estimate import estimate
from grpo_hpc.train.algo import packing
from grpo_hpc.train.distributed import gpu
from grpo_hpc.train.distributed.dist import DistInfo


def where_training(cfg: Config, device: torch.device) -> auto_speed.Where:
    """The facts of this process that ``dist.compile`` and ``algo.packing`` depend on (the
    capability an emulated GPU's under ``GRPO_HPC_EMULATE_GPU``: train.distributed.gpu)."""
    cuda = device.type == "cuda"
    return auto_speed.Where(
        cuda=cuda,
        capability=gpu.capability(device) if cuda else (0, 0),
        precision=cfg.dist.precision,
        lora=cfg.model.lora_rank > 0,
        varlen=packing.varlen_kernel() is not None,
        packable=auto_speed.packing_problem(memory_plan.read_config_json(cfg.model.name_or_path))
        is None,
    )


def device_gib(device: torch.device) -> float | None:
    """This rank's GPU memory in GiB (what ``algo.micro_batch_tokens=auto`` is decided
    against, an emulated GPU's under ``GRPO_HPC_EMULATE_GPU``); None on a CPU."""
    return gpu.total_gib(device) if device.type == "cuda" else None


def resolve(cfg: Config, info: DistInfo) -> Config:
    """``cfg`` with ``dist.compile``, ``algo.packing`` and ``algo.micro_batch_tokens``
    decided for this process; a precision the device cannot run is a ConfigError."""
    where = where_training(cfg, info.device)
    if why := auto_speed.precision_problem(where):
        raise ConfigError(why)
    return memory_plan.resolve_auto_tokens(
        auto_speed.resolve(cfg, where),
        device_gib(info.device),
        max(1, info.world_size // cfg.dist.nproc_per_node),
        where.capability if where.cuda else None,
    )


def cap_fits(cfg: Config, cap: int, info: DistInfo) -> bool:
    """Whether rollouts of ``cap`` new tokens fit this rank's GPU by the memory estimate
    (what a rollback that grows the cap asks: ``training.rollback_cap_growth``); True on
    a CPU, and where the model's shape is unknown here (no figure to refuse on)."""
    gib = device_gib(info.device)
    shape = memory_plan.model_shape(cfg.model)
    if gib is None or shape is None:
        return True
    grown = replace(cfg, rollout=replace(cfg.rollout, max_new_tokens=cap))
    nodes = max(1, info.world_size // cfg.dist.nproc_per_node)
    settings = memory_plan.settings_of(grown, nodes, gpu.capability(info.device))
    return estimate(shape, settings).total_gib <= gib


def kernels_line(
    precision: str,
    scaler: bool,
    attn: str | None,
    decode: str,
    capability: tuple[int, int] | None,
) -> str:
    """The training log's [Kernels] line (pure): the paths a step takes that [Speed] does not
    say, so that a run's log shows what a GPU of its capability ran (a V100's fp16 path, say)."""
    where = f" (compute capability {capability[0]}.{capability[1]})" if capability else ""
    scaled = " with the grad scaler" if scaler else ""
    return (
        f"[Kernels] dist.precision={precision}{scaled}; update attention {attn or 'unknown'}; "
        f"{decode}{where}"
    )
