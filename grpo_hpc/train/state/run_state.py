"""The trainer's run state in and out of checkpoints: what a checkpoint keeps besides the
weights and optimizer (step, data position, scheduler, breaker streaks, the collapse
watch), what it keeps of each rank alone (RNG, the batches generated ahead), a save of
this step, the resume from the newest complete checkpoint, and the state digests of
``faults.state_digest`` around both.

The loop (train/trainer.py's ``Trainer``) hands itself in (:class:`TrainerParts`); the
files and their format are checkpoint.py's, the digests' state_digest.py's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from grpo_hpc.config.schema import Config, FaultsConfig
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState
from grpo_hpc.tasks.problems import Sampler
from grpo_hpc.train.algo.optimization import StepOptimizer
from grpo_hpc.train.distributed import dist
from grpo_hpc.train.measure.profiling import phase
from grpo_hpc.train.measure.tracking import Tracker
from grpo_hpc.train.state import checkpoint, state_digest

if TYPE_CHECKING:
    from grpo_hpc.train.rollout.pipeline import RolloutPipeline


@dataclass(frozen=True)
class Tools:
    """What saving and resuming need of train/supervision/, handed in by the trainer (a
    package of this layer imports none beside it; on_collapse.Tools alike)."""

    digests_on: Callable[[FaultsConfig], bool]
    """train.supervision.faults.digests_on: whether ``faults.state_digest`` asks for digests."""
    streaks: Callable[[int], Any]
    """train.supervision.breakers.Streaks: the breakers' streaks from a checkpoint's count."""


class TrainerParts(Protocol):
    """What of the trainer a checkpoint keeps and a resume restores."""

    cfg: Config
    paths: RunPaths
    info: dist.DistInfo
    step: int
    """Steps trained."""
    model: torch.nn.Module
    opt: StepOptimizer
    """Its optimizer and learning-rate schedule."""
    sampler: Sampler
    """The data position."""
    streaks: Any
    """train.supervision.breakers.Streaks (a package beside this one)."""
    collapse: Any
    """train.supervision.on_collapse.CollapseGuard: its state rides in every checkpoint."""
    rollouts: RolloutPipeline
    """Its rollouts (a split run's SplitPipeline too): an async run's batches made ahead."""
    tracker: Tracker
    last_save: float
    """``time.monotonic()`` at the last save (``training.save_every_seconds``)."""

    def set_rollout_cap(self, cap: int) -> None: ...


def resume(t: TrainerParts, tools: Tools) -> None:
    """The newest complete checkpoint, if any, restored into ``t`` (collective)."""
    step = t.paths.latest_checkpoint()
    if step is None:
        return
    state, rng = checkpoint.load(
        t.paths.checkpoint(step),
        t.model,
        t.opt.optim,
        t.info,
        trainable_only=bool(t.cfg.model.lora_rank),
    )
    t.opt.sched.load_state_dict(state["scheduler"])
    t.sampler.load_state_dict(state["sampler"])
    t.step = state["step"]
    t.streaks = tools.streaks(state["zero_streak"])
    # the collapse watch, its rollbacks and seed (older checkpoints: the cut-off streak)
    t.collapse.load(state.get("collapse"), state.get("cut_streak", 0))
    if t.collapse.cap is not None:  # a rollback before the stop raised it
        t.set_rollout_cap(t.collapse.cap)
    if t.collapse.synchronous:  # a rollback before the stop made the run synchronous
        t.rollouts.go_synchronous()
    if rng is not None:
        checkpoint.set_rng_state(rng)
    t.rollouts.load_state_dict(rng)  # this rank's batches generated ahead, if any
    if tools.digests_on(t.cfg.faults):
        # named by this launch (rank 0's token: a rank's own attempt count is read from
        # progress.json, which rank 0 may already have rewritten)
        launch = dist.launch_token(t.info)
        write_digest(t, tools, f"resume-{launch}-step{t.step}", rank_state(t))
    t.tracker.update(
        restarts=t.tracker.record.restarts + 1,
        step=t.step,
        start_step=t.step,
        epoch=t.sampler.epoch,
        last_checkpoint=step,
    )


def trainer_state(t: TrainerParts) -> dict:
    """What a checkpoint keeps besides weights, optimizer and RNG."""
    return {
        "step": t.step,
        "sampler": t.sampler.state_dict(),
        "scheduler": t.opt.sched.state_dict(),
        "zero_streak": t.streaks.zero_reward,
        "collapse": t.collapse.state(),
    }


def rank_state(t: TrainerParts) -> dict:
    """What a checkpoint keeps of this rank alone: its RNG and (asynchronous runs) the
    batches it generated ahead from its share of the prompts (``rng-rank<R>.pt``)."""
    return checkpoint.rng_state() | t.rollouts.state_dict()


def write_digest(t: TrainerParts, tools: Tools, name: str, rng: dict) -> None:
    """``faults.state_digest``: this rank's state digest (state_digest.py)."""
    if not tools.digests_on(t.cfg.faults):
        return
    parts = state_digest.digest(t.model, t.opt.optim, rng, trainer_state(t))
    state_digest.write(t.paths.state_digest, f"{name}-rank{t.info.rank}", parts)


def save(t: TrainerParts, tools: Tools) -> None:
    """This step's checkpoint (collective), unless it is step 0 or has one already."""
    # Step 0 is never saved: every attempt rebuilds it identically from the seed, and
    # saving it would change it. torch's get_state_dict fills an empty optimizer state
    # by taking an AdamW step on zero gradients, so a step-0 checkpoint carries Adam
    # step count 1 and every later bias correction is off by one (a hang_rank fault trial).
    if t.step == 0 or t.paths.latest_checkpoint() == t.step:
        return
    t.tracker.update(TrainState.CHECKPOINTING)
    state, rng = trainer_state(t), rank_state(t)
    # before the save: a rank killed once its checkpoint is complete (its peer finished
    # it) has written its digest already (a save that never completes is never loaded)
    write_digest(t, tools, f"save-step{t.step}", rng)
    seconds: dict[str, float] = {}
    with phase("save"):
        checkpoint.save(
            t.paths,
            t.step,
            t.model,
            t.opt.optim,
            state,
            rng,
            t.info,
            trainable_only=bool(t.cfg.model.lora_rank),
            keep_last=t.cfg.training.keep_last,
            slow_save_s=t.cfg.faults.slow_save if t.cfg.faults.enabled else 0,
            seconds=seconds,
        )
    t.last_save = time.monotonic()
    t.tracker.update(last_checkpoint=t.step)
    t.tracker.log_save(t.step, seconds)
