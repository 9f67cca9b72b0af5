"""The ``rollout:`` section of the run configuration (:mod:`grpo_hpc.config.schema`): the
engine, the sampling, the prompts and completions a step, and where an asynchronous run
generates. Apart from the rest of the tree for its size only."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_hpc.config.choice import one_of


@dataclass
class RolloutConfig:
    engine: str = one_of("auto", ("auto", "native", "hf"))
    """Rollout engine: ``native`` (this package's static-cache, CUDA-graph decoder for
    Llama/Qwen2/Mistral-style models), ``hf`` (transformers ``generate``: any model, LoRA)
    or ``auto`` (native on CUDA where supported, else hf)."""
    prompts_per_step: int = 4
    """Prompts per optimizer step (global, across all ranks)."""
    num_generations: int = 8
    """Completions per prompt (the group size G)."""
    temperature: float = 0.9
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    max_new_tokens: int = 48
    """Generation length cap."""
    generation_timeout_s: float = 600.0
    """Time budget for one step's generation; exceeding it fails the run as STALLED."""
    progress_timeout_s: float = 600.0
    """Asynchronous runs: how long the generation a trainer waits for may make no progress
    before the job ends as STALLED (exit 4, resubmitted from the last checkpoint): a
    generator process (``placement=split``) or decode thread (``placement=thread``) that
    is alive but stuck (a hung kernel or collective, a deadlock, a reward that never
    returns). Progress is counted at every engine tick (a token, or a native decode
    chunk), request, weight transfer and batch, so the longest silence of a healthy
    generator is a first compile or a batch's reward scoring: the same silences the
    monitor's ``heartbeat_timeout`` (600 s) already allows a synchronous trainer, whose
    heartbeat the same ticks beat. Under ``split`` the generator's progress travels in its
    pulse, so ``dist.peer_timeout_s=0`` turns this off too. 0: off."""
    release_engine_memory: bool = False
    """Native engine: free its packed copy of the weights, its KV caches and its CUDA graphs
    before each update, and rebuild them at the next rollout (the graphs are captured
    again). For models whose update does not fit beside the engine; grpo-submit turns it
    on when the memory estimate needs it."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups with all-equal rewards and draw more prompts."""
    max_resample_rounds: int = 2
    """Dynamic sampling: extra generation rounds per step at most."""
    enforce_eager: bool = False
    """Native engine: decode without CUDA graphs and without torch.compile (several times
    slower). To tell a fault of graph capture or of the compiler from one of the math."""
    stream_scoring: bool = True
    """Native engine: score a completion as soon as it finishes, while the rollout's other
    rows still decode (math-verify and the code sandbox, on a thread; custom rewards still
    after generation). The rewards are the same (train/rewards/streaming.py); only the wait
    is shorter. False: score everything after generation."""
    seed_per_group: bool = False
    """Sample each prompt group from its own random stream, seeded by the run's seed, the
    group's place in the data order and the resample round (not by the rank that holds
    it), one group per generate call: the completions are then the same on any number of
    ranks, so a run resumed on fewer nodes (the profile's ``nodes_wait_s``) or more
    continues as the uninterrupted run would have, within fp32 rounding
    (docs/scaling.md). Costs batching: each group decodes alone."""
    placement: str = one_of("thread", ("thread", "split"))
    """Where an asynchronous run (``algo.max_staleness`` >= 1) generates: ``thread``, a
    thread inside each training process, on a copy of the weights; ``split``, processes of
    their own under the same torchrun (the last ``generators`` ranks; the others train),
    which trainer rank 0 sends the weights after each update and which send the batches
    back (docs/async.md). This release runs split as ``generators`` generator processes and
    at least as many DDP or FSDP2 trainer processes (nodes x ``dist.nproc_per_node`` =
    trainers + generators; ranks numbered node by node: the generators are the last node's
    last processes), on one node or several."""
    generators: int = 1
    """``placement=split``: how many of the job's ranks generate (the last ``G``; the others
    train), 1 to the trainers' count. Trainer ``r`` is served by generator ``r % G``, each
    generator making its trainers' batches, so a step's rollouts come back about ``G``
    times sooner where decoding, not the update, bounds the step; every generator gets the
    weights in the one broadcast from trainer rank 0 (docs/async.md)."""
    decode_priority: str = one_of("normal", ("normal", "high"))
    """Thread placement on a GPU (``algo.max_staleness`` >= 1): the CUDA priority of the
    stream the generator thread decodes on. ``high``: CUDA's highest, so that the decode's
    small kernels take the multiprocessors ahead of the update's queued blocks as they free
    up (the decode waits on each token; the update on the whole batch). ``normal``: the
    same priority as the update's stream. On one H200 the decode slowed by about the
    update's length while both ran, and ``high`` did not win it back on an H100 (18.44 s
    a step against 18.45: bench/results/LOG-speed.md, 2026-12-05). No effect on a CPU or
    in a split placement (its generators have a GPU of their own)."""
    partial_pool: int = 0
    """Asynchronous runs (``algo.max_staleness`` >= 2): partial rollouts. 0: off, each
    step's batch is generated whole and waits for its longest answer. ``P`` >= 2: the
    generator (a thread, or under ``placement=split`` a generator process advancing the
    pool its trainer keeps) decodes the prompts of ``P`` steps at once; a round
    stops as soon as a step's worth of groups is complete, and the answers still running
    are continued in the next round by the next weights (each token keeps the log-prob of
    the weights that sampled it, which the importance weights read; a group is as stale as
    its first token). A group that would otherwise exceed ``algo.max_staleness`` is
    finished in its round. ``P`` <= ``algo.max_staleness``: a group drawn with the pool
    full may wait behind ``P - 1`` steps' older groups. Costs ``P`` times the rows in the
    generator's KV cache, which also holds a continued answer's tokens as its prompt; every
    group then trains about ``P`` updates stale, with a long tail or not (answers that all
    end within a round still wait a round in the pool): for long tails (docs/async.md)."""
    steps_per_generation: int = 1
    """``M`` >= 2: one rollout generates ``M`` steps' batches with the current weights (as
    TRL's ``steps_per_generation``), each trained at its own step, the ``j``-th ``j``
    updates stale (needs ``algo.max_staleness`` >= ``M - 1``; the importance weights
    correct it). On one GPU a step waits for its longest answer; decoding ``M`` steps'
    rows at once pays that wait once for ``M`` steps, with no generator thread, no copy
    of the weights and a KV cache of ``M`` steps' rows (partial rollouts' holds twice the
    cap). The policy's engine generates on the main thread; no stream scoring. 1: a
    rollout a step (docs/async.md)."""
    judge_running: bool = True
    """With ``stream_scoring``: also judge the answer a row still decoding has written,
    each time it completes a line, so that rows which end with the rollout (those at the
    length cap, the last to finish) find their math-verify verdict ready. A guess the
    final text does not need costs the math-verify worker only."""
