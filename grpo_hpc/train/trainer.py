"""The GRPO training loop: rollout -> rewards -> advantages -> update -> progress -> checkpoint.

Algorithm: GRPO (Shao et al. 2024, DeepSeekMath) — G sampled completions per
prompt, group-relative advantages, PPO-style clipped surrogate, optional k3 KL
to a frozen reference — with the DAPO refinements as options (clip-higher,
token-level aggregation, dynamic sampling) and Dr. GRPO's mean-only advantages /
constant normaliser. Defaults (config/schema.py): token-level loss, eps 0.2/0.28, beta 0.

Every rank runs this loop on its own share of prompts (whole groups per rank).
Decisions that end a step are agreed across ranks (``dist.all_reduce_max``).
"""

from __future__ import annotations

import dataclasses
import functools
import signal
import time
from collections.abc import Callable
from typing import Any

import torch

from grpo_hpc.config import speed as auto_speed
from grpo_hpc.config import validate
from grpo_hpc.config.schema import Config
from grpo_hpc.core.errors import (
    CircuitBreakerError,
    ConfigError,
    ExitCode,
    GrpoError,
    StoppedBeforeTrainingError,
)
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState
from grpo_hpc.tasks import problems as data
from grpo_hpc.train.algo import batching
from grpo_hpc.train.algo.optimization import StepOptimizer, autocast_factory
from grpo_hpc.train.distributed import dist, gpu
from grpo_hpc.train.evaluation.held_out import HeldOutEval, select_metric, steering_line
from grpo_hpc.train.measure import stall_sampler
from grpo_hpc.train.measure.profiling import StepProfiler, phase, thread_clock, window
from grpo_hpc.train.measure.stall_sampler import StallSampler
from grpo_hpc.train.measure.step_report import StepReporter, finite
from grpo_hpc.train.measure.tracking import Tracker, step_samples
from grpo_hpc.train.rewards import functions as rewards
from grpo_hpc.train.rollout import engines as rollout
from grpo_hpc.train.rollout.collect import Collector
from grpo_hpc.train.rollout.engines import GenerationAborted
from grpo_hpc.train.rollout.pipeline import RolloutPipeline
from grpo_hpc.train.rollout.split import Hello, Link, SplitPipeline
from grpo_hpc.train.setup import autos, loading, models
from grpo_hpc.train.setup.autos import kernels_line
from grpo_hpc.train.state import best, checkpoint, final, run_state
from grpo_hpc.train.supervision import breakers, faults, on_collapse
from grpo_hpc.train.supervision.gc_schedule import GcSchedule
from grpo_hpc.train.supervision.signals import STOP_SIGNALS


class Trainer:
    def __init__(
        self,
        cfg: Config,
        paths: RunPaths,
        info: dist.DistInfo,
        stop_signal: int | None = None,
        link: Link | None = None,
    ) -> None:
        """``stop_signal``: one that arrived before the trainer existed
        (train.supervision.signals); ``link``: a split run's end towards its generator
        (``info`` is then the trainers' ranks among themselves)."""
        self.cfg, self.paths, self.info, self.link = cfg, paths, info, link
        self.stop_signal = stop_signal
        self.evaluating = False
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        self.tracker = Tracker(paths, cfg, info.is_main)
        self.step = 0
        self.streaks = breakers.Streaks()
        self.collapse = on_collapse.CollapseGuard(cfg, paths, _ROLLBACK_TOOLS)
        self.last_save = time.monotonic()
        self.gc = GcSchedule(cfg.training.gc_every_steps)
        steps = window(cfg.training.profile_from, cfg.training.profile_steps)
        cuda = info.device.type == "cuda"
        self.profiler = StepProfiler(paths.torch_profile, info.rank, steps, cuda)
        every = cfg.training.stall_sample_ms / 1000
        self.stalls = StallSampler(paths.torch_profile, info.rank, every) if every else None

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        if self.info.is_main:
            self.run_dir_lock = checkpoint.lock_run_dir(self.paths)
        self.tracker.update(TrainState.LOADING)
        # Nothing in the loop beats while the model loads, which can outlast the monitor's
        # heartbeat timeout: a thread beats until the first generation changes the state
        # (or this fails); the monitor judges a load by step0_timeout (Tracker docstring).
        self.tracker.beat_while_loading(self.cfg.training.setup_heartbeat_s)
        try:
            self._load()
        except BaseException:
            self.tracker.stop_loading_beat()
            raise

    def _load(self) -> None:
        """Everything setup does in state LOADING: the model loaded, wrapped, the engine
        built, the latest checkpoint resumed."""
        cfg, info = self.cfg, self.info
        self._stop_before_training()
        if cfg.training.num_threads:
            torch.set_num_threads(cfg.training.num_threads)
        loading.refuse_without_gpu(cfg, info.device)
        # An emulated GPU (GRPO_HPC_EMULATE_GPU) caps its memory before the first auto decision
        if (emulating := gpu.emulate(info.device)) and info.is_main:
            print(emulating, flush=True)
        self.cfg = autos.resolve(cfg, info)
        dist.choose_kernels_by_rule(info.device, cfg.dist.deterministic_kernels)
        self.speed_line = auto_speed.describe(cfg, self.cfg)  # said with the engine chosen
        cfg = self.cfg
        problem = validate.share_problem(cfg.rollout.prompts_per_step, info.world_size)
        if problem:
            raise ConfigError(problem)
        splits, self.eval_set = loading.load_sets(cfg)
        self.train_set = splits.train
        metric = select_metric(cfg.training.select_metric, splits)
        self.keep_best = best.KeepBest(self.paths, info, metric, f"{cfg.data.source} validation")
        if not cfg.data.system_prompt:  # code problems ask for code, not an answer line
            cfg.data.system_prompt = data.default_instruction(self.train_set)
        self.sampler = data.Sampler(len(self.train_set), cfg.training.seed)
        self.custom = {spec: rewards.load_custom_reward(spec) for spec in cfg.reward.custom}
        try:
            rewards.prove_workers(cfg.reward)  # a reward that cannot run must not read as zero
        except ConfigError:
            if self.stop_signal is not None:  # the job is ending: its signal broke the check
                raise StoppedBeforeTrainingError("stopped during start-up; resubmit me") from None
            raise
        self.model_dir = loading.model_directory(cfg, self.paths.root, info)
        faults.before_load(cfg.faults)
        self.load_dtype = loading.load_dtype(cfg, info.device)
        model, self.tok = models.load_model_and_tokenizer(
            self.model_dir, cfg.model.attn_implementation, info.device, dtype=self.load_dtype
        )
        self._stop_before_training()  # loading can take minutes: check before building on it
        self._setup_model(model)
        # Step 0 is the same state in every attempt: the first one built the random tiny
        # model (drawing from the generator), a later one loaded it and drew nothing.
        checkpoint.seed_all(cfg.training.seed + info.rank)
        run_state.resume(self, _RUN_STATE_TOOLS)  # the newest checkpoint, if any

    def _setup_model(self, model: torch.nn.Module) -> None:
        cfg = self.cfg
        grouped = cfg.rollout.steps_per_generation > 1  # the policy generates: no copy
        async_thread = bool(cfg.algo.max_staleness) and self.link is None and not grouped
        policy = loading.wrap_policy(model, cfg, self.info, async_thread)
        self.model, self.ref, attn = policy.model, policy.ref, policy.attn
        on_gpu = self.info.device.type == "cuda"
        dtype = loading.HALF.get(cfg.dist.precision)
        # fp32 master weights; bf16/fp16 compute through autocast (generation too); the
        # update's keeps no cast cache (one low-precision copy of the model saved).
        self.autocast = autocast_factory("cuda", dtype if on_gpu else None)
        update_autocast = autocast_factory("cuda", dtype if on_gpu else None, cache=False)
        self.opt = StepOptimizer(self.model, cfg, self.info, update_autocast)
        if self.info.is_main and cfg.optim.state != "fp32":
            kind = type(self.opt.optim)
            print(f"[Optim] optim.state={cfg.optim.state}: {kind.__module__}.{kind.__name__}")
        problems = self.train_set + self.eval_set
        self.engine_options = loading.engine_options(cfg, self.info, self.tok, problems)
        # Evaluation is not cut mid-chunk: its ranks agree on a stop between chunks.
        stop = lambda: self.stop_signal is not None  # noqa: E731
        self.engine = self._build_engine(
            dist.unwrap(self.model), lambda: stop() and not self.evaluating
        )
        if self.info.is_main:
            print(f"{self.speed_line}, {self.engine.choice.line}", flush=True)
            cap = gpu.capability(self.info.device) if on_gpu else None
            scaler = self.opt.scaler is not None
            line = kernels_line(cfg.dist.precision, scaler, attn, self.engine.decode_path, cap)
            print(line, flush=True)
        collector = Collector(
            cfg, self.info, self.tok, self.train_set, self.sampler, self.custom, self.tracker,
            self.engine,
        )  # fmt: skip
        whole = dist.unwrap(self.model)  # async (algo.max_staleness): a copy generates
        if self.link is not None:  # rollout.placement=split: a generator process generates
            trainers, chosen = self.info.world_size, self.engine.choice.engine
            if problem := validate.split_evaluation_problem(cfg, trainers, chosen):
                raise ConfigError(problem)
            hello = Hello.of(cfg, self.engine_options, self.load_dtype, whole)
            self.rollouts = SplitPipeline(
                collector, whole, self.link, hello, self.tracker.heartbeat
            )
        else:
            fault = functools.partial(faults.stuck_generation, cfg.faults)  # test-only
            self.rollouts = RolloutPipeline(
                collector, whole, self._build_engine, stop, self.autocast, policy.shadow, fault
            )
        self.held_out = HeldOutEval(
            cfg, self.info, self.tok, self.engine, self.eval_set, self.tracker, self._stop_agreed
        )
        self.reporter = StepReporter(cfg, self.info, self.engine, self.gc.clock)

    def _build_engine(
        self,
        model: torch.nn.Module,
        abort: Callable[[], bool],
        tick: Callable[[], None] | None = None,
    ) -> Any:
        """A rollout engine on ``model`` (the policy, or an async run's copy of it: a plain
        module, which generates alone, never in step with other ranks); ``tick``: called
        at each of its ticks beside the heartbeat (the decode thread's progress)."""
        opts = self.engine_options
        beat: Callable[[], None] = self.tracker.heartbeat
        if tick is not None:
            beat = _both(tick, beat)
        if dist.fsdp_root(model) is None:
            opts = dataclasses.replace(opts, synced=False)
        return rollout.build_engine(
            self.cfg.rollout.engine, model, self.tok, opts,
            tick=beat, abort=abort, autocast=self.autocast,
        )  # fmt: skip

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum

    def _stop_before_training(self) -> None:
        """During setup no step of this attempt has run: a stop exits 5 at once."""
        if self._stop_agreed():
            name = signal.Signals(self.stop_signal).name if self.stop_signal else "a peer rank"
            raise StoppedBeforeTrainingError(
                f"stopped on {name} during start-up, before any step of this attempt: "
                "nothing new to checkpoint; resubmit me"
            )

    # ------------------------------------------------------------------ loop
    def run(self) -> ExitCode:
        self.tracker.start_wandb()
        line = steering_line(self.cfg, len(self.eval_set), self.keep_best.metric is not None)
        if line and self.info.is_main:
            print(line, flush=True)
        try:
            if self.cfg.training.eval_every and self.step == 0 and self.eval_set:
                if not self.evaluate():  # the baseline every later eval/accuracy compares with
                    raise StoppedBeforeTrainingError(
                        "stopped during the step-0 evaluation: nothing to checkpoint; resubmit me"
                    )
            self.gc.start()
            stall_sampler.install(self.stalls)
            while self.step < self.cfg.training.max_steps and not self.collapse.finished:
                if self._stop_agreed():
                    return self._interrupt()
                snapshot = (checkpoint.rng_state(), self.sampler.state_dict())
                try:
                    self.train_step()
                except GenerationAborted:
                    # The step is abandoned: restore the state from its start so that
                    # the checkpoint resumes exactly where an uninterrupted run would be.
                    checkpoint.set_rng_state(snapshot[0])
                    self.sampler.load_state_dict(snapshot[1])
                    return self._interrupt()
                self._after_step()
            if self.cfg.training.save_final:
                final.verify_final_weights(self.paths, self.step, self.info)
                if self.cfg.training.export_final and self.info.is_main:
                    self._export_final()
            solved = self.collapse.finished  # a solved task ends before max_steps, well
            said = {"reason": solved.line()} if solved is not None else {}
            self.tracker.update(TrainState.FINISHED, exit_code=int(ExitCode.OK), **said)
            return ExitCode.OK
        finally:
            self.profiler.close()
            stall_sampler.install(None)
            self.gc.stop()
            self.tracker.finish()

    def _export_final(self) -> str | None:
        """Rank 0: the model to hand over as a Hugging Face directory (``final/``); where
        and which, in words, or None when it failed. The run has succeeded already: a
        failure here is one warning, and grpo-export RUN writes the directory later."""
        from grpo_hpc.export import run as export

        self.tracker.update(TrainState.CHECKPOINTING)  # a heartbeat while it writes
        t0 = time.monotonic()
        if self.cfg.faults.enabled and self.cfg.faults.slow_export:
            time.sleep(self.cfg.faults.slow_export)  # fault injection: an export of many GB
        try:
            out = export.export_final(self.paths, self.step)  # max_steps, or a collapse stop
        except (GrpoError, OSError, ValueError) as e:
            name, where = self.paths.name, self.paths.final
            print(f"[Export] warning: final model not written ({e}); run grpo-export {name} "
                  f"to write {where}", flush=True)  # fmt: skip
            return None
        print(f"[Export] final model: {out} ({time.monotonic() - t0:.1f} s)", flush=True)
        return out

    def _stop_agreed(self) -> bool:
        return dist.all_reduce_max(1.0 if self.stop_signal else 0.0, self.info) > 0

    def _interrupt(self) -> ExitCode:
        name = signal.Signals(self.stop_signal).name if self.stop_signal else "a peer rank"
        if self.step == 0:  # nothing trained, nothing to save: the next attempt starts afresh
            raise StoppedBeforeTrainingError(
                f"stopped on {name} before step 1: nothing to checkpoint; resubmit me"
            )
        self.save()
        self.tracker.update(
            TrainState.INTERRUPTED,
            exit_code=int(ExitCode.CHECKPOINTED),
            reason=f"stopped on {name} at step {self.step}; checkpoint saved",
        )
        return ExitCode.CHECKPOINTED

    def _after_step(self) -> None:
        t = self.cfg.training
        why = breakers.tripped(self.streaks, self.cfg)
        if why:
            self.save()
            raise CircuitBreakerError(why)
        if t.eval_every and self.step % t.eval_every == 0 and self.eval_set:
            self.evaluate()  # a stop during it is answered by the loop: save, exit 5
        # before the save: a checkpoint of this step holds a rollback's state (seed, count)
        self.collapse.act(self)  # flag, stop (exit 3) or roll back: training.on_collapse
        due_steps = t.save_every_steps and self.step % t.save_every_steps == 0
        due_time = t.save_every_seconds and time.monotonic() - self.last_save > t.save_every_seconds
        last = self.step == t.max_steps or self.collapse.finished is not None
        if dist.all_reduce_max(1.0 if (due_steps or due_time) else 0.0, self.info) > 0 or (
            last and t.save_final
        ):
            self.save()

    def save(self) -> None:
        """This step's checkpoint (collective): :func:`run_state.save`."""
        run_state.save(self, _RUN_STATE_TOOLS)

    # ------------------------------------------------------------------ one step
    def train_step(self) -> None:
        cfg, info = self.cfg, self.info
        t0 = time.monotonic()
        self.gc.before_step(self.step)  # the same point on every rank (gc_schedule.py)
        self.profiler.before_step(self.step + 1)
        if self.stalls is not None:
            self.stalls.step = self.step + 1
        faults.before_step(cfg.faults, self.step, self.tracker, lambda: bool(self.stop_signal))
        self.tracker.update(TrainState.GENERATING)
        got = self.rollouts.collect(self.step, self.collapse.rollbacks, self.collapse.seed_in_use)
        scored, t_gen, t_score = got.scored, got.generate_s, got.score_s
        if cfg.rollout.release_engine_memory:  # the update needs the engine's memory
            self.engine.release()
        groups_per_rank = cfg.rollout.prompts_per_step // info.world_size
        sel = batching.select_groups(scored, groups_per_rank, cfg.rollout.num_generations, cfg.algo)
        self.tracker.update(TrainState.TRAINING)
        faults.before_update(cfg.faults, self.step, info.device)
        with phase("update"):
            faults.in_update(cfg.faults, self.step)
            with thread_clock() as host:  # the host's part: Python, launches, syncs in it
                stats = self.opt.update(sel.microbatches, self.ref, self.step, self.save)
            t_sync = 0.0  # no GPU, nothing queued: no wait, and none measured
            if info.device.type == "cuda":  # the optimizer step's kernels are still queued:
                t1 = time.monotonic()
                # counted here, not in the next rollout; this stream's only: a device-wide
                # sync waits for an async run's decode too, and breaks a graph it captures
                torch.cuda.current_stream(info.device).synchronize()
                t_sync = time.monotonic() - t1
        self.rollouts.settle()  # the batches generated meanwhile, before anything reads state
        self.step += 1
        times = {"time/generate": t_gen, "time/score": t_score} | host.metrics("train", t_sync)
        times |= self.rollouts.metrics(len(sel.rewards))  # async: staleness, wait
        verify = got.verify_counts()
        with phase("report"):
            self._report(stats, sel, scored, times, t0, verify)
        self.profiler.after_step(self.step)

    def _report(
        self,
        stats: dict,
        sel: batching.Selection,
        scored: list,
        times: dict,
        t0: float,
        verify: tuple[float, float, float, float, float],
    ) -> None:
        # float(): torchao keeps its learning rate as a tensor (no recompile when it changes)
        lr = float(self.opt.sched.get_last_lr()[0])
        m = self.reporter.row(self.step, stats, sel, scored, times, t0, lr, verify)
        self.streaks = self.streaks.after(m["reward/mean"])
        self.collapse.observe_step(m, stats, self.info.is_main)
        self.tracker.update(
            step=self.step,
            epoch=self.sampler.epoch,
            reward_mean=m["reward/mean"],
            kl=stats.get("kl"),
            tokens_per_s=m["tokens_per_s"],
            entropy=finite(stats.get("entropy")),
            engine_kl=stats.get("rollout/engine_kl"),
            clip_frac=stats.get("clip_frac"),
            staleness=self.rollouts.staleness,
            continued=_count(times.get("partial/continued_rows")),
        )
        self.tracker.log_step(m)
        self.tracker.log_samples(step_samples(self.step, scored, self.cfg.training.log_samples))

    def set_synchronous(self) -> None:
        """The rollouts synchronous from the next step on (a collapse rollback's remedy;
        partial rollouts drop their pool)."""
        self.rollouts.go_synchronous()

    def set_rollout_cap(self, cap: int) -> None:
        """Rollouts of up to ``cap`` new tokens from now on (a rollback's remedy for a
        collapse at the cap). The config keeps the configured cap: evaluations, the
        export's generation config and Dr. GRPO's loss constant go on reading it."""
        self.rollouts.set_max_new_tokens(cap)  # the policy's engine, and an async run's copy

    def evaluate(self) -> bool:
        """The held-out evaluation at this step (:mod:`grpo_hpc.train.evaluation.held_out`); False
        when a stop agreed between two chunks dropped it."""
        self.evaluating = True  # no abort mid-chunk: the ranks agree on a stop between chunks
        try:  # at the configured cap, whatever a rollback made the rollouts': comparable
            with rollout.capped(self.engine, self.cfg.rollout.max_new_tokens):
                result = self.held_out.run(self.step)
        finally:
            self.evaluating = False
        if result is not None and self.keep_best.metric is not None:
            # Only the validation split steers: keep-best (a new best saves this step's
            # checkpoint) and the collapse watch's eval_drop and reward_hacking. Without
            # one the evaluation scored the test problems, which must choose nothing.
            self.keep_best.after_evaluation(self.step, result.metrics, result.problems, self.save)
            score = on_collapse.score_of(result.metrics)
            self.collapse.observe_eval(self.step, score, result.problems)
        return result is not None


_ROLLBACK_TOOLS = on_collapse.Tools(
    best.read_best,
    checkpoint.load,
    checkpoint.seed_all,
    models.materialize,
    models.load_model_and_tokenizer,
    autos.cap_fits,
)

_RUN_STATE_TOOLS = run_state.Tools(faults.digests_on, breakers.Streaks)


def _count(value: float | None) -> int | None:
    """A metric that counts, for progress.json (None: not logged)."""
    return None if value is None else int(value)


def _both(first: Callable[[], None], then: Callable[[], None]) -> Callable[[], None]:
    """One callback that calls ``first``, then ``then`` (an engine has one tick)."""

    def call() -> None:
        first()
        then()

    return call
