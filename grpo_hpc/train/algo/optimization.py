"""The optimizer side of a step: AdamW with linear warmup, the fp16 grad scaler, the update
epochs over a step's micro-batches, gradient clipping and the non-finite-gradient breaker."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from grpo_hpc.config.schema import Config
from grpo_hpc.core.errors import CircuitBreakerError, ConfigError
from grpo_hpc.train.algo import update
from grpo_hpc.train.algo.logp_head import Scoring
from grpo_hpc.train.distributed import dist


def autocast_factory(
    device_type: str, dtype: torch.dtype | None, cache: bool = True
) -> Callable[[], contextlib.AbstractContextManager]:
    """Contexts of low-precision compute over fp32 master weights (``dtype`` None: none).

    ``cache=False`` is for the update. autocast caches the low-precision cast of each weight
    until its outermost context exits, and the update's backward runs inside it: with
    gradient checkpointing the cache is a second copy of the model in bf16/fp16 (2 bytes a
    parameter: 2.9 GiB at 1.5B) held through the forward and the backward for nothing, since
    a checkpointed layer casts again in its recompute and a layer that is not checkpointed
    saves its cast for backward anyway. Casting is exact, so gradients are equal bit for
    bit (``tests/unit/train/algo/test_update_autocast.py``). Compiled layers cast inside their graph
    and never filled the cache: what it frees is in eager runs (a V100, ``dist.compile=false``)."""
    if dtype is None:
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type, dtype=dtype, cache_enabled=cache)


def _fused(info: dist.DistInfo, cfg: Config) -> bool:
    """Fused AdamW wherever the parameters live on the GPU, FSDP2's sharded DTensors
    included. It updates each tensor in place in one kernel. The alternative torch picks by
    default on CUDA, foreach, computes ``sqrt(exp_avg_sq)`` for every parameter at once
    into a temporary the size of a whole fp32 state, 14 GiB per rank for a 7B model on two
    GPUs, allocated at the first optimizer step, after the gradients and both moments are
    resident. With FSDP2 CPU offload the step runs on the CPU (torch's default there)."""
    on_gpu = info.device.type == "cuda"
    return on_gpu and not (cfg.dist.strategy == "fsdp" and cfg.dist.cpu_offload)


def uneven_shards(shapes: dict[str, tuple[int, ...]], ranks: int) -> list[str]:
    """The parameters whose first dimension does not split evenly over ``ranks`` (pure).
    FSDP2 shards dim 0 and gives the last ranks fewer rows; torchao's compiled 8-bit step
    assumes every rank's shard is the same size and fails on such a parameter."""
    return [n for n, s in shapes.items() if ranks > 1 and s and s[0] % ranks]


def adamw(
    named: list[tuple[str, torch.nn.Parameter]], cfg: Config, info: dist.DistInfo
) -> torch.optim.Optimizer:
    """AdamW with the moments ``optim.state`` asks for: torch's (fp32, fused where
    :func:`_fused` says) or torchao's ``AdamW8bit`` (int8 moments; torchao steps each
    parameter in one compiled function, FSDP2's DTensors included, if evenly sharded)."""
    o = cfg.optim
    params = [p for _, p in named]
    if o.state == "int8":
        sharded = cfg.dist.strategy == "fsdp" and info.world_size > 1
        shapes = {n: tuple(p.shape) for n, p in named}  # a DTensor's shape is the global one
        uneven = uneven_shards(shapes, info.world_size)
        if sharded and uneven:
            raise ConfigError(
                f"optim.state=int8 under FSDP2 needs every weight's first dimension divisible "
                f"by the {info.world_size} ranks (torchao's 8-bit step takes even shards): "
                f"{uneven[0]} has {shapes[uneven[0]][0]} rows; use optim.state=fp32, "
                "dist.strategy=ddp or another rank count"
            )
        try:
            from torchao.optim import AdamW8bit
        except ImportError as e:
            raise ConfigError(
                f"optim.state=int8 needs torchao where the job runs ({e}): pip install "
                "'grpo-hpc[lowmem]', or set optim.state=fp32"
            ) from None
        return AdamW8bit(params, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
    return torch.optim.AdamW(
        params, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay, fused=_fused(info, cfg)
    )


def skips_empty_steps(cfg: Config) -> bool:
    """``optim.skip_empty_steps`` in force (pure): as set, or unset on in an asynchronous
    run (``algo.max_staleness`` >= 1) and off in a synchronous one. Asynchronous only,
    because that is where the learning benchmark measured a gain (docs/async.md), while a
    synchronous run keeps TRL's AdamW step on a zero gradient, which its parity tests pin."""
    if cfg.optim.skip_empty_steps is not None:
        return bool(cfg.optim.skip_empty_steps)
    return cfg.algo.max_staleness >= 1


class StepOptimizer:
    """AdamW over the trainable parameters of ``model``, its warmup schedule and, for fp16
    on CUDA, a gradient scaler; :meth:`update` trains on one step's micro-batches."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: Config,
        info: dist.DistInfo,
        autocast: Callable[[], contextlib.AbstractContextManager],
    ) -> None:
        self.model, self.cfg, self.info, self.autocast = model, cfg, info, autocast
        trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.optim = adamw(trained, cfg, info)
        warm = max(cfg.optim.warmup_steps, 0)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.optim, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0
        )
        gpu = info.device.type == "cuda"
        self.scaler = torch.amp.GradScaler("cuda") if gpu and cfg.dist.precision == "fp16" else None

    def update(
        self,
        mbs: list[update.MicroBatch],
        ref: torch.nn.Module | None,
        step: int,
        on_nonfinite: Callable[[], None],
    ) -> dict[str, float]:
        """``algo.updates_per_batch`` optimizer steps on ``mbs``; ``on_nonfinite`` (the
        trainer's save) runs before the circuit breaker trips on a non-finite gradient."""
        cfg = self.cfg
        mbs = update.pad_microbatches(mbs, self.info)
        self.model.train()
        # one host sync for all micro-batches (their advantages are on the device)
        most = [mb.advantages.abs().max() for mb in mbs if mb.advantages.numel()]
        flat = not most or float(torch.stack(most).max()) == 0.0
        if cfg.algo.beta == 0 and dist.all_reduce_max(0.0 if flat else 1.0, self.info) == 0:
            # Every group on every rank is flat: the loss and its gradient are exactly 0.
            # Skip the forward/backward (most of a CPU step) but still take the optimizer
            # step on zero gradients, so AdamW's state evolves exactly as if computed
            # (unless optim.skip_empty_steps: then optimizer_step takes none).
            zero = {
                "loss": 0.0,
                "kl": 0.0,
                "clip_frac": 0.0,
                "clip_frac_low": 0.0,
                "clip_frac_high": 0.0,
                "entropy": float("nan"),
            }
            # FSDP2's root keeps its parameters unsharded after a forward (the rollout's):
            # back to its sharded ones, which the optimizer holds, before giving them
            # gradients (zeros of the unsharded ones met DTensors in the clip)
            dist.reshard(self.model)
            for _ in range(cfg.algo.updates_per_batch):
                for p in self.model.parameters():
                    if p.requires_grad:
                        p.grad = torch.zeros_like(p)
                zero["grad_norm"] = self.optimizer_step(step, on_nonfinite)
            return zero
        scoring = Scoring(cfg.logp_temperature, cfg.algo.fp32_lm_head)
        if cfg.algo.updates_per_batch > 1:
            update.fill_fixed_logp(self.model, mbs, "old_logp", self.autocast, scoring)
        if ref is not None:
            update.fill_fixed_logp(ref, mbs, "ref_logp", self.autocast, scoring)
        stats: dict[str, float] = {}
        for _ in range(cfg.algo.updates_per_batch):
            stats = update.accumulate(
                self.model,
                mbs,
                cfg.algo,
                self.info,
                cfg.rollout.max_new_tokens,
                self.scaler,
                self.autocast,
                scoring,
            )
            stats["grad_norm"] = self.optimizer_step(step, on_nonfinite)
        return stats

    def optimizer_step(self, step: int, on_nonfinite: Callable[[], None]) -> float:
        """Unscale, clip, step; the gradient norm. A non-finite norm drops the gradients,
        calls ``on_nonfinite`` (weights are still the last finite ones) and trips the breaker.
        A zero norm takes no AdamW step where :func:`skips_empty_steps` (every rank sees the
        same norm: DDP's gradients are reduced, FSDP2's norm is the whole model's)."""
        if self.scaler:
            self.scaler.unscale_(self.optim)
        params = [p for p in self.model.parameters() if p.requires_grad]
        clip = self.cfg.optim.grad_clip or float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        if not torch.isfinite(torch.tensor(norm)):
            self.optim.zero_grad(set_to_none=True)
            on_nonfinite()
            raise CircuitBreakerError(
                f"non-finite gradient norm at step {step}: lower optim.lr or check precision"
            )
        if norm == 0.0 and skips_empty_steps(self.cfg):
            if self.scaler:
                self.scaler.update()  # closes the unscale_ above; the scale stays
        elif self.scaler:
            self.scaler.step(self.optim)
            self.scaler.update()
        else:
            self.optim.step()
        self.sched.step()
        self.optim.zero_grad(set_to_none=True)
        return norm
