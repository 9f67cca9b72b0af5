"""Choosing the means that make a plan fit a GPU memory budget: FSDP2, a smaller
micro-batch token budget, releasing the native engine during the update, gradient
checkpointing, HF generate instead of the native engine, and (where the profile allows it)
FSDP2's CPU offload. Each leaves the training math unchanged; the cheapest combination whose
estimate (grpo_hpc.memory.estimate) fits is applied, and when none does, ``alternatives``
names what would (LoRA, smaller token budgets). Pure functions: no torch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from grpo_hpc.memory.estimate import Estimate, ModelShape, Settings, estimate

MEANS = (
    ("fsdp", "FSDP2", 1),
    ("micro_batch_tokens", "micro_batch_tokens=2048", 1),
    ("release_engine", "engine released during the update", 2),
    ("gradient_checkpointing", "gradient checkpointing", 2),
    ("engine_hf", "rollout.engine=hf", 10),
    ("cpu_offload", "optimizer CPU offload", 8),
)
"""Memory means that leave the training math unchanged: (name, label, speed cost). When the
run's own settings do not fit, the cheapest combination that fits is applied. CPU offload
is only tried where the profile allows it (``allow_cpu_offload``). HF generate instead of the
native engine drops the engine's packed copy of the weights, at ~10x slower decoding."""

FSDP_MICRO_BATCH_COST = 3
"""A smaller token budget under FSDP2 (:func:`_cost`): every micro-batch gathers every layer's
weights for its forward and again for its backward, so twice the micro-batches is twice
that traffic. Measured at 7B full-parameter on 2x H100 (FSDP2, compiled, engine released):
``micro_batch_tokens=2048`` 14.3 s/step against gradient checkpointing's 11.6 s
(bench/results/ladder_h100_2026-11-26.json,
bench/results/archive/ladder_ddp_first_h100x2_2026-11-26.md), so there it costs more
than checkpointing (2)."""


def _cost(mean: str, cost: int, s: Settings) -> int:
    """A mean's speed cost applied to ``s`` (the settings before it; pure)."""
    if mean == "micro_batch_tokens" and s.fsdp:
        return FSDP_MICRO_BATCH_COST
    return cost


def _apply(s: Settings, mean: str) -> Settings | None:
    """``s`` with one mean applied; None when it does not apply (already on, one GPU)."""
    if mean == "fsdp":  # dist.compile's auto compiles under FSDP2 as under DDP
        return replace(s, strategy="fsdp") if s.ranks > 1 and not s.fsdp else None
    if mean == "gradient_checkpointing":
        return None if s.gradient_checkpointing else replace(s, gradient_checkpointing=True)
    if mean == "micro_batch_tokens":
        ok = s.micro_batch_tokens == 0 or s.micro_batch_tokens > 2048
        return replace(s, micro_batch_tokens=2048) if ok else None
    if mean == "release_engine":  # weights and cache rebuilt (graphs recaptured) per rollout
        ok = s.engine == "native" and not s.release_engine and not s.staleness  # it generates
        return replace(s, release_engine=True) if ok else None
    if mean == "engine_hf":  # HF generate: no packed weight copy, a smaller KV cache
        return replace(s, engine="hf") if s.engine == "native" else None
    if mean == "cpu_offload":  # FSDP2's offload policy: needs (and implies) FSDP
        return replace(s, cpu_offload=True) if s.fsdp and not s.cpu_offload else None
    raise ValueError(mean)


@dataclass(frozen=True)
class Plan:
    """The settings a submission runs with, and what fitting the budget changed."""

    settings: Settings
    estimate: Estimate
    budget_gib: float | None
    changed: tuple[str, ...] = ()
    """Means applied to fit (labels of MEANS)."""

    @property
    def fits(self) -> bool:
        return self.budget_gib is None or self.estimate.total_gib <= self.budget_gib


def fit(
    shape: ModelShape, s: Settings, budget_gib: float | None, allow_offload: bool = False
) -> Plan:
    """The run's own settings when they fit; else the cheapest combination of MEANS that
    fits; else every applicable mean at once (which does not fit either)."""
    plan = Plan(s, estimate(shape, s), budget_gib)
    if plan.fits:
        return plan
    means = [m for m in MEANS if allow_offload or m[0] != "cpu_offload"]
    best: Plan | None = None
    best_cost = 0
    for subset in itertools.product((False, True), repeat=len(means)):
        trial, labels, cost = s, [], 0
        for on, (mean, label, c) in zip(subset, means, strict=True):
            nxt = _apply(trial, mean) if on else trial
            if nxt is None:
                break
            if on:
                labels.append(label)
                cost += _cost(mean, c, trial)
            trial = nxt
        else:
            cand = Plan(trial, estimate(shape, trial), budget_gib, tuple(labels))
            better = best is None or (cand.fits, -cost) > (best.fits, -best_cost)
            if not cand.fits and best is not None and not best.fits:
                better = cand.estimate.total_gib < best.estimate.total_gib
            if better:
                best, best_cost = cand, cost
    return best if best is not None else plan


def alternatives(
    shape: ModelShape, s: Settings, budget_gib: float, allow_offload: bool = False
) -> list[tuple[str, float]]:
    """What would fit when nothing automatic does, each with the memory means: an
    asynchronous run without its partial pool (P steps' rows in the generator's cache),
    with fewer steps' rows a rollout (the largest ``rollout.steps_per_generation`` >= 2
    that fits), or synchronous (no generating copy, one step's rows), LoRA (rank 16), and
    smaller token budgets.
    (override, total GiB) pairs, the closest to the run asked for first. Each override is
    one a config accepts: a synchronous run decodes one step's rows, so leaving grouped
    generation for it names both keys (``grouped_problem`` refuses k = 0 with M > 1)."""
    out: list[tuple[str, float]] = []
    lighter = []
    if s.partial_pool:
        lighter.append(("rollout.partial_pool=0", replace(s, partial_pool=0)))
    # M - 1 ... 2, k unchanged (k >= M - 1 still holds); M = 1 at that k would be the
    # thread placement, with a generating copy these settings (grouped: none) do not hold
    fewer = [replace(s, rollout_steps=m) for m in range(s.rollout_steps - 1, 1, -1)]
    first = next((t for t in fewer if fit(shape, t, budget_gib, allow_offload).fits), None)
    if first is not None:
        lighter.append((f"rollout.steps_per_generation={first.rollout_steps}", first))
    if s.staleness or s.rollout_steps > 1:
        grouped = " rollout.steps_per_generation=1" if s.rollout_steps > 1 else ""
        sync = replace(s, staleness=0, partial_pool=0, rollout_steps=1)
        lighter.append(("algo.max_staleness=0" + grouped, sync))
    for override, trial in lighter:
        plan = fit(shape, trial, budget_gib, allow_offload)
        if plan.fits:
            out.append((override, plan.estimate.total_gib))
    if not s.lora_rank:
        plan = fit(shape, replace(s, lora_rank=16), budget_gib, allow_offload)
        if plan.fits:
            out.append(("model.lora_rank=16", plan.estimate.total_gib))
    for tokens in (1024, 512):
        if s.micro_batch_tokens == 0 or s.micro_batch_tokens > tokens:
            trial = replace(s, micro_batch_tokens=tokens)
            plan = Plan(trial, estimate(shape, trial), budget_gib)
            if plan.fits:
                out.append((f"algo.micro_batch_tokens={tokens}", plan.estimate.total_gib))
    return out
