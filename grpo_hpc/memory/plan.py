"""What grpo-submit and the trainer ask the memory estimator (grpo_hpc.memory.estimate, and
grpo_hpc.memory.fit for the means that make a plan fit): the shape of a configured model,
the memory settings of a resolved config, the verdict printed on the ``memory:`` line (and
the refusal), and the advice after an out-of-memory error."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_hpc.config import speed as auto_speed
from grpo_hpc.memory.estimate import (
    CUDA_CONTEXT_GIB,
    FRAGMENTATION,
    GIB,
    ModelShape,
    Settings,
    estimate,
    micro_tokens,
)
from grpo_hpc.memory.fit import Plan, alternatives, fit

if TYPE_CHECKING:
    from grpo_hpc.config.profiles import Profile
    from grpo_hpc.config.schema import Config, ModelConfig

__all__ = ["GIB", "Check", "check", "model_shape", "oom_advice", "settings_of"]


def read_config_json(name_or_path: str) -> dict | None:
    """The model's config.json from a local directory (or ``random:<dir>``), or from the local
    Hugging Face cache for a hub id; None when it is not on this machine (no download)."""
    path = Path(name_or_path.removeprefix("random:")).expanduser()
    if (path / "config.json").is_file():
        return json.loads((path / "config.json").read_text())
    if path.exists() or name_or_path.count("/") != 1:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(name_or_path, "config.json")
    return json.loads(Path(found).read_text()) if isinstance(found, str) else None


SMOLLM2_CONFIG = {
    "model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
    "vocab_size": 49152, "tie_word_embeddings": True,
}  # fmt: skip
"""SmolLM2-135M-Instruct (the ``smollm2-135m`` model, converted from a GGUF at run time)."""


def model_shape(model: ModelConfig) -> ModelShape | None:
    """The shape of ``model.name_or_path`` without loading it; None when unknown here."""
    if model.name_or_path == "tiny":
        h = model.tiny_hidden_size
        cfg = {
            "hidden_size": h, "num_hidden_layers": model.tiny_layers, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 2 * h, "vocab_size": 128,
            "tie_word_embeddings": True,
        }  # fmt: skip
        return ModelShape.from_config(cfg)
    if model.name_or_path == "smollm2-135m":
        return ModelShape.from_config(SMOLLM2_CONFIG)
    found = read_config_json(model.name_or_path)
    return ModelShape.from_config(found) if found else None


def settings_of(cfg: Config, nodes: int = 1, capability: tuple[int, int] | None = None) -> Settings:
    """Memory settings of a resolved config (one rank's share of the step) on ``nodes``
    nodes (FSDP2 shards over every rank of the job) of GPUs of compute ``capability``
    (the profile's; None: unknown, see ``auto_speed.where_submitted``). A split run's
    settings are its trainers': they share the step and FSDP2's shards among themselves
    and hold no generating copy (a generator's need is :func:`generator_gib`'s)."""
    ranks, staleness = cfg.dist.nproc_per_node * nodes, cfg.algo.max_staleness
    if cfg.rollout.placement == "split":
        ranks, staleness = max(1, ranks - cfg.rollout.generators), 0
    grouped = cfg.rollout.steps_per_generation if staleness else 1
    if grouped > 1:  # the policy generates, on the main thread: no copy, no overlap
        staleness = 0
    engine = "hf" if cfg.rollout.engine == "hf" else "native"
    where = auto_speed.where_submitted(cfg, capability)
    return Settings(
        ranks=ranks,
        strategy=cfg.dist.strategy,
        precision=cfg.dist.precision,
        rows=max(1, cfg.rollout.prompts_per_step // ranks) * cfg.rollout.num_generations,
        max_new_tokens=cfg.rollout.max_new_tokens,
        micro_batch_size=cfg.algo.micro_batch_size,
        micro_batch_tokens=cfg.algo.micro_batch_tokens,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        checkpoint_every=cfg.model.checkpoint_every,
        lora_rank=cfg.model.lora_rank,
        lora_targets=tuple(cfg.model.lora_target_modules),
        beta=cfg.algo.beta,
        engine=engine,
        cpu_offload=cfg.dist.cpu_offload,
        reshard_after_forward=cfg.dist.reshard_after_forward,
        optim_state=cfg.optim.state,
        release_engine=cfg.rollout.release_engine_memory,
        compiled_layers=auto_speed.compile_on(cfg.dist.compile, where),
        staleness=staleness,
        partial_pool=cfg.rollout.partial_pool if staleness else 0,
        rollout_steps=grouped,
        evaluates=cfg.training.eval_every > 0,
    )


AUTO_TOKENS = (18432, 4096)
"""What ``algo.micro_batch_tokens=auto`` chooses between, larger first. A small model's
update is launch-bound (each micro-batch costs nearly a full pass), so the larger budget is
the faster one where memory allows: SmolLM2-135M's real 2-GPU GSM8K run stepped in 0.72 s
with 18,432 tokens against 1.34 s with 4,096
(``bench/results/archive/slurm_gsm8k_attention_plans_h100x2_2026-11-27.md``).
4,096 is the budget the ``gsm8k`` config pinned before, under which its plans for the
larger shapes were measured (``docs/memory.md``)."""

AUTO_SHARE = 0.5
"""``auto`` takes the larger budget only where its estimate uses at most this share of the
GPU: an estimate off by a factor of two would still fit, so the choice never needs the
estimate's accuracy near the limit (where the plan's own headroom rule applies)."""


def auto_tokens(
    cfg: Config, gpu_mem_gb: float | None, nodes: int = 1, capability: tuple[int, int] | None = None
) -> int:
    """The token budget ``algo.micro_batch_tokens=auto`` means for ``cfg`` on GPUs of
    ``gpu_mem_gb`` GiB (None: no GPU, or no figure) (pure but for reading config.json)."""
    shape = model_shape(cfg.model)
    if gpu_mem_gb is None or shape is None:
        return AUTO_TOKENS[-1]
    for tokens in AUTO_TOKENS[:-1]:
        trial = replace(cfg, algo=replace(cfg.algo, micro_batch_tokens=tokens))
        if estimate(shape, settings_of(trial, nodes, capability)).total_gib <= (
            AUTO_SHARE * gpu_mem_gb
        ):
            return tokens
    return AUTO_TOKENS[-1]


def resolve_auto_tokens(
    cfg: Config, gpu_mem_gb: float | None, nodes: int = 1, capability: tuple[int, int] | None = None
) -> Config:
    """``cfg`` with ``algo.micro_batch_tokens=auto`` decided (:func:`auto_tokens`); any
    other value is returned as it is."""
    if cfg.algo.micro_batch_tokens != auto_speed.AUTO:
        return cfg
    tokens = auto_tokens(cfg, gpu_mem_gb, nodes, capability)
    return replace(cfg, algo=replace(cfg.algo, micro_batch_tokens=tokens))


def apply_settings(cfg: Config, s: Settings) -> Config:
    """``cfg`` with the memory means of ``s`` (strategy, checkpointing, token budget, offload,
    engine release)."""
    return replace(
        cfg,
        model=replace(cfg.model, gradient_checkpointing=s.gradient_checkpointing),
        algo=replace(cfg.algo, micro_batch_tokens=s.micro_batch_tokens),
        dist=replace(cfg.dist, strategy=s.strategy, cpu_offload=s.cpu_offload),
        rollout=replace(
            cfg.rollout,
            engine=s.engine if s.engine == "hf" else cfg.rollout.engine,
            release_engine_memory=s.release_engine,
        ),
    )


@dataclass(frozen=True)
class Check:
    """The memory verdict of a submission: the line to print, and the refusal if any."""

    line: str
    plan: Plan | None
    refusal: str | None = None


def check(cfg: Config, profile: Profile) -> Check:
    """Estimate ``cfg`` against a profile's GPU memory; fit it with MEANS if needed (pure
    but for reading config.json)."""
    gpu_mem_gb, profile_name = profile.gpu_mem_gb, profile.name
    shape = model_shape(cfg.model)
    if shape is None:
        return Check(
            f"memory: not estimated: no config.json for {cfg.model.name_or_path!r} on this "
            "machine (a local directory, or a hub id in the local Hugging Face cache)",
            None,
        )
    if gpu_mem_gb is None:
        # The estimator models GPU allocations (calibrated on the ladder); a CPU process's
        # resident memory is another matter, so no figure is printed for it.
        return Check(f"memory: not checked (profile {profile_name} has no gpu_mem_gb)", None)
    cfg = resolve_auto_tokens(cfg, gpu_mem_gb, profile.nodes, profile.capability)
    s = settings_of(cfg, profile.nodes, profile.capability)
    plan = fit(shape, s, gpu_mem_gb, profile.allow_cpu_offload)
    e = plan.estimate
    size = f"{shape.params / 1e9:.2f}B params"
    head = f"memory: {e.total_gib:.1f} GiB per GPU of {gpu_mem_gb:g} GiB ({profile_name})"
    how = f"{plan.settings.describe()}; {size}; peak in {e.peak_phase}"
    if plan.changed:
        how += f"; to fit: {', '.join(plan.changed)}"
    split = cfg.rollout.placement == "split"
    if split:  # the trainers' estimate above; each generator holds its own
        gen = generator_gib(shape, s, cfg)
        head = f"memory: {e.total_gib:.1f} GiB per trainer GPU, {gen:.1f} GiB per generator"
        head += f" GPU, of {gpu_mem_gb:g} GiB ({profile_name})"
        if plan.fits and gen > gpu_mem_gb:
            pool = cfg.rollout.partial_pool
            plain = generator_gib(shape, s, replace_pool(cfg, 0)) if pool else None
            return _generator_refusal(head, how, gen, gpu_mem_gb, profile_name, plan, plain)
    if plan.fits:
        return Check(f"{head}: fits; {how}", plan)
    over = e.total_gib - gpu_mem_gb
    alts = alternatives(shape, s, gpu_mem_gb, profile.allow_cpu_offload)
    would = (
        "would fit: " + " or ".join(f"{k} ({v:.1f} GiB)" for k, v in alts)
        if alts
        else "nothing tried fits: use a profile with more or larger GPUs"
    )
    refusal = (
        f"memory: the estimate {e.total_gib:.1f} GiB per GPU exceeds {profile_name}'s "
        f"{gpu_mem_gb:g} GiB by {over:.1f} GiB even with {plan.settings.describe()}; "
        f"{would}; --force submits anyway"
    )
    return Check(f"{head}: does NOT fit (+{over:.1f} GiB); {how}; {would}", plan, refusal)


def replace_pool(cfg: Config, pool: int) -> Config:
    """``cfg`` with ``rollout.partial_pool`` set to ``pool`` (a copy: the run's is kept)."""
    return replace(cfg, rollout=replace(cfg.rollout, partial_pool=pool))


def _generator_refusal(
    head: str, how: str, gen: float, gpu_mem_gb: float, profile_name: str, plan: Plan,
    without_pool: float | None = None,
) -> Check:  # fmt: skip
    """A split run whose trainers fit and whose generator does not: the means that fit a
    trainer (FSDP2, checkpointing, offload) do nothing for a generator's copy and cache.
    ``without_pool``: a partial run's generator estimate with no pool (P steps' rows in its
    cache, each with room for two caps), said where it would fit."""
    over = gen - gpu_mem_gb
    pool = ""
    if without_pool is not None and without_pool <= gpu_mem_gb:
        pool = f"rollout.partial_pool=0 ({without_pool:.1f} GiB a generator), "
    fix = (
        f"{pool}lower rollout.max_new_tokens or rollout.prompts_per_step (a generator makes "
        "one trainer's batch at a time), or use larger GPUs"
    )
    refusal = (
        f"memory: a generator's estimate {gen:.1f} GiB exceeds {profile_name}'s "
        f"{gpu_mem_gb:g} GiB by {over:.1f} GiB; {fix}; --force submits anyway"
    )
    return Check(f"{head}: a generator does NOT fit (+{over:.1f} GiB); {how}", plan, refusal)


OOM_HEADROOM = 0.85
"""After a real out-of-memory error the estimate was evidently low: advise settings whose
estimate leaves 15 % of the GPU free."""
OVERRIDES = {
    "FSDP2": "a profile with strategy: fsdp",
    "micro_batch_tokens=2048": "algo.micro_batch_tokens=2048",
    "gradient checkpointing": "model.gradient_checkpointing=true",
    "optimizer CPU offload": "dist.cpu_offload=true",
    "engine released during the update": "rollout.release_engine_memory=true",
    "rollout.engine=hf": "rollout.engine=hf",
}
"""How a user asks for each of MEANS in a new run."""


def oom_advice(cfg: Config, capacity_gib: float, nodes: int = 1) -> str:
    """What would fit a GPU of ``capacity_gib`` after ``cfg`` ran out of memory (pure but
    for reading config.json): the cheapest memory means, else LoRA or a smaller budget."""
    generic = (
        "start a new run with model.gradient_checkpointing=true, a smaller "
        "algo.micro_batch_tokens or model.lora_rank=16"
    )
    shape = model_shape(cfg.model)
    if shape is None:
        return generic
    s, budget = settings_of(cfg, nodes), capacity_gib * OOM_HEADROOM
    est = estimate(shape, s).total_gib
    plan = fit(shape, s, budget, allow_offload=s.ranks > 1)
    said = f"estimated {est:.1f} GiB as run"
    if plan.fits and not plan.changed:
        half = max(256, (s.micro_batch_tokens or micro_tokens(s)) // 2)
        return (
            f"{said}, which should fit: something else took GPU memory (another process, "
            f"prompts longer than {s.prompt_tokens} tokens); try "
            f"model.gradient_checkpointing=true or algo.micro_batch_tokens={half}"
        )
    if plan.fits:
        how = ", ".join(OVERRIDES[c] for c in plan.changed)
        return f"{said}; would fit: {how} (estimated {plan.estimate.total_gib:.1f} GiB)"
    alts = alternatives(shape, s, budget, allow_offload=s.ranks > 1)
    if alts:
        return f"{said}; would fit: " + " or ".join(f"{k} ({v:.1f} GiB)" for k, v in alts)
    return f"{said}; nothing tried fits {capacity_gib:g} GiB: use larger or more GPUs"


@dataclass(frozen=True)
class RoleMemory:
    """A ``rollout.placement=split`` run's estimate per process role (GiB, the GPU's total
    with fragmentation and the CUDA context, as the ``memory:`` line counts it)."""

    generator_gib: float
    """A generator: its copy of the weights, its engine (packed weights, KV cache) and a
    generation's transient."""
    trainer_gib: float
    """A trainer: a synchronous step's peak on the trainers' ranks alone (the weights,
    gradients, optimizer, the update; its own engine, for the held-out evaluation)."""


def generator_gib(shape: ModelShape, trainers: Settings, cfg: Config) -> float:
    """A split run's generator on its GPU (GiB, as ``total_gib`` counts): the asynchronous
    estimate's copy of the weights, its engine and a generation's transient
    (``Estimate.shadow``, ``overlapped``) for one trainer's batch at a time (with partial
    rollouts, that trainer's pool of ``rollout.partial_pool`` steps), whatever means fit
    the ``trainers``' own settings (they hold no copy)."""
    k, pool = max(1, cfg.algo.max_staleness), cfg.rollout.partial_pool
    both = estimate(shape, replace(trainers, staleness=k, partial_pool=pool))
    return (both.shadow + both.overlapped) / GIB * FRAGMENTATION + CUDA_CONTEXT_GIB


def split_memory(
    cfg: Config, nodes: int = 1, capability: tuple[int, int] | None = None
) -> RoleMemory | None:
    """The per-role estimate of a split run (None where the model's shape is unknown): a
    generator's (:func:`generator_gib`), a trainer's the synchronous step's."""
    shape = model_shape(cfg.model)
    if shape is None:
        return None
    s = settings_of(cfg, nodes, capability)  # the trainers'
    gen = generator_gib(shape, s, cfg)
    return RoleMemory(gen, estimate(shape, s).total_gib)
