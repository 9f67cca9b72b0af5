"""torch.distributed plumbing: process group, model wrapping, agreement between ranks.

Every decision that ends a step (stop on a signal, circuit breaker, stall) is
agreed through one all-reduce, so no rank is ever left waiting in a collective
that the others have abandoned.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from grpo_hpc.config.schema import DistConfig


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    group: Any = None
    """The process group of these ranks (None: every rank of the job). A split run's
    trainers (``rollout.placement=split``) agree, reduce and wrap DDP in a group of their
    own: its generators never join their collectives."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init(cfg: DistConfig, timeout_s: float = 1800) -> DistInfo:
    """Join the process group torchrun set up (or run single-process without it)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(_backend(cfg, cuda), timeout=timedelta(seconds=timeout_s))
    return DistInfo(rank, world, local, device)


def choose_kernels_by_rule(device: torch.device, deterministic: bool) -> None:
    """``dist.deterministic_kernels``: Inductor's deterministic mode for this process's
    compilations on a GPU (nothing compiles on the CPU: Inductor is not imported there)."""
    if device.type == "cuda":
        import torch._inductor.config as inductor_config

        inductor_config.deterministic = deterministic


def _backend(cfg: DistConfig, cuda: bool) -> str:
    """NCCL on GPUs, gloo on CPUs; with FSDP2 CPU offload both: the sharded gradients live in
    host memory, and gradient clipping reduces their norms there (NCCL alone fails with "no
    backend type associated with device type cpu")."""
    if cfg.backend != "auto":
        return cfg.backend
    if not cuda:
        return "gloo"
    return "cpu:gloo,cuda:nccl" if cfg.cpu_offload else "nccl"


def launch_token(info: DistInfo) -> str:
    """A name all ranks of this launch share and no earlier launch had (rank 0's, broadcast):
    a requeued Slurm job keeps its job id, so the id cannot tell two launches apart."""
    token = [f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}" if info.is_main else ""]
    if info.enabled:
        dist.broadcast_object_list(token, src=0, group=info.group)
    return token[0]


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def max_over_ranks(values: list[float], info: DistInfo) -> list[float]:
    """Each of ``values``' largest over the ranks (one all-reduce)."""
    if not info.enabled:
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device(info))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=info.group)
    return t.tolist()


def all_reduce_max(value: float, info: DistInfo) -> float:
    """``value``'s largest over the ranks."""
    return max_over_ranks([value], info)[0]


def spread(value: float, info: DistInfo) -> float:
    """Largest minus smallest ``value`` over the ranks (one all-reduce of two numbers)."""
    if not info.enabled:
        return 0.0
    t = torch.tensor([value, -value], dtype=torch.float64, device=_comm_device(info))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=info.group)
    return float(t[0] + t[1])


def all_reduce_sum(values: list[float], info: DistInfo) -> list[float]:
    if not info.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device(info))
    dist.all_reduce(t, group=info.group)
    return t.tolist()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier(group=info.group)


def dump_flight_recorder(folder: Path, rank: int) -> Path | None:
    """Write PyTorch's flight recorder (the last collectives this rank issued, with their
    state and stacks) to ``folder/rank_<R>``, as ``TORCH_NCCL_DUMP_ON_TIMEOUT`` would on a
    timeout; None when this torch has none (read it with ``torchfrtrace`` or
    ``python -m torch.distributed.flight_recorder.fr_trace``). Called when a peer stops
    answering, before the process group's own timeout could dump it."""
    import torch._C._distributed_c10d as c10d

    # NCCL's collectives are in NCCL's own recorder (_dump_nccl_trace); the generic one
    # (_dump_fr_trace, gloo's) is empty under NCCL: on 2x H100 it held 0 entries
    names = ["_dump_fr_trace"]
    if dist.is_initialized() and "nccl" in str(dist.get_backend()):
        names.insert(0, "_dump_nccl_trace")
    dump = next((getattr(c10d, n) for n in names if hasattr(c10d, n)), None)
    if dump is None:
        return None
    try:
        data = dump()
        folder.mkdir(parents=True, exist_ok=True)
        tmp, path = folder / f".rank_{rank}.tmp", folder / f"rank_{rank}"
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except (OSError, RuntimeError):  # no recorder in this build, or nowhere to write
        return None
    return path


def _comm_device(info: DistInfo) -> torch.device:
    return info.device if "nccl" in str(dist.get_backend()) else torch.device("cpu")


def wrap(model: torch.nn.Module, cfg: DistConfig, info: DistInfo) -> torch.nn.Module:
    """DDP or FSDP2 (``fully_shard`` per decoder layer, then the root)."""
    if not info.enabled:
        return model
    if cfg.strategy == "fsdp":
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        kwargs: dict = {}
        cuda = info.device.type == "cuda"
        if cfg.precision in ("bf16", "fp16") and cuda:
            dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float16
            kwargs["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=dtype, reduce_dtype=torch.float32
            )
        if cfg.cpu_offload:  # sharded weights, gradients and AdamW state in host memory
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=cuda)
        if info.group is not None:  # a split run's trainers: shard over them alone
            from torch.distributed.device_mesh import DeviceMesh

            kwargs["mesh"] = DeviceMesh.from_group(info.group, info.device.type)
        for layer in _decoder_layers(model):
            # the layers only: the root (embedding, head) keeps FSDP2's default, which the
            # fused log-prob head's backward relies on (it re-gathers the head's weight)
            fully_shard(layer, reshard_after_forward=cfg.reshard_after_forward, **kwargs)
        # PeftModel.generate calls the HF model's generate, which never enters the
        # PeftModel's forward: under peft the HF model inside is FSDP's root, so that both
        # paths unshard the embedding and the head (fsdp_root finds it).
        fully_shard(_peft_inner(model) or model, **kwargs)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    plain_reducer_for_compiled_layers()
    ids = [info.device.index] if info.device.type == "cuda" else None
    return DDP(model, device_ids=ids, process_group=info.group)


def reshard(model: torch.nn.Module) -> None:
    """Every FSDP2 module of ``model`` back to its sharded parameters (a no-op for DDP or
    one process): what ``model.parameters()`` then yields are the optimizer's DTensors."""
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def plain_reducer_for_compiled_layers() -> None:
    """Compile each decoder layer under DDP without Dynamo's DDPOptimizer.

    Dynamo splits a graph compiled inside a DDP module at DDP's bucket boundaries so that a
    bucket's all-reduce can start mid-backward, and compiles each piece by running it once
    on fake tensors. In a real 2-GPU GSM8K run (torch 2.11, layers compiled with dynamic
    shapes, micro-batches of up to 18,432 packed tokens) a recompilation at step 12 died in
    that fake run: Inductor's input-alignment check read a fake tensor's data pointer
    (``BackendCompilerFailed ... Cannot access data pointer of Tensor``;
    ``bench/results/archive/slurm_gsm8k_attention_plans_h100x2_2026-11-27.md``). Our compiled
    regions are single decoder
    layers, so the split buys little: DDP's own reducer still starts each bucket's
    all-reduce as the layers' backwards hand it their gradients, one layer at a time."""
    import torch._dynamo

    torch._dynamo.config.optimize_ddp = False


def compute_device(model: torch.nn.Module) -> torch.device:
    """Where ``model`` computes: its parameters' device, except under FSDP2 CPU offload,
    which keeps the sharded parameters in host memory and unshards them onto the mesh's
    device (this rank's GPU) for every forward; inputs and engines belong there."""
    p = next(model.parameters())
    mesh = getattr(p, "device_mesh", None)
    if mesh is None or mesh.device_type == p.device.type:
        return p.device
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(mesh.device_type)


def fsdp_root(model: torch.nn.Module) -> torch.nn.Module | None:
    """The outermost FSDP2 module of ``model`` (the model itself, or under peft the HF model
    inside); None without FSDP2."""
    return next((m for m in model.modules() if hasattr(m, "set_requires_gradient_sync")), None)


def _peft_inner(model: torch.nn.Module) -> torch.nn.Module | None:
    """The HF model inside a peft wrapper (PeftModel -> LoraModel -> model), else None."""
    base = getattr(model, "base_model", None)
    inner = getattr(base, "model", None) if base is not model else None
    return inner if isinstance(inner, torch.nn.Module) and hasattr(model, "peft_config") else None


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None and hasattr(inner, "base_model"):  # peft wrapper
        return _decoder_layers(inner.base_model)
    return list(layers) if layers is not None else []


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The HF model inside a DDP wrapper (FSDP2 keeps the module itself)."""
    return getattr(model, "module", model)
