"""Checks across the run configuration's fields, and of ranges and choices that
OmegaConf's types cannot express (the schema is :mod:`grpo_hpc.config.schema`, which names
a key's allowed words beside it). Each failure is one :class:`ConfigError` line that says
what is wrong and what to write."""

from __future__ import annotations

from grpo_hpc.config.choice import choices
from grpo_hpc.config.schema import Config, FaultsConfig
from grpo_hpc.core.errors import ConfigError

CHOICES: dict[str, tuple[str, ...]] = choices(Config)
"""``section.key`` -> its allowed values, as the schema writes them beside each key."""

DATA_COUNTS: dict[str, str] = {
    "num_train": "0 = all of a file's rows",
    "num_eval": "0 = no test problems",
    "num_val": "0 = no validation split",
}
"""The problem counts of ``data``, each with what its 0 means."""


def validate(cfg: Config) -> None:
    """Cross-field and range checks OmegaConf's types cannot express."""
    for dotted, allowed in CHOICES.items():
        section, name = dotted.split(".")
        value = getattr(getattr(cfg, section), name)
        if value not in allowed:
            raise ConfigError(f"{dotted}={value!r} is not one of {', '.join(allowed)}")
    positive = {
        "training.max_steps": cfg.training.max_steps,
        "rollout.prompts_per_step": cfg.rollout.prompts_per_step,
        "rollout.max_new_tokens": cfg.rollout.max_new_tokens,
        "algo.updates_per_batch": cfg.algo.updates_per_batch,
        "algo.micro_batch_size": cfg.algo.micro_batch_size,
        "dist.nproc_per_node": cfg.dist.nproc_per_node,
        "model.checkpoint_every": cfg.model.checkpoint_every,
        "training.eval_samples": cfg.training.eval_samples,
    }
    for key, value in (("dist.compile", cfg.dist.compile), ("algo.packing", cfg.algo.packing)):
        if not isinstance(value, bool) and value != "auto":
            raise ConfigError(f"{key}={value!r} is not one of true, false, auto")
    tokens = cfg.algo.micro_batch_tokens
    if tokens != "auto" and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0):
        raise ConfigError(
            f"algo.micro_batch_tokens={tokens!r} must be auto or an integer >= 0 "
            "(0 = no token budget)"
        )
    if cfg.dist.peer_timeout_s != 0 and cfg.dist.peer_timeout_s < 10:
        raise ConfigError(
            f"dist.peer_timeout_s={cfg.dist.peer_timeout_s:g} must be 0 (off) or at least 10 "
            "(ranks pulse every 2 s)"
        )
    if cfg.rollout.progress_timeout_s != 0 and cfg.rollout.progress_timeout_s < 10:
        raise ConfigError(
            f"rollout.progress_timeout_s={cfg.rollout.progress_timeout_s:g} must be 0 (off) or "
            "at least 10 (progress is read every 2 s); keep the default 600 unless a first "
            "compile or a batch's reward scoring takes longer"
        )
    if cfg.training.profile_steps < 0 or cfg.training.profile_from < 1:
        raise ConfigError(
            f"training.profile_steps={cfg.training.profile_steps} must be >= 0 and "
            f"training.profile_from={cfg.training.profile_from} >= 1 (steps count from 1)"
        )
    if cfg.training.stall_sample_ms < 0:
        raise ConfigError(
            f"training.stall_sample_ms={cfg.training.stall_sample_ms} must be >= 0 (0: off)"
        )
    if not cfg.training.setup_heartbeat_s > 0:
        raise ConfigError(
            f"training.setup_heartbeat_s={cfg.training.setup_heartbeat_s:g} must be > 0 "
            "(seconds between heartbeats while the model loads; well under the monitor's "
            "heartbeat timeout)"
        )
    if cfg.training.gc_every_steps < 0:
        raise ConfigError(
            f"training.gc_every_steps={cfg.training.gc_every_steps} must be >= 0 "
            "(0 = Python's automatic garbage collection)"
        )
    for key in ("zero_reward_patience", "cut_off_patience", "collapse_patience"):
        if getattr(cfg.training, key) < 0:
            raise ConfigError(f"training.{key} must be >= 0 (0 = no breaker)")
    if cfg.training.collapse_retries < 0 or cfg.training.collapse_window < 1:
        raise ConfigError(
            "training.collapse_retries must be >= 0 and training.collapse_window >= 1"
        )
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"{key} must be at least 1, got {value}")
    if cfg.rollout.num_generations < 2:  # one rule, not also in ``positive`` above
        raise ConfigError(
            f"rollout.num_generations={cfg.rollout.num_generations} must be at least 2: GRPO's "
            "baseline is the mean reward of a group of completions of one prompt"
        )
    for key, meaning in DATA_COUNTS.items():
        value = getattr(cfg.data, key)
        if value < 0:
            raise ConfigError(f"data.{key}={value} must be >= 0 ({meaning})")
    if cfg.rollout.temperature <= 0:
        raise ConfigError("rollout.temperature must be > 0 for sampling")
    if not 0 < cfg.algo.eps_low < 1 or cfg.algo.eps_high <= 0:
        raise ConfigError("algo.eps_low must be in (0, 1) and algo.eps_high > 0")
    cap = cfg.algo.tis_cap
    if cap is not None and (not 0 <= cap or 0 < cap < 1):
        raise ConfigError("algo.tis_cap must be 0 (off) or >= 1 (e.g. 2): it caps a ratio")
    if cfg.algo.offpolicy_mask < 0:
        raise ConfigError(
            f"algo.offpolicy_mask={cfg.algo.offpolicy_mask} must be >= 0 (0: off; e.g. "
            "0.02: a negative-advantage completion whose mean log(pi_sampler / pi_old) "
            "passes it trains nothing)"
        )
    _validate_async(cfg)
    if cfg.training.rollback_cap_growth < 1 or cfg.training.rollback_cap_max < 0:
        raise ConfigError(
            "training.rollback_cap_growth must be >= 1 (1: a rollback keeps the cap) and "
            "training.rollback_cap_max >= 0 (0: twice rollout.max_new_tokens)"
        )
    if cfg.data.min_terms < 1 or cfg.data.max_terms < cfg.data.min_terms:
        raise ConfigError("data.min_terms must be >= 1 and <= data.max_terms")
    if not 0 <= cfg.reward.overlong_buffer < cfg.rollout.max_new_tokens:
        raise ConfigError(
            f"reward.overlong_buffer={cfg.reward.overlong_buffer} must be >= 0 and below "
            f"rollout.max_new_tokens={cfg.rollout.max_new_tokens}"
        )
    _validate_faults(cfg.faults)


def _validate_async(cfg: Config) -> None:
    """``algo.max_staleness``: a count of updates (docs/async.md)."""
    k = cfg.algo.max_staleness
    if k < 0:
        raise ConfigError(
            f"algo.max_staleness={k} must be >= 0 (0: the synchronous step; k: rollouts "
            "generated up to k updates ahead)"
        )
    if problem := warmup_problem(cfg) or partial_problem(cfg) or grouped_problem(cfg):
        raise ConfigError(problem)
    # a split run's process count is the profile's (nodes x processes), not known here
    split = cfg.rollout.placement == "split"
    problem = (
        split_problem(cfg, None) if split else async_ranks_problem(cfg, cfg.dist.nproc_per_node)
    )
    if problem:
        raise ConfigError(problem)


def async_ranks_problem(cfg: Config, ranks: int) -> str | None:
    """Why an asynchronous run cannot run on ``ranks`` processes (pure; None: it can). Each
    rank (DDP, or FSDP2: its copy is gathered whole on the main thread) generates its share
    ahead with no collective (``Collector.ahead``); dynamic sampling's rounds are agreed
    between the ranks."""
    k = cfg.algo.max_staleness
    if cfg.rollout.placement == "split":
        return split_problem(cfg, ranks)
    if not k or ranks <= 1:
        return None
    if cfg.rollout.dynamic_sampling:
        return (
            f"algo.max_staleness={k} with rollout.dynamic_sampling runs in one process in this "
            f"release, not {ranks}: turn one of them off (docs/async.md)"
        )
    return None


def warmup_problem(cfg: Config) -> str | None:
    """Why ``algo.synchronous_steps`` cannot run with this config (pure; None: it can)."""
    n, k = cfg.algo.synchronous_steps, cfg.algo.max_staleness
    if n < 0:
        return f"algo.synchronous_steps={n} must be >= 0 (0: asynchronous from the first step)"
    if n > 1 and not k:
        return (
            f"algo.synchronous_steps={n} needs algo.max_staleness >= 1: a synchronous run "
            "is synchronous at every step (set algo.max_staleness=1, or drop it)"
        )
    return None


def grouped_problem(cfg: Config) -> str | None:
    """Why ``rollout.steps_per_generation`` cannot run with this config (pure; None: it
    can): its last batch trains ``M - 1`` updates after the weights that made it."""
    m, k, ro = cfg.rollout.steps_per_generation, cfg.algo.max_staleness, cfg.rollout
    if m < 1:
        return f"rollout.steps_per_generation={m} must be >= 1 (1: a rollout a step)"
    if m == 1:
        return None
    why = None
    if k < m - 1:
        why = (
            f"algo.max_staleness={k}: the last of {m} batches trains {m - 1} updates after the "
            f"weights that made it; set algo.max_staleness={m - 1} or more"
        )
    elif ro.partial_pool:
        why = "rollout.partial_pool: the pool already decodes several steps' rows at once"
    elif ro.placement == "split":
        why = "rollout.placement=split: its generators make one step's batch a request"
    elif ro.dynamic_sampling:
        why = "rollout.dynamic_sampling: its extra rounds are one step's"
    elif ro.seed_per_group:
        why = "rollout.seed_per_group: its streams are drawn per step's rollout"
    m_is = f"rollout.steps_per_generation={m}"
    return f"{m_is} cannot run with {why} (docs/async.md)" if why else None


def partial_problem(cfg: Config) -> str | None:
    """Why ``rollout.partial_pool`` cannot run with this config (pure; None: it can). A
    continued answer trains at least two updates after its first token: one update to
    reach the round that continues it, one more to train it."""
    pool, k, ro = cfg.rollout.partial_pool, cfg.algo.max_staleness, cfg.rollout
    if pool == 0:
        return None
    if pool < 2:
        return (
            f"rollout.partial_pool={pool} must be 0 (off) or at least 2 (the prompts of that "
            "many steps decode at once; 1 would wait for every answer, as 0 does)"
        )
    why = None
    if k < 2:
        why = (
            f"algo.max_staleness={k}: an answer continued by the next weights trains at "
            "least 2 updates after its first token; set algo.max_staleness=2 or more"
        )
    elif pool > k:
        why = (
            f"algo.max_staleness={k}: a group drawn with the pool full may wait for "
            f"{pool - 1} older steps' groups and train {pool} updates stale; set "
            f"rollout.partial_pool to at most {k} or algo.max_staleness to at least {pool}"
        )
    elif ro.dynamic_sampling:
        why = "rollout.dynamic_sampling: its extra rounds and the pool's are not combined"
    elif ro.seed_per_group:
        why = "rollout.seed_per_group: a group decoded beside other steps' has no stream alone"
    return f"rollout.partial_pool={pool} cannot run with {why} (docs/async.md)" if why else None


def training_ranks(cfg: Config, ranks: int) -> int:
    """The processes of ``ranks`` that train (pure): all but a split run's generators."""
    return ranks - (cfg.rollout.generators if cfg.rollout.placement == "split" else 0)


def share_problem(prompts: int, trainers: int) -> str | None:
    """Why ``prompts`` prompts a step cannot be shared out as whole groups over
    ``trainers`` training processes (pure; None: they can, or no trainer is left, which
    ``split_problem`` says). The trainer refuses it at setup; grpo-submit before queueing."""
    if trainers < 1 or prompts % trainers == 0:
        return None
    lower = prompts - prompts % trainers
    fix = f"{lower + trainers}" + (f" or {lower}" if lower else "")
    return (
        f"rollout.prompts_per_step={prompts} must be a multiple of the {trainers} training "
        f"processes (each trains whole groups): e.g. rollout.prompts_per_step={fix}"
    )


def split_problem(cfg: Config, ranks: int | None) -> str | None:
    """Why ``rollout.placement=split`` cannot run on ``ranks`` processes (pure; None: it
    can; ``ranks`` None: not known yet, the count unchecked). What this release builds:
    ``G`` generator processes and ``T >= G`` trainer processes (DDP or FSDP2 among them;
    trainer ``r`` served by generator ``r % G``, ``config.roles``), an asynchronous run (the
    synchronous step has nothing to overlap), the rollouts of one round (dynamic sampling's
    extra rounds are decided after scoring, on the trainer). Any number of nodes: ranks are
    numbered node by node, so the generators are the last node's last processes, and
    their messages and weights cross nodes over the process group as the trainers' DDP
    does."""
    k, g = cfg.algo.max_staleness, cfg.rollout.generators
    if not k:
        return (
            "rollout.placement=split generates ahead of the trainer and needs "
            "algo.max_staleness >= 1 (e.g. 1); the synchronous step generates in the trainer: "
            "set rollout.placement=thread"
        )
    if g < 1:
        return f"rollout.generators={g} must be at least 1 with rollout.placement=split"
    t = None if ranks is None else ranks - g
    if t is not None and t < 1:
        return (
            f"rollout.placement=split runs {g} generator{_s(g)} and at least 1 trainer "
            f"process, not {ranks} process(es) in all: use a profile with nproc_per_node: "
            f"{g + 1} or more (processes per node; docs/profiles.md), or "
            "rollout.placement=thread"
        )
    if t is not None and t < g:  # trainer r is served by generator r % G (config/roles.py)
        return (
            f"rollout.generators={g} with {t} trainer process(es) of {ranks}: a generator "
            f"would have no trainer to serve: set rollout.generators={t} or fewer, or use a "
            f"profile with nproc_per_node: {2 * g} or more"
        )
    if cfg.rollout.dynamic_sampling:
        return (
            "rollout.placement=split with rollout.dynamic_sampling is not built in this "
            "release: turn one of them off (docs/async.md)"
        )
    return None


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def split_evaluation_problem(cfg: Config, trainers: int, engine: str) -> str | None:
    """Why a split run's ``trainers`` cannot run the held-out evaluation with ``engine``
    (``hf`` or ``native``, as chosen; pure; None: they can). FSDP2 trainers generate an
    evaluation in step (each forward gathers shards), and HF generate keeps them in step
    with an all-reduce over every process of the job, which the generator never joins: it
    would wait for ever (seen on 2 trainers and a generator). The native engine gathers
    the weights once, in the trainers' group, and generates alone."""
    split = cfg.rollout.placement == "split" and cfg.algo.max_staleness > 0
    sharded = cfg.dist.strategy == "fsdp" and trainers > 1
    if not (split and sharded and cfg.training.eval_every and engine == "hf"):
        return None
    return (
        f"rollout.placement=split with {trainers} FSDP2 trainers evaluates with the native "
        "engine only (HF generate would wait for the generator process): set "
        "rollout.engine=native, training.eval_every=0, or dist.strategy=ddp"
    )


def _validate_faults(f: FaultsConfig) -> None:
    active = (
        f.hang_at_step >= 0
        or f.crash_at_step >= 0
        or f.zero_reward
        or f.slow_save > 0
        or f.slow_export > 0
        or f.slow_load > 0
        or f.step_sleep > 0
        or f.stall_at_step >= 0
        or f.oom_at_step >= 0
        or f.stuck_generation_at_step >= 0
    )
    if active and not f.enabled:
        raise ConfigError(
            "fault injection is for tests: set faults.enabled=true to use faults.* settings"
        )
