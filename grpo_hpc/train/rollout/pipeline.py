"""A step's rollouts, synchronous or generated ahead while earlier steps train.

``algo.max_staleness = 0``: the trainer's collector generates the step's batch with the
policy itself, then the step trains (every figure measured before this mode).

``k >= 1`` (asynchronous GRPO, docs/async.md): a copy of the policy's weights (the
*shadow*, with its own engine) generates. At step ``t`` the shadow takes the current
weights (version ``t``), the step's batch comes from those generated earlier (or is made
now when there is none: the first step), and a thread generates the batches of steps up
to ``t + k`` while the main thread runs the update (torch releases the GIL in its
kernels; on a GPU it decodes on a CUDA stream of its own, :mod:`side_stream`, so that
the GPU can run both at once). :mod:`schedule` decides which, as a pure function. The
thread is joined
before the step is reported, evaluated or saved, so nothing else reads or writes the
state it touches meanwhile (the sampler, the math-verify worker, the global RNG).

Determinism: each batch is generated from ``torch.manual_seed(rollout_seed(seed,
step))``, after the sampler drew the batches before it, by the weights :mod:`schedule`
names. The update on the main thread draws no random numbers (no dropout in the policies
trained; SDPA without dropout), so the thread's reseeding changes nothing there and the
run does not depend on thread timing. A batch generated ahead is not cut by a stop
signal: the checkpoint that follows holds it, so that the resumed run trains what the
uninterrupted one would (a stop waits at most one generation).

``rollout.steps_per_generation = M`` >= 2 (with ``k >= M - 1``): no thread and no shadow;
at the first step of a group the policy's own engine generates the batches of ``M`` steps
in one rollout, and each waits here for its step (:meth:`RolloutPipeline._collect_grouped`,
:func:`schedule.grouped_plan`).

Under FSDP2 the shadow is still a plain, full copy (taken before the policy was sharded):
its weights are gathered from the shards a tensor at a time, on the main thread at the
same point on every rank (a collective; :mod:`grpo_hpc.train.distributed.gather`), and
its engine generates alone.

Checkpoints hold the batches generated and not trained (samples, rewards, the sampler's
log-probs, their version) in each rank's ``rng-rank<R>.pt``, beside its RNG
(:meth:`RolloutPipeline.state_dict`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from grpo_hpc.config.validate import async_ranks_problem
from grpo_hpc.core.errors import ConfigError, StalledError
from grpo_hpc.train.algo.batching import Scored
from grpo_hpc.train.algo.logp_head import Scoring
from grpo_hpc.train.distributed import dist
from grpo_hpc.train.distributed.gather import copy_full_weights
from grpo_hpc.train.rollout.collect import Collected, Collector
from grpo_hpc.train.rollout.making import (
    Behaviour,
    Entry,
    for_partial,
    generate,
    partial_round,
    plain_copy,
    with_behaviour,
)
from grpo_hpc.train.rollout.partial import PartialPool, RoundReport
from grpo_hpc.train.rollout.progress import HOST, Progress, stuck_for, stuck_reason
from grpo_hpc.train.rollout.schedule import (
    Made,
    grouped_plan,
    plan,
    rollout_seed,
    staleness_histogram,
    staleness_metrics,
    warming,
)
from grpo_hpc.train.rollout.side_stream import SideStream
from grpo_hpc.train.rollout.types import RolloutBatch

MakeEngine = Callable[[torch.nn.Module, Callable[[], bool], Callable[[], None]], Any]
"""Builds a rollout engine on a model with an abort test and a tick of its own, called
beside the trainer's heartbeat (the trainer's engine options)."""

JOIN_POLL_S = 2.0
"""Seconds between the main thread's looks at the decode thread's progress while it waits
for its batches (as often as a split run's trainer reads its generator's pulse)."""


class RolloutPipeline:
    """The trainer's rollouts: :meth:`collect` at each step, :meth:`settle` after its
    update, :meth:`state_dict` / :meth:`load_state_dict` in checkpoints."""

    def __init__(
        self,
        collector: Collector,
        policy: torch.nn.Module,
        make_engine: MakeEngine,
        stop_requested: Callable[[], bool],
        autocast: Callable[[], Any],
        shadow: torch.nn.Module | None = None,
        fault: Callable[[int], None] | None = None,
    ) -> None:
        """``collector``: the trainer's (its engine on the policy); ``policy``: the
        unwrapped model; ``stop_requested``: a stop signal arrived (cuts a batch generated
        on the main thread, never one generated ahead); ``shadow``: the copy that
        generates (:func:`plain_copy` of the policy before FSDP2 sharded it; None: a copy
        of ``policy`` taken here, which must then be plain); ``fault``: test-only, called
        with each batch's step before the thread generates it
        (``faults.stuck_generation``)."""
        cfg = collector.cfg
        self.collector, self.k = collector, cfg.algo.max_staleness
        self.pending: dict[int, Entry] = {}
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.last: Made | None = None
        """The batch the current step trains."""
        self.last_report: RoundReport | None = None
        """Its round's report (partial rollouts)."""
        self.pool: PartialPool | None = None
        """The groups in flight (``rollout.partial_pool``)."""
        self.waited_s = 0.0
        self.sync_s = 0.0
        """Seconds spent putting the current weights where they generate, this step."""
        self.depth: int | None = None
        """Steps generated ahead (None: the bound's; 0 once :meth:`go_synchronous`)."""
        self.group = cfg.rollout.steps_per_generation
        """Steps' batches a rollout makes (>= 2: :meth:`_collect_grouped`, no thread)."""
        if not self.k:
            return
        problem = async_ranks_problem(cfg, collector.info.world_size)
        if problem:
            raise ConfigError(problem)
        self.policy, self.autocast = policy, autocast
        self.scoring = Scoring(cfg.logp_temperature, cfg.algo.fp32_lm_head)
        if self.group > 1:  # the policy's own engine generates: no copy, no thread
            return
        self.shadow = shadow if shadow is not None else plain_copy(policy)
        self.fault = fault
        self.side = SideStream(next(policy.parameters()).device, cfg.rollout.decode_priority)
        self.on_main = False
        self.work = Progress()
        """The decode thread's progress: advanced at each of the shadow engine's ticks and
        each batch made; the main thread judges it while it waits (:meth:`_join`)."""
        self.jobs: list[Made] = []
        """The batches the decode thread was given last."""
        self.work.start()
        abort = lambda: self.on_main and stop_requested()  # noqa: E731
        engine = make_engine(self.shadow, abort, self.work.bump)
        self.now = dataclasses.replace(collector, engine=engine)
        self.ahead = dataclasses.replace(collector, engine=engine, ahead=True)
        if cfg.rollout.partial_pool:  # the pool itself starts at the first collect
            for_partial(engine, cfg, collector.per_rank)

    # ------------------------------------------------------------------ the step
    def collect(self, step: int, lineage: int, seed: int) -> Collected:
        """The batch step ``step`` trains; with ``k >= 1`` also starts generating ahead.
        ``lineage``: rollbacks so far; ``seed``: the sampling seed in use."""
        if not self.k:
            self.last = Made(step, step, lineage)
            return self.collector.collect()
        if self.group > 1:
            return self._collect_grouped(step, lineage, seed)
        self._start_pool(step)
        self.settle()
        made = [e.made for e in self.pending.values()]
        end = self.collector.cfg.training.max_steps
        decision = plan(step, self.k, lineage, made, end, self.ahead_depth(step))
        for s in decision.drop:
            del self.pending[s]
        t = time.monotonic()
        self._copy_weights()
        self.sync_s += time.monotonic() - t
        if decision.now:
            self.on_main = True  # a stop cuts it: the trainer restores the step's start
            try:
                entry = self._generate(self.now, Made(step, step, lineage), seed)
            finally:
                self.on_main = False
        else:
            entry = self.pending.pop(step)
        self.last, self.last_report = entry.made, entry.report
        if decision.ahead:
            jobs = [Made(s, step, lineage) for s in decision.ahead]
            self.jobs = jobs
            self.side.ready()  # the thread's stream starts after the copy (and this step's batch)
            self.thread = threading.Thread(
                target=self._run_ahead, args=(jobs, seed), name="grpo-rollout-ahead", daemon=True
            )
            self.thread.start()
        return entry.collected

    def _collect_grouped(self, step: int, lineage: int, seed: int) -> Collected:
        """``rollout.steps_per_generation``: the step's batch made by an earlier rollout,
        or a rollout now, by the current weights, of this step's batch and the next ones'
        (:func:`schedule.grouped_plan`), from the rollout stream of (``seed``, step)."""
        made = [e.made for e in self.pending.values()]
        end = self.collector.cfg.training.max_steps
        decision = grouped_plan(step, self.k, self.group, lineage, made, end, self._depth(step))
        for s in decision.drop:
            del self.pending[s]
        if decision.now:
            steps = [step, *decision.ahead]
            torch.manual_seed(rollout_seed(seed, step, self.collector.info.rank))
            got = self.collector.collect_steps(len(steps))
            rows = self.collector.cfg.algo.micro_batch_size
            for s, collected in zip(steps, got, strict=True):
                with_behaviour(collected, self.policy, rows, self.autocast, self.scoring)
                self.pending[s] = Entry(Made(s, step, lineage), collected)
        entry = self.pending.pop(step)
        self.last, self.last_report = entry.made, None
        return entry.collected

    def ahead_depth(self, step: int) -> int | None:
        """``schedule.plan``'s ``depth`` at ``step``: 0 once synchronous or while the run's
        first steps are (``algo.synchronous_steps``), 1 with partial rollouts (the rest of
        the bound goes to continued answers), else the bound's (None)."""
        depth = self._depth(step)
        if depth is not None:
            return depth
        return 1 if self.pool else None

    def _start_pool(self, step: int) -> None:
        """Partial rollouts (``rollout.partial_pool``): the pool of answers in flight, made
        empty at the first step past the run's synchronous first steps, as at a run's first
        step (none after :meth:`go_synchronous`; a resumed run's comes from its checkpoint,
        :meth:`load_state_dict`)."""
        if self.collector.cfg.rollout.partial_pool and self.k and self.pool is None:
            if self._depth(step) is None:
                self.pool = self._new_pool()

    def _new_pool(self) -> PartialPool:
        return PartialPool(self.collector.cfg.rollout.partial_pool, self.k)

    def _depth(self, step: int) -> int | None:
        """0 once synchronous (:meth:`go_synchronous`) or while ``step`` is one of the
        run's synchronous first steps (:func:`schedule.warming`); else None. Derived from
        the step, so a resumed run decides as the uninterrupted one did."""
        if self.depth is not None:
            return self.depth
        return 0 if warming(step, self.collector.cfg.algo.synchronous_steps) else None

    def go_synchronous(self) -> None:
        """From the next step on, every batch generated by the current weights and nothing
        ahead (a collapse rollback's remedy, ``training.rollback_synchronous``); the
        schedule drops what was made ahead. Partial rollouts end too: the answers in flight
        are dropped (begun by weights the rollback left; a rollback restarted them anyway)
        and each step's batch is a synchronous step's, drawn whole. Nothing to do in a
        synchronous run."""
        if self.k:
            self.pool = None
            self.depth = 0

    def settle(self) -> None:
        """Wait for the batches being generated ahead; raise what failed there."""
        if self.thread is not None:
            t = time.monotonic()
            self._join()
            self.waited_s += time.monotonic() - t
            self.thread = None
            self.side.hand_over(list(self.pending.values()))
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    @property
    def staleness(self) -> int | None:
        """Updates between the last step's batch's weights and its own (None: synchronous)."""
        return self.last.step - self.last.version if self.k and self.last else None

    def metrics(self, samples: int) -> dict[str, float]:
        """The step's staleness histogram (``samples`` trained on this rank), the seconds
        the step waited for the generator after its update and the seconds the weights took
        to reach it (``time/weight_sync``: under FSDP2 the gather; asynchronous runs only). Every
        rank trains as many samples at the same staleness (one schedule, whole groups per
        rank), so the run's count is this rank's times the ranks, with no collective."""
        if not self.k or self.last is None:
            return {}
        waited, self.waited_s = self.waited_s, 0.0
        sync, self.sync_s = self.sync_s, 0.0
        stale, ranks = self.last.step - self.last.version, self.collector.info.world_size
        times = {"time/wait_rollouts": waited, "time/weight_sync": sync}
        if self.last_report is not None:
            return self._partial_metrics(samples) | times
        return staleness_metrics(stale, samples * ranks, self.k) | times

    def _partial_metrics(self, samples: int) -> dict[str, float]:
        """Partial rollouts: each rank's groups are of their own ages, so the histogram and
        the pool's counts are summed over the ranks (every rank reports each step)."""
        assert self.last is not None and self.last_report is not None
        report, info = self.last_report, self.collector.info
        stale = [self.last.step - v for v in report.versions]
        per_group = samples // max(1, len(stale))
        row = staleness_histogram(stale, per_group, self.k)
        row |= {
            "partial/continued_rows": float(report.continued),
            "partial/dropped_groups": float(report.dropped),
            "partial/pool_groups": float(report.pool),
            "partial/decoded_rows": float(report.decoded_rows),
        }
        if info.world_size > 1:
            top = row.pop("staleness/max")
            keys = sorted(row)
            row = dict(zip(keys, dist.all_reduce_sum([row[k] for k in keys], info), strict=True))
            row["staleness/max"] = dist.all_reduce_max(top, info)
        return row

    def set_max_new_tokens(self, cap: int) -> None:
        """Rollouts of up to ``cap`` new tokens from now on (a rollback's grown cap), from
        the policy's engine and the shadow's alike."""
        self.collector.engine.set_max_new_tokens(cap)
        if self.k and self.group == 1:  # a grouped run has no shadow: the policy's engine
            self.now.engine.set_max_new_tokens(cap)

    def close(self) -> None:
        """The trainer is done (nothing to do here: the thread was joined at each step)."""

    def _join(self) -> None:
        """Wait for the decode thread, judging its progress meanwhile: a thread alive but
        stuck (a hung kernel, a reward that never returns) beats no heartbeat, and nothing
        else in this process would end the wait; after ``rollout.progress_timeout_s`` of
        it without a tick, the run ends as STALLED (exit 4), naming the thread and what
        the step waited for."""
        assert self.thread is not None
        limit = self.collector.cfg.rollout.progress_timeout_s
        since = time.monotonic()
        seen, seen_at = self.work.value, since
        while self.thread.is_alive():
            self.thread.join(timeout=JOIN_POLL_S if limit > 0 else None)
            now = time.monotonic()
            if self.work.value != seen:
                seen, seen_at = self.work.value, now
            idle = stuck_for(seen, seen_at, since, now, limit)
            if idle is not None and self.thread.is_alive():
                raise StalledError(self._stuck_reason(idle))

    def _stuck_reason(self, idle_s: float) -> str:
        """progress.json's line for a decode thread that made no progress (:meth:`_join`)."""
        rank = self.collector.info.rank
        missing = [m.step for m in self.jobs if m.step not in self.pending]
        what = f"step {missing[0] + 1}'s rollouts" if missing else "the rollouts ahead"
        name = f"the decode thread (rank {rank} on {HOST})"
        return stuck_reason(name, idle_s, f"rank {rank}'s training", what)

    # ------------------------------------------------------------------ generation
    def _copy_weights(self) -> None:
        """The policy's full weights into the shadow. Under FSDP2 each tensor is gathered
        (a collective: here, on the main thread, at the same point of the step on every
        rank) straight into the shadow's own tensor (:mod:`gather`: no second full copy)."""
        copy_full_weights(self.policy, self.shadow)

    def _run_ahead(self, jobs: list[Made], seed: int) -> None:
        try:
            with self.side.inside():
                for made in jobs:
                    if self.fault is not None:
                        self.fault(made.step)
                    self.pending[made.step] = self._generate(self.ahead, made, seed)
                    self.work.bump()
        except BaseException as e:  # handed to the main thread by settle()
            self.error = e

    def _generate(self, collector: Collector, made: Made, seed: int) -> Entry:
        if self.pool is None:
            return generate(collector, made, seed, self.shadow, self.autocast, self.scoring)
        pool, device = self.pool, next(self.policy.parameters()).device

        def round_(behaviour: Behaviour) -> tuple[Collected, RoundReport]:
            return pool.make(collector, made.step, made.version, made.lineage, behaviour, device)

        shadow, autocast, scoring = self.shadow, self.autocast, self.scoring
        return partial_round(collector, made, seed, round_, shadow, autocast, scoring)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """This rank's batches generated and not trained, as plain values (waits for the
        ones in flight first); empty for a synchronous run. Kept per rank (each generated
        from its own share of the prompts), beside its RNG state."""
        self.settle()
        if not self.k:
            return {}
        pending = [
            {"made": dataclasses.asdict(e.made), "collected": dataclasses.asdict(e.collected)}
            | ({"report": dataclasses.asdict(e.report)} if e.report else {})
            for _, e in sorted(self.pending.items())
        ]
        pool = {"partial_pool": self.pool.state_dict()} if self.pool is not None else {}
        return {"rollouts_pending": pending} | pool

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """What :meth:`state_dict` returned (None or without it: a checkpoint of a
        synchronous run, or of another world size, whose shares differ: nothing pending)."""
        self.pending = {}
        for item in (state or {}).get("rollouts_pending", []):
            report = RoundReport(**item["report"]) if "report" in item else None
            entry = Entry(Made(**item["made"]), _collected(item["collected"]), report)
            self.pending[entry.made.step] = entry
        saved = (state or {}).get("partial_pool")
        if saved is not None and self.depth is None:  # past the synchronous first steps
            self.pool = self._new_pool()
            self.pool.load_state_dict(saved)


def _collected(d: dict[str, Any]) -> Collected:
    """A :class:`Collected` back from ``dataclasses.asdict``."""
    scored = [Scored(**(s | {"batch": RolloutBatch(**s["batch"])})) for s in d["scored"]]
    return Collected(**(d | {"scored": scored}))
