"""What the trainer does when :mod:`grpo_hpc.train.supervision.collapse` says the run has
stopped learning: ``training.on_collapse`` = flag | stop | rollback.

The decision is pure (:func:`action_for`); :class:`CollapseGuard` is the thin shell the
trainer calls twice (after each step's metrics, after each evaluation) and whose state a
checkpoint keeps (the watch, the rollbacks so far and the sampling seed in use), so a
resumed run knows its attempts and its seed. Every detection is one ``collapse`` event in
``events.jsonl`` (the monitor's format: time, job_id, phase, action, class, reason), read
by grpo-status (the COLLAPSE flag), its plot (a vertical line) and the monitor (a run
stopped for collapse is never resubmitted).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from grpo_hpc.config.schema import Config
from grpo_hpc.core import events as event_log
from grpo_hpc.core.errors import CircuitBreakerError
from grpo_hpc.core.events import Event, Phase
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState
from grpo_hpc.train.distributed import dist
from grpo_hpc.train.supervision import collapse
from grpo_hpc.train.supervision.collapse import Thresholds, Verdict, Watch

EVENT_CLASS = "collapsed"
SEED_STRIDE = 1000
"""Rollback k samples with ``training.seed + k * SEED_STRIDE``: far from the seeds that
other runs of a seed sweep use (consecutive seeds)."""


def thresholds(cfg: Config, cap: int = 0) -> Thresholds:
    """The detector's thresholds from the config (the rest are the calibrated defaults);
    ``cap``: the rollouts' cap in force (0: the configured one)."""
    t = cfg.training
    return Thresholds(
        cut_off_patience=t.cut_off_patience,
        window=t.collapse_window,
        patience=t.collapse_patience,
        cap=cap or cfg.rollout.max_new_tokens,
    )


def action_for(on_collapse: str, rollbacks: int, retries: int) -> str:
    """flag, stop or rollback for a verdict (pure): a rollback past the budget stops."""
    if on_collapse == "rollback" and rollbacks >= retries:
        return "stop"
    return on_collapse


def rollback_cap(at_cap: bool, cap: int, configured: int, growth: float, limit: int) -> int:
    """The rollouts' cap after a rollback (pure): ``cap`` times ``growth`` for a collapse
    at the cap (:func:`collapse.at_cap`), at most ``limit`` (0: twice the ``configured``
    cap), never below ``cap``; any other collapse keeps it. On 2026-12-04 all five seeds
    (of 20, 48 tokens) that two rollbacks with a new seed did not rescue were back in the
    cap at every verdict; at 96 tokens 19 of 20 seeds ended above 0.5 (2026-12-01)."""
    if not at_cap or growth <= 1:
        return cap
    return max(cap, min(limit or 2 * configured, round(cap * growth)))


def rollback_target(
    peak: int, kept: bool, at_cap: bool, trapped: tuple[int, ...], can_restart: bool
) -> int | None:
    """Where a rollback goes (pure): the step of the peak validation score (``kept``: its
    checkpoint is still there), else the start (0); None when it cannot go anywhere (the
    start, for a LoRA policy). For a collapse at the cap, a peak saved at the cap
    (``trapped``: :attr:`collapse.Watch.trapped`) is a model already in the trap: the start
    instead. Of 17 recorded seeds rolled back only to such checkpoints, 13 were handed over
    below 0.5; of 16 whose first rollback went to the start, 13 were rescued (2026-12-01/04,
    learning_2term_mask_*48 in bench/results)."""
    target = peak if kept else 0
    if target and at_cap and target in trapped and can_restart:
        target = 0
    if target == 0 and not can_restart:
        return None
    return target


def rollback_seed(seed: int, attempt: int) -> int:
    """The sampling seed of rollback ``attempt`` (1, 2, ...): pure, so a resume knows it."""
    return seed + attempt * SEED_STRIDE


def staleness_hint(max_staleness: int) -> str:
    """What a collapse stop adds for an asynchronous run (pure; empty for a synchronous
    one): measured on the learning benchmark (docs/async.md, "What staleness costs in
    learning"), one update of staleness left 10 of 20 seeds trapped where the synchronous
    step left 4, so the one change worth naming is to train synchronously."""
    if max_staleness < 1:
        return ""
    return (
        f"; the run is asynchronous (algo.max_staleness={max_staleness}), and asynchronous "
        "runs stalled more often on the learning benchmark (docs/async.md): "
        "algo.max_staleness=0 may learn"
    )


class TrainerLike(Protocol):
    cfg: Config
    paths: RunPaths
    step: int
    model: torch.nn.Module
    info: Any
    opt: Any
    tracker: Any

    def save(self) -> None: ...

    def set_rollout_cap(self, cap: int) -> None: ...

    def set_synchronous(self) -> None: ...

    def _export_final(self) -> str | None: ...


@dataclass(frozen=True)
class Tools:
    """What a rollback needs of the packages beside this one (train/state, train/setup),
    handed in by the trainer (a package of this layer imports none beside it)."""

    read_best: Callable[[Path], Any]
    """train.state.best.read_best: the best evaluation's record, or None."""
    load_checkpoint: Callable[..., Any]
    """train.state.checkpoint.load: model and optimizer in place."""
    seed_all: Callable[[int], None]
    """train.state.checkpoint.seed_all."""
    materialize: Callable[..., Path]
    """train.setup.models.materialize: the model's directory."""
    load_model: Callable[..., Any]
    """train.setup.models.load_model_and_tokenizer."""
    cap_fits: Callable[[Config, int, Any], bool] = lambda cfg, cap, info: True
    """train.setup.autos.cap_fits: whether rollouts of a grown cap fit the GPU."""


@dataclass
class CollapseGuard:
    """The trainer's collapse watch and what it did about it."""

    cfg: Config
    paths: RunPaths
    tools: Tools | None = None
    """None: rollback is not possible (a rollback then stops)."""
    watch: Watch = field(default_factory=Watch)
    rollbacks: int = 0
    """Rollbacks so far (``training.collapse_retries`` is the budget)."""
    seed: int | None = None
    """Sampling seed drawn by the last rollback (None: ``training.seed``)."""
    finished: Verdict | None = None
    """The solved verdict that ends training early (``training.on_solved=finish``)."""
    cap: int | None = None
    """The rollouts' cap a rollback raised (``training.rollback_cap_growth``); None: the
    configured ``rollout.max_new_tokens``."""
    synchronous: bool = False
    """A rollback made the asynchronous run synchronous (``training.rollback_synchronous``)."""

    @property
    def rollout_cap(self) -> int:
        """The rollouts' cap in force."""
        return self.cap or self.cfg.rollout.max_new_tokens

    @property
    def seed_in_use(self) -> int:
        """The sampling seed now: the last rollback's, or ``training.seed``."""
        return self.seed if self.seed is not None else self.cfg.training.seed

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps."""
        return {
            "watch": self.watch.to_state(),
            "rollbacks": self.rollbacks,
            "seed": self.seed,
            "cap": self.cap,
            "synchronous": self.synchronous,
        }

    def load(self, state: dict[str, Any] | None, legacy_cut_streak: int = 0) -> None:
        """From a checkpoint (one from before this guard carries only the cut-off streak)."""
        if not state:
            self.watch = Watch(all_cut=legacy_cut_streak)
            return
        self.watch = Watch.from_state(state.get("watch"))
        self.rollbacks, self.seed = int(state.get("rollbacks", 0)), state.get("seed")
        self.cap = state.get("cap")
        self.synchronous = bool(state.get("synchronous", False))

    def observe_step(self, m: dict[str, Any], stats: dict[str, Any], is_main: bool) -> None:
        """A step's all-reduced metrics (the same on every rank)."""
        th = thresholds(self.cfg, self.rollout_cap)
        risk = collapse.stall_risk(
            int(m["step"]), float(m["rollout/truncated"]), self.cfg.algo.mask_truncated, th.cap
        )
        if risk and is_main:
            print(f"[Collapse] warning: {risk}", flush=True)
        self.watch = self.watch.after_step(
            float(m["reward/mean"]),
            stats.get("grad_norm"),
            float(m["rollout/truncated"]),
            stats.get("entropy"),
            self.cfg.algo.mask_truncated,
            th.window,
            th.entropy_floor,
            float(m.get("rollout/solved", 0.0)),
        )

    def observe_eval(self, step: int, accuracy: float | None, problems: int = 0) -> None:
        if accuracy is not None:
            self.watch = self.watch.after_eval(step, accuracy, problems)

    def act(self, trainer: TrainerLike) -> None:
        """After a step: flag, stop (raises CircuitBreakerError, exit 3, checkpoint saved)
        or roll back, as the verdict and ``training.on_collapse`` say; a solved task is
        flagged or ends the run well (:attr:`finished`), as ``training.on_solved`` says."""
        if self._solved(trainer):
            return
        v = _agreed(
            collapse.verdict(self.watch, thresholds(self.cfg, self.rollout_cap), trainer.step),
            trainer,
        )
        if v is None:
            return
        self.watch = collapse.reported(self.watch, v)
        t = self.cfg.training
        what = action_for(t.on_collapse, self.rollbacks, t.collapse_retries)
        if what == "rollback" and self._rollback(trainer, v):
            return
        if what == "flag":
            self._event(trainer, v, "FLAG", "flagged (training.on_collapse=flag); training goes on")
            return
        spent = ""
        if t.on_collapse == "rollback":
            spent = (
                f" after {self.rollbacks} rollback(s), training.collapse_retries spent"
                if self.rollbacks >= t.collapse_retries
                else ": no best checkpoint, and a LoRA policy cannot go back to the start"
            )
        note = f"stopped (training.on_collapse={t.on_collapse}{spent}); checkpoint saved"
        # a run a rollback made synchronous has nothing more to try there
        hint = "" if self.synchronous else staleness_hint(self.cfg.algo.max_staleness)
        trainer.save()
        self._event(trainer, v, "STOP", note + hint)
        if t.save_final and t.export_final and trainer.info.is_main:
            # final/: the model to hand over (training.final), last/ beside; what and why
            if out := trainer._export_final():
                note += f", the model to hand on in {out}"
        error = CircuitBreakerError(f"{v.line()}; {note}{hint}")
        # Rank 0 records the stop, then every rank waits for it: a rank that exits first
        # (its own exit 3) makes torchrun end rank 0, maybe in the middle of an export of
        # several GB and before the COLLAPSED record the monitor reads.
        if trainer.info.is_main:
            trainer.tracker.update(
                TrainState.FAILED, exit_code=int(error.exit_code), reason=str(error)
            )
        dist.barrier(trainer.info)
        raise error

    def _solved(self, trainer: TrainerLike) -> bool:
        """The solved verdict, acted on (True: nothing else to judge at this step). Every
        rank reads the same all-reduced numbers, so every rank agrees without a collective."""
        v = collapse.solved(self.watch, thresholds(self.cfg, self.rollout_cap), trainer.step)
        if v is None:
            return False
        self.watch = collapse.reported(self.watch, v)
        more = (
            "rollout.dynamic_sampling found no group with anything to learn"
            if self.cfg.rollout.dynamic_sampling
            else "harder problems (or rollout.dynamic_sampling) would give it something to learn"
        )
        if self.cfg.training.on_solved == "flag":
            note = f"flagged (training.on_solved=flag); training goes on ({more})"
            self._event(trainer, v, "FLAG", note, phase=Phase.SOLVED, cls="solved")
            return True
        note = (
            f"training ends here as finished (training.on_solved=finish), the best model "
            f"handed over; {more}"
        )
        self._event(trainer, v, "FINISH", note, phase=Phase.SOLVED, cls="solved")
        self.finished = Verdict(v.signal, v.step, f"{v.why}; {note}")
        return True

    def _rollback(self, trainer: TrainerLike, v: Verdict) -> bool:
        """Back to the best checkpoint (or the start) with a new sampling seed; False when
        it cannot (the caller stops instead)."""
        if self.tools is None:
            return False
        best = self.tools.read_best(self.paths.root)
        # The peak, not the model to hand over (which may be a later one within noise of
        # it: on 2026-12-04 rollbacks to such a model went back into the stall, 5 of 10
        # seeds handed over below 0.5)
        peak = best.peak[1] if best is not None else 0
        at_cap = collapse.at_cap(v, self.watch)  # before the watch starts afresh
        kept = peak > 0 and self.paths.checkpoint(peak).is_dir()
        target = rollback_target(peak, kept, at_cap, self.watch.trapped, _can_restart(self.cfg))
        if target is None:
            return False
        ckpt = self.paths.checkpoint(target)
        skipped = kept and target != peak
        trapped = f" (the peak, step {peak}, was saved at the cap)" if skipped else ""
        if target:
            _load_checkpoint_weights(trainer, ckpt, self.tools)
        else:
            _load_start_weights(trainer, self.tools)
        self.rollbacks += 1
        self.seed = rollback_seed(self.cfg.training.seed, self.rollbacks)
        self.tools.seed_all(self.seed + trainer.info.rank)
        self.watch = self.watch.restarted()
        t = self.cfg.training
        note = (
            f"rollback {self.rollbacks}/{t.collapse_retries} to step {target} "
            f"({'best checkpoint' if target else 'the start'}){trapped} with sampling seed "
            f"{self.seed}; "
            f"{self._grow_cap(trainer, at_cap)}{self._synchronous(trainer)}"
        )
        cap = self.rollout_cap
        self._event(trainer, v, "ROLLBACK", note, to_step=target, seed=self.seed, cap=cap)
        trainer.tracker.update(reason=f"{v.line()}; {note}")
        return True

    def _synchronous(self, trainer: TrainerLike) -> str:
        """An asynchronous run made synchronous by its first rollback
        (``training.rollback_synchronous``); what changed, in words (empty: nothing)."""
        cfg = self.cfg
        if cfg.algo.max_staleness < 1 or not cfg.training.rollback_synchronous:
            return ""
        if self.synchronous:
            return ""  # an earlier rollback did it
        trainer.set_synchronous()
        self.synchronous = True
        return (
            "; synchronous from here (training.rollback_synchronous: asynchronous runs "
            "stalled more often on the learning benchmark, docs/async.md)"
        )

    def _grow_cap(self, trainer: TrainerLike, at_cap: bool) -> str:
        """The rollouts' cap for the next attempt (:func:`rollback_cap`), applied; what
        changed besides the seed, in words."""
        t, cap, configured = self.cfg.training, self.rollout_cap, self.cfg.rollout.max_new_tokens
        grown = rollback_cap(at_cap, cap, configured, t.rollback_cap_growth,
                             t.rollback_cap_max)  # fmt: skip
        if grown == cap:
            return "nothing else changed"
        assert self.tools is not None  # a rollback has its tools
        if not self.tools.cap_fits(self.cfg, grown, trainer.info):
            return f"the cap stays {cap}: {grown} tokens would not fit the GPU by the estimate"
        self.cap = grown
        trainer.set_rollout_cap(grown)
        return (
            f"rollouts' cap raised {cap} -> {grown} tokens (the collapse was at the cap; "
            f"evaluations keep {configured})"
        )

    def _event(
        self,
        trainer: TrainerLike,
        v: Verdict,
        action: str,
        note: str,
        phase: Phase = Phase.COLLAPSE,
        cls: str = EVENT_CLASS,
        **extra: Any,
    ) -> None:
        if trainer.info.is_main:
            tag = "[Solved]" if phase == Phase.SOLVED else "[Collapse]"
            print(f"{tag} {v.line()}; {note}", flush=True)
            job_id = str(trainer.tracker.record.job_id)
            more = {"signal": v.signal, "step": v.step, "rollbacks": self.rollbacks, **extra}
            ev = Event(time.time(), job_id, phase, action, cls, f"{v.line()}; {note}", extra=more)
            event_log.append(self.paths.events, ev)


def _agreed(v: Verdict | None, trainer: TrainerLike) -> Verdict | None:
    """The verdict every rank acts on. The watch reads all-reduced numbers, so the ranks
    agree already; one all-reduce makes sure (a rank alone in a rollback would hang)."""
    mine = collapse.SIGNALS.index(v.signal) + 1 if v is not None else 0
    agreed = int(dist.all_reduce_max(float(mine), trainer.info))
    if agreed == mine:
        return v
    return Verdict(collapse.SIGNALS[agreed - 1], trainer.step, "seen by another rank")


def _can_restart(cfg: Config) -> bool:
    """Rolling back to the start reloads the base weights whole: not for a LoRA policy."""
    return cfg.model.lora_rank == 0


def _load_checkpoint_weights(trainer: TrainerLike, ckpt: Path, tools: Tools) -> None:
    """Model and optimizer of the best checkpoint, in place; the step count, the learning
    rate schedule and the sampler go on (the step budget counts over every attempt)."""
    tools.load_checkpoint(
        ckpt,
        trainer.model,
        trainer.opt.optim,
        trainer.info,
        trainable_only=bool(trainer.cfg.model.lora_rank),
    )


def _load_start_weights(trainer: TrainerLike, tools: Tools) -> None:
    """The model's starting weights (its directory, read again) and a fresh optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    cfg = trainer.cfg
    model_dir = tools.materialize(cfg.model, trainer.paths.root, cfg.training.seed)
    fresh, _ = tools.load_model(model_dir, cfg.model.attn_implementation, torch.device("cpu"))
    set_model_state_dict(
        trainer.model, fresh.state_dict(), options=StateDictOptions(full_state_dict=True)
    )
    _restart_optimizer(trainer.opt.optim)


def _restart_optimizer(optim: torch.optim.Optimizer) -> None:
    """Every state tensor to zero: for Adam(W), the state of its first step (moments 0,
    step 0). Zeroed rather than dropped: a checkpoint of an empty optimizer state is
    filled by torch with one step on zero gradients (train/state/run_state.py, save)."""
    for state in optim.state.values():
        for key, value in list(state.items()):
            if torch.is_tensor(value):
                _zero(value)
            elif isinstance(value, (int, float)):
                state[key] = type(value)(0)


def _zero(value: torch.Tensor) -> None:
    """``value`` set to zero in place, whatever its tensor subclass (a DTensor shard too)."""
    try:
        value.zero_()
    except NotImplementedError:
        # A quantized state (torchao's int8/int4/fp8 AdamW moments) implements no in-place
        # zero_; copying zeros in quantizes them, keeping its own layout.
        value.copy_(torch.zeros(value.shape, dtype=value.dtype, device=value.device))


def score_of(metrics: dict[str, float]) -> float | None:
    """The held-out figure the detector watches: accuracy (math) or pass@1 (code)."""
    return metrics.get("accuracy", metrics.get("pass@1"))
