"""The ``training:`` section of the run configuration (:mod:`grpo_hpc.config.schema`): the
step budget, checkpoints, evaluation and keep-best, and what the trainer does when a run
stops learning or solves its task. Apart from the rest of the tree for its size only."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_hpc.config.choice import one_of


@dataclass
class TrainingConfig:
    max_steps: int = 20
    """Optimizer steps in the whole run."""
    seed: int = 0
    """Seed for data order, sampling and initialisation."""
    save_every_steps: int = 5
    """Checkpoint every N steps (0 disables)."""
    save_every_seconds: float = 0.0
    """Also checkpoint when this many seconds passed since the last save (0 disables)."""
    keep_last: int = 2
    """Complete checkpoints kept."""
    save_final: bool = True
    """Save (and verify) a checkpoint at the last step. False only for benchmarks that time
    steps (bench/): a 7B full-parameter checkpoint is ~90 GB, more than a GPU machine's
    scratch disk may hold; such a run ends with nothing to resume from or to use."""
    export_final: bool = True
    """After the final checkpoint verifies, rank 0 writes the model as a Hugging Face
    directory to ``logs/<run>/final/`` (grpo_hpc.export.run: safetensors, config, tokenizer,
    in the run's compute dtype; a LoRA run's merged model). Needs ``save_final``: a run
    that saves no final checkpoint (benchmarks) has nothing to export and writes no
    ``final/``. A failed export warns and leaves the run finished; ``grpo-export RUN``
    writes it later."""
    eval_every: int = 0
    """Greedy evaluation every N steps (0 disables) on the validation problems
    (``data.num_val``), and at step 0. One not significantly below the peak score so far
    (the newest such is the model to hand over) saves a checkpoint of its step, kept by
    retention and named in ``logs/<run>/best.json`` (keep-best)."""
    select_metric: str = one_of("auto", ("auto", "accuracy", "accuracy_strict", "pass@1"))
    """What keep-best compares: ``accuracy`` (math, the run's correctness judge),
    ``accuracy_strict`` (an answer line required), ``pass@1`` (code), or ``auto``
    (accuracy for math problems, pass@1 for code). Higher is better; never the reward."""
    final: str = one_of("best", ("best", "last"))
    """What ``final/`` holds when the run finishes: ``best`` (keep-best's model to hand
    over: the newest evaluation within noise of the peak, or the start when it beat every
    later evaluation; the last step's model beside it in ``last/``) or ``last``. Without an
    evaluation (``eval_every=0``, ``data.num_val=0``), ``final/`` is the last step's."""
    eval_samples: int = 1
    """Code problems: completions per held-out problem. 1 judges the greedy one (pass@1);
    n > 1 samples n at rollout.temperature and reports the unbiased pass@1 and pass@k,
    from a random stream of the seed and the step (the training's is left as it was)."""
    log_samples: int = 2
    """Completions of each step written to ``samples.jsonl`` (the question, the text, its
    reward and length; one per group, the first groups first; 0 disables): what the
    policy writes, for a reward that rises while held-out accuracy falls."""
    zero_reward_patience: int = 0
    """Circuit breaker: stop after N consecutive steps with zero mean reward (0 disables)."""
    cut_off_patience: int = 10
    """Collapse signal ``all_cut`` (formerly a circuit breaker of its own): N consecutive
    steps in which every completion was cut off at ``rollout.max_new_tokens`` under
    ``algo.mask_truncated``, so none trained (0 disables); acted on as ``on_collapse``
    says (``stop``: exit 3, checkpoint saved, as before). In the masked two-term
    benchmark's 85 runs, those that ended above 0.5 accuracy had at most 6 such steps in
    a row, and every run with 10 or more ended below it."""
    on_collapse: str = one_of("rollback", ("flag", "stop", "rollback"))
    """What a detected collapse does (docs/ALGORITHM.md, "When a run stops learning"):
    ``flag`` (an event in events.jsonl, a COLLAPSE flag in grpo-status, a line on its
    plot; training goes on), ``stop`` (also: checkpoint saved, ``final/`` written as at a
    finish, the best model by ``training.final``; exit 3, never resubmitted) or
    ``rollback`` (back to the best checkpoint, or the start, with a new sampling seed, at
    most ``collapse_retries`` times, then stop). ``rollback`` by default: on the learning
    benchmark's stalling settings (20 new seeds) the model handed over scored 0.75 on
    average with 2 of 20 below 0.5 (2026-12-04, learning_2term_mask_trapskip48_h200_2026-12-04
    in bench/results; TRL 0.46-0.48 and 9 of 20 on earlier seeds); on other seeds ``stop``
    handed over 0.49, 9 of 20 (2026-11-28, learning_2term_mask_handed.json)."""
    on_solved: str = one_of("finish", ("finish", "flag"))
    """What a solved task does: ``collapse_patience`` of the last ``collapse_window`` steps
    had every group answer correctly in every completion (full reward, so no variance and
    no gradient: nothing left to learn from these problems). ``finish``: a ``solved`` event,
    the checkpoint saved, ``final/`` written as at the last step (the best model by
    ``training.final``), the run FINISHED (exit 0) at that step; ``flag``: the event only,
    training goes on. Never a collapse: a solved run is not rolled back. Harder problems
    (or ``rollout.dynamic_sampling``, which draws fresh groups for flat ones) give such a
    model something to learn."""
    collapse_retries: int = 2
    """``on_collapse=rollback``: rollbacks allowed over the run's life (then it stops)."""
    rollback_cap_growth: float = 2.0
    """``on_collapse=rollback``: a rollback for a collapse at the length cap (``all_cut``,
    ``pinned``, or ``no_signal`` with most completions cut: they ran into
    ``rollout.max_new_tokens`` and, masked, taught nothing) multiplies the rollouts' cap
    by this, at most to ``rollback_cap_max``, when the memory estimate says it fits the
    GPU; evaluations keep the configured cap, so scores stay comparable (1 disables). Such
    a rollback also skips a peak saved at the cap (back to the start instead: docs/
    ALGORITHM.md, "A collapse at the cap")."""
    rollback_cap_max: int = 0
    """The largest rollout cap a rollback may raise to (0: twice ``rollout.max_new_tokens``)."""
    rollback_synchronous: bool = True
    """``on_collapse=rollback`` in an asynchronous run (``algo.max_staleness`` >= 1, the
    thread or split placement): the run trains synchronously from its first rollback on
    (every batch generated by the current weights, staleness 0; partial rollouts drop
    their pool of answers in flight). On the learning benchmark one update of staleness
    left 10 of 20 seeds trapped where the synchronous step left 4 (docs/async.md, "What
    staleness costs in learning"): the retry is given the step that escaped more often, at
    the synchronous step's speed. False: the run stays asynchronous."""
    collapse_window: int = 10
    """Collapse signals ``no_signal``, ``pinned`` and ``entropy`` look back this many steps."""
    collapse_patience: int = 8
    """``no_signal``: steps of the last ``collapse_window`` that trained nothing (zero
    gradient: every completion cut and masked, or no group with reward variance) for a
    collapse (0 disables). 8 of 10 caught 49 of the recorded seeds' collapses, most at
    step 10, and alarmed on 6 of the 154 that ended healthy, which stalled as long and
    then recovered (bench/results/collapse_replay_2026-11-28.json)."""
    num_threads: int = 0
    """torch intra-op threads per process on CPU (0 = torch default)."""
    setup_heartbeat_s: float = 30.0
    """While the trainer loads (state ``loading``: the model read, wrapped, the engine
    built, a checkpoint resumed), rank 0 writes progress.json's heartbeat from a thread every
    this many seconds (> 0), until the first evaluation or step starts generating. It shows
    the process alive during a load that takes minutes; the monitor judges a load by
    ``step0_timeout`` only, never by the heartbeat (grpo_hpc.monitor.decision.stall_limits)."""
    profile_steps: int = 0
    """Run this many steps under ``torch.profiler`` on every rank, from step
    ``profile_from``; each rank writes a Chrome trace and its costliest operators to
    ``torch_profile/`` (grpo_hpc/train/measure/profiling.py). 0: no profiling."""
    profile_from: int = 3
    """The first profiled step (1-based; after warm-up, which compiles and captures)."""
    stall_sample_ms: int = 0
    """Sample the main thread's stack every N ms while a phase of the step (generate,
    score, vote, update, report, save) runs 0.15 s past its median over the earlier steps;
    each rank writes the stacks seen to ``torch_profile/stalls-rank<R>.txt``
    (grpo_hpc/train/measure/stall_sampler.py). For a slow step the profiler would hide. 0: off."""
    gc_every_steps: int = 1
    """Python's garbage collector on a schedule: automatic collection off while training,
    the young generations collected at the start of every N-th step on every rank, and a
    full collection at the start of every 100th step (grpo_hpc/train/supervision/gc_schedule.py). An
    automatic full collection pauses one rank at a moment no other rank shares, and its
    peers wait for it at the next collective: an unsteady step. 0: Python's automatic
    collection. Either way ``time/gc`` logs the slowest rank's seconds in the collector."""
