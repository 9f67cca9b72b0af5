"""The instruments hooked into the trainer from outside (:func:`install`), and what torchrun
runs on each rank (:func:`child`): the trainer under a :class:`~.probe.Probe`."""

from __future__ import annotations

import contextlib
import functools
import os
import time
from pathlib import Path
from typing import Any

from bench.memory.probe_core import GIB, Probe
from bench.memory.probe_history import summarize_history
from bench.memory.probe_profiler import _start_profiler, _stop_profiler


def install(probe: Probe) -> None:
    """Hook the instruments into the trainer's classes and modules (before it runs)."""
    import torch

    from grpo_hpc.train import trainer
    from grpo_hpc.train.algo import optimization, update
    from grpo_hpc.train.distributed import dist
    from grpo_hpc.train.rollout import collect
    from grpo_hpc.train.rollout.native import weights

    if os.environ.get("PROBE_RESHARD_AFTER_FORWARD") == "0":
        import torch.distributed.fsdp as fsdp_mod

        fsdp_mod.fully_shard = functools.partial(fsdp_mod.fully_shard, reshard_after_forward=False)

    if os.environ.get("PROBE_FSDP_SYNC_EACH") == "1":
        plain = update._no_sync

        def no_sync(model: Any, last: bool) -> Any:
            if dist.fsdp_root(model) is not None:
                return contextlib.nullcontext()  # reduce-scatter after every micro-batch
            return plain(model, last)

        update._no_sync = no_sync

    setup = trainer.Trainer.setup

    def setup_probe(self: Any) -> None:
        probe.trainer = self
        setup(self)
        probe.record("after_setup", **probe.sizes())
        probe.write()

    trainer.Trainer.setup = setup_probe

    train_step = trainer.Trainer.train_step

    def train_step_probe(self: Any) -> None:
        probe.step += 1
        probe.mb = -1
        probe.cur = {"step": probe.step, "refill_s": 0.0}
        t0 = time.monotonic()
        profiling = probe.profile_step == probe.step and probe.rank == 0 and probe.cuda
        try:
            train_step(self)
        finally:
            probe.cur["step_s"] = round(time.monotonic() - t0, 3)
            probe.cur["profiled"] = profiling
            probe.steps.append(probe.cur)
            probe.write()

    trainer.Trainer.train_step = train_step_probe

    collect_fn = collect.Collector.collect

    def collect_probe(self: Any) -> Any:
        probe.record("before_rollout")
        got = collect_fn(self)
        probe.cur["generate_s"] = round(got.generate_s, 3)
        probe.record("after_rollout")
        return got

    collect.Collector.collect = collect_probe

    refill = weights.refill

    def refill_probe(packed: Any, model: Any) -> None:
        probe.sync()
        probe.record("before_weight_gather")
        t = time.monotonic()
        refill(packed, model)
        probe.sync()
        probe.cur["refill_s"] = round(probe.cur.get("refill_s", 0.0) + time.monotonic() - t, 4)
        probe.record("after_weight_gather")

    weights.refill = refill_probe

    release_cls = None
    with contextlib.suppress(ImportError):
        from grpo_hpc.train.rollout.native.engine import NativeEngine as release_cls  # noqa: N813
    if release_cls is not None:
        release = release_cls.release

        def release_probe(self: Any) -> None:
            release(self)
            probe.record("after_engine_release")

        release_cls.release = release_probe

    opt_update = optimization.StepOptimizer.update

    def update_probe(self: Any, *a: Any, **k: Any) -> Any:
        probe.record("update_start", **probe.sizes())
        hist = probe.history_step == probe.step and probe.cuda  # every rank: one may OOM first
        prof = probe.profile_step == probe.step and probe.rank == 0 and probe.cuda
        base = torch.cuda.memory_allocated() if hist else 0
        if hist:
            torch.cuda.memory._record_memory_history(
                enabled="all", context="alloc", stacks="python", max_entries=2_000_000
            )
        profiler = _start_profiler() if prof else None
        probe.t_update = time.monotonic()
        oom = None
        try:
            return opt_update(self, *a, **k)
        except torch.cuda.OutOfMemoryError as e:
            oom = str(e).splitlines()[0][:400]
            probe.record("out_of_memory", error=oom)
            raise
        finally:
            probe.cur["update_s"] = round(time.monotonic() - probe.t_update, 3)
            probe.mb = -1
            if profiler is not None:
                probe.profile = _stop_profiler(profiler)
            if hist:
                snap = torch.cuda.memory._snapshot()
                torch.cuda.memory._record_memory_history(enabled=None)
                probe.history = summarize_history(snap, base, torch.cuda.current_device())
                probe.history["oom_error"] = oom
            probe.write()

    optimization.StepOptimizer.update = update_probe

    logp = update.completion_logp

    def completion_logp_probe(*a: Any, **k: Any) -> Any:
        if not torch.is_grad_enabled():
            return logp(*a, **k)
        probe.mb += 1
        probe.record("mb_before_forward")
        out = logp(*a, **k)
        probe.record("mb_after_forward")  # alloc: what the forward keeps for backward
        return out

    update.completion_logp = completion_logp_probe

    backward = torch.Tensor.backward

    def backward_probe(self: Any, *a: Any, **k: Any) -> Any:
        if probe.mb < 0:
            return backward(self, *a, **k)
        probe.record("mb_before_backward")
        out = backward(self, *a, **k)
        probe.record("mb_after_backward", **probe.sizes())  # peak: inside the backward
        return out

    torch.Tensor.backward = backward_probe

    opt_step = optimization.StepOptimizer.optimizer_step

    def optimizer_step_probe(self: Any, step: int, on_nonfinite: Any) -> float:
        probe.mb = -1
        probe.sync()
        probe.record("before_optimizer_step", **probe.sizes())
        t = time.monotonic()
        zero_grad = self.optim.zero_grad

        def zero_grad_probe(*za: Any, **zk: Any) -> None:
            probe.sync()
            probe.record("after_optimizer_step", **probe.sizes())
            zero_grad(*za, **zk)

        self.optim.zero_grad = zero_grad_probe
        try:
            norm = opt_step(self, step, on_nonfinite)
        finally:
            del self.optim.zero_grad  # the bound method again
        probe.sync()
        probe.cur["optimizer_step_s"] = round(time.monotonic() - t, 4)
        probe.cur["backward_s"] = round(t - probe.t_update, 3)  # forwards + backwards
        probe.record("after_zero_grad")
        return norm

    optimization.StepOptimizer.optimizer_step = optimizer_step_probe


# ----------------------------------------------------------------- the torchrun child


def child(run_dir: str, cap_gib: float) -> int:
    import torch

    if cap_gib and torch.cuda.is_available():
        device = int(os.environ.get("LOCAL_RANK", "0"))
        total = torch.cuda.get_device_properties(device).total_memory / GIB
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib / total), device)
    out = Path(os.environ.get("PROBE_OUT") or Path(run_dir) / "probe")
    probe = Probe(out)
    install(probe)
    from grpo_hpc.train.__main__ import main as train_main

    code = train_main([run_dir])
    probe.write()
    return code
