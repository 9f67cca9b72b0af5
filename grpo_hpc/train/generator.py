"""A generator process of a ``rollout.placement=split`` run (docs/async.md): it holds a
copy of the policy and its engine, and nothing a restart cannot rebuild. It serves the
trainers ``config.roles.trainers_of`` names (trainer ``r`` by generator ``r % G``). Its
weights are trainer 0's, broadcast to every generator before each step's batches; its
random stream is the step's and the trainer's (``schedule.rollout_seed``); its prompts are
the ones each trainer drew (with partial rollouts, the pool each trainer keeps and sends:
one round of it is advanced per request and sent back with the batch). It makes the
batches its trainers name, in order, and sends each back; it never starts one on its own.
The trainers' side, and the messages, are :mod:`grpo_hpc.train.rollout.split`.

A stop signal (Slurm's preemption) is the trainers' to answer: the generator finishes the
batch in flight, the trainers save the batches they received and its first trainer tells
it to stop. If a trainer is gone, the next message fails and the process exits (or
torchrun ends it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo_hpc.train.algo import packing
from grpo_hpc.train.algo.logp_head import Scoring
from grpo_hpc.train.algo.optimization import autocast_factory
from grpo_hpc.train.distributed.dist import DistInfo
from grpo_hpc.train.rewards import functions as rewards
from grpo_hpc.train.rollout import engines as rollout
from grpo_hpc.train.rollout.collect import Collected, Collector
from grpo_hpc.train.rollout.making import (
    Behaviour,
    Entry,
    for_partial,
    generate,
    partial_round,
)
from grpo_hpc.train.rollout.partial import PartialPool, RoundReport
from grpo_hpc.train.rollout.progress import Progress
from grpo_hpc.train.rollout.split import (
    Hello,
    Job,
    Link,
    Request,
    broadcast_weights,
    recv_obj,
    send_obj,
)
from grpo_hpc.train.setup import models
from grpo_hpc.train.supervision import faults


@dataclass
class Replay:
    """The sampler a generator's collector draws from: the prompts a trainer drew (the
    collector's ``train_set`` is set to them for each batch), at the place in the data
    order the trainer drew them from."""

    position: int = 0
    """Where the trainer drew this batch's prompts (``Collector._draw``)."""
    epoch: int = 0
    n: int = 0

    def take(self, k: int) -> list[int]:
        return list(range(k))


def build(
    hello: Hello, device: torch.device, run_dir: Path, progress: Progress | None = None
) -> tuple[Collector, torch.nn.Module, Scoring, object]:
    """The collector, model, scoring and autocast of the thread placement's shadow, built
    from what trainer 0 said: the same model preparation, engine options and rewards. The
    weights on disk are found on this process's node, as a DDP rank of another node finds
    them (``models.materialize``: the run directory's tiny model, the node's own cache
    of a converted model), not at the path trainer 0 used, which a node-local cache
    would not have here. ``progress``: advanced at each of the engine's ticks (a token, a
    decode chunk), what the trainers judge this generator's work by."""
    cfg = hello.cfg
    if cfg.training.num_threads:
        torch.set_num_threads(cfg.training.num_threads)
    model_dir = models.materialize(cfg.model, run_dir, cfg.training.seed)
    model, tok = models.load_model_and_tokenizer(
        model_dir, cfg.model.attn_implementation, device, dtype=hello.load_dtype
    )
    if cfg.algo.packing:  # the trainer packs before it copies the shadow
        packing.use_packed_attention(model)
    model = models.prepare_policy(model, cfg.model, device, bool(cfg.dist.compile))
    model = model.eval().requires_grad_(False)
    if tuple(model.state_dict()) != hello.names:
        raise RuntimeError("the generator's model has other weights than the trainer's")
    on_gpu = device.type == "cuda"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.dist.precision)
    autocast = autocast_factory("cuda", dtype if on_gpu else None)
    # a plain model generating alone: never in step with FSDP2 trainers' generate
    options = dataclasses.replace(hello.options, synced=False)
    engine = rollout.build_engine(
        cfg.rollout.engine, model, tok, options,
        tick=progress.bump if progress is not None else lambda: None,
        abort=lambda: False, autocast=autocast,
    )  # fmt: skip
    custom = {spec: rewards.load_custom_reward(spec) for spec in cfg.reward.custom}
    info = DistInfo(0, 1, 0, device)  # serve() makes one per trainer: its rank, its share
    collector = Collector(cfg, info, tok, [], Replay(), custom, None, engine, ahead=True)
    scoring = Scoring(cfg.logp_temperature, cfg.algo.fp32_lm_head)
    return collector, model, scoring, autocast


def serve(link: Link, run_dir: Path, progress: Progress | None = None) -> int:
    """Generate what this generator's trainers ask until the first of them says stop; the
    exit code (0). Each step each of its trainers sends its request (its share of the
    prompts), taken in rank order, then trainer 0 broadcasts the weights to every
    generator; this one makes each named batch for each of its trainers in turn, with that
    trainer's rank naming its random stream, as the thread placement's ranks do.

    ``progress`` (written in this process's pulse): started once the engine is built, then
    advanced at every request, weight transfer, engine tick and batch sent, so that a
    trainer waiting on this generator can tell a stuck one from a slow one
    (``rollout.progress_timeout_s``)."""
    work = progress if progress is not None else Progress()
    hello: Hello = recv_obj(0, link.device)  # from trainer 0, whichever trainers it serves
    collector, model, scoring, autocast = build(hello, link.device, run_dir, work)
    work.start()
    trainers, served = link.role.trainers, link.peers
    shares = [
        dataclasses.replace(collector, info=DistInfo(r, trainers, 0, link.device)) for r in served
    ]
    if hello.cfg.rollout.partial_pool:  # each trainer's pool in turn, of its share's rows
        for_partial(collector.engine, hello.cfg, shares[0].per_rank)
    replay = collector.sampler
    cap = hello.options.max_new_tokens
    while True:
        first: Request = recv_obj(served[0], link.device)
        if first.stop:
            return 0
        work.bump()
        requests = [first] + [recv_obj(r, link.device) for r in served[1:]]
        work.bump()
        if first.weights:  # every generator alike (their trainers follow one plan): one group
            broadcast_weights(model, link)
        work.bump()
        if first.cap != cap:  # a rollback grew the cap
            collector.engine.set_max_new_tokens(first.cap)
            cap = first.cap
        for j in range(len(first.jobs)):
            for r, share, req in zip(served, shares, requests, strict=True):
                job = req.jobs[j]
                faults.stuck_generation(hello.cfg.faults, job.made.step)  # test-only
                if job.pool is not None:
                    entry = advance(share, job, req.seed, model, scoring, autocast, link.device)
                else:
                    # at the trainer's place in the step's prompts (Collector._take's slice)
                    share.train_set = [{}] * (r * share.per_rank) + job.problems
                    replay.position = job.draw
                    entry = generate(share, job.made, req.seed, model, autocast, scoring)
                send_obj(entry, r, link.device)
                work.bump()


def advance(
    share: Collector,
    job: Job,
    seed: int,
    model: torch.nn.Module,
    scoring: Scoring,
    autocast: Callable[[], Any],
    device: torch.device,
) -> Entry:
    """Partial rollouts: one round over the pool the trainer prepared (``job.pool``, topped
    up from its sampler), with the thread placement's code; the batch and the pool as the
    round left it go back to the trainer, which keeps the pool."""
    cfg = share.cfg
    pool = PartialPool(cfg.rollout.partial_pool, cfg.algo.max_staleness)
    pool.load_state_dict(job.pool)
    # the flights' problems by their index in the trainer's training set
    share.train_set = dict(zip((f.index for f in pool.flights), job.problems, strict=True))
    made = job.made

    def round_(behaviour: Behaviour) -> tuple[Collected, RoundReport]:
        return pool.advance(share, made.step, made.version, behaviour, device)

    entry = partial_round(share, made, seed, round_, model, autocast, scoring)
    entry.pool = pool.state_dict()
    return entry
