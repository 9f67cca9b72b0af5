"""Test-only fault injection (``faults.*``, rejected unless ``faults.enabled``): what the
trainer does to itself so that the fault campaigns (bench/faults/run.py, bench/faults/gpu_run.py)
and the tests can strike a real run at a chosen step. Nothing here runs in a normal run."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from grpo_hpc.config.schema import FaultsConfig
from grpo_hpc.core.progress import TrainState
from grpo_hpc.train.distributed import gpu
from grpo_hpc.train.measure.tracking import Tracker
from grpo_hpc.train.rollout.engines import GenerationAborted


def before_step(f: FaultsConfig, step: int, tracker: Tracker, stopped: Callable[[], bool]) -> None:
    """At the start of a step: crash, sleep, or hang in generation as configured."""
    if not f.enabled:
        return
    if f.crash_at_step == step:
        raise RuntimeError(f"fault injection: crash at step {step}")
    if f.step_sleep:
        time.sleep(f.step_sleep)
    if f.hang_at_step == step and tracker.record.attempt == 0:
        # Simulates generation futures that never resolve: the process is alive and
        # heartbeats, but the step never advances (the 22-hours-at-step-0 failure).
        tracker.update(TrainState.GENERATING)
        while not stopped():
            time.sleep(1)
            tracker.heartbeat()
        raise GenerationAborted()


def stuck_generation(f: FaultsConfig, step: int) -> None:
    """``faults.stuck_generation_at_step``: the generation ahead of this step's batch never
    returns, and advances no progress counter, while its process's other threads run on
    (a hung kernel or collective seen from outside). Called by the generation ahead only."""
    if not (f.enabled and f.stuck_generation_at_step == step):
        return
    while True:
        time.sleep(60)


def before_load(f: FaultsConfig) -> None:
    """``faults.slow_load``: sleep before the model loads, as a read from a busy shared
    filesystem would take (the trainer is in state LOADING meanwhile)."""
    if f.enabled and f.slow_load > 0:
        time.sleep(f.slow_load)


def before_update(f: FaultsConfig, step: int, device: torch.device) -> None:
    """``faults.oom_at_step``: from here on this process may use only ``oom_gpu_gb`` GiB of
    its GPU, so the update that follows runs out of memory in the real caching allocator,
    as on a smaller card. Without CUDA the error is raised here."""
    if not (f.enabled and f.oom_at_step == step):
        return
    if device.type != "cuda":
        raise torch.cuda.OutOfMemoryError(
            f"fault injection: CUDA out of memory (a GPU of {f.oom_gpu_gb:g} GiB is full)"
        )
    torch.cuda.empty_cache()  # cached blocks would otherwise serve the update
    # never above an emulated GPU's cap (GRPO_HPC_EMULATE_GPU): the fault shrinks the card
    gpu.cap_memory(device, min(f.oom_gpu_gb, gpu.total_gib(device)))


def in_update(f: FaultsConfig, step: int) -> None:
    """``faults.stall_at_step``: inside the update's phase, one second of sleep."""
    if f.enabled and f.stall_at_step == step:
        time.sleep(1.0)


def digests_on(f: FaultsConfig) -> bool:
    """``faults.state_digest``: state digests at saves and resumes (state_digest.py)."""
    return f.enabled and f.state_digest
