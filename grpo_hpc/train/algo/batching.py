"""Which generated groups train this step, and how they split into micro-batches (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from grpo_hpc.config.schema import AlgoConfig
from grpo_hpc.train.algo.advantages import group_advantages, informative_groups
from grpo_hpc.train.algo.update import MicroBatch, split
from grpo_hpc.train.rollout.types import RolloutBatch


@dataclass
class Scored:
    """One rollout batch with its rewards (rows grouped G at a time)."""

    batch: RolloutBatch
    rewards: torch.Tensor
    """[groups, G] total reward per completion."""
    components: dict[str, list[float]]
    """Unweighted reward components, one value per row."""
    errors: dict[str, int] = field(default_factory=dict)
    """Items per reward that scored 0 because the reward itself failed."""
    questions: list[str] = field(default_factory=list)
    """The question of each group (for ``samples.jsonl``)."""
    full: list[bool] = field(default_factory=list)
    """Per row, whether the completion earned every reward term in full
    (``rewards.full_marks``; empty: not known, none counts as solved)."""


@dataclass
class Selection:
    microbatches: list[MicroBatch]
    rewards: list[float]
    """Total reward of every selected completion."""
    components: dict[str, list[float]]
    """Reward components of every selected completion."""
    truncated: int = 0
    """Selected completions cut off at the length cap (no EOS), masked or not."""
    groups: int = 0
    """Groups selected."""
    solved: int = 0
    """Selected groups flat because every completion is right (``rewards.full_marks``): the
    collapse watch tells them from groups flat for want of a right answer."""


def select_groups(scored: list[Scored], want: int, g: int, algo: AlgoConfig) -> Selection:
    """Keep ``want`` groups, informative ones first (DAPO dynamic sampling when several
    rounds ran), in generation order. The fixed count keeps every rank's batch the same
    shape; a flat group left in has zero advantage and adds no policy gradient. With
    ``algo.mask_truncated`` the cut-off rows of a kept group weigh in its advantages and
    then leave: they train nothing and do not count in the loss normaliser."""
    picks = [(si, gi) for si, s in enumerate(scored) for gi in range(s.rewards.shape[0])]
    picks.sort(key=lambda p: not bool(informative_groups(scored[p[0]].rewards)[p[1]]))
    picks = sorted(picks[:want])
    out = Selection([], [], {})
    for si, s in enumerate(scored):
        groups = [gi for (sj, gi) in picks if sj == si]
        if not groups:
            continue
        adv = group_advantages(s.rewards[groups], algo.advantage, algo.adv_eps).flatten()
        rows = [gi * g + k for gi in groups for k in range(g)]
        cut = cut_rows(s.batch, rows)
        out.truncated += len(cut)
        train = [i for i, r in enumerate(rows) if not (algo.mask_truncated and r in cut)]
        out.microbatches += split(
            s.batch,
            [rows[i] for i in train],
            adv[train],
            algo.micro_batch_size,
            algo.micro_batch_tokens,
            algo.packing is True,  # resolved by the trainer; an unresolved auto: padded
        )
        out.rewards += s.rewards[groups].flatten().tolist()
        out.groups += len(groups)
        flat = ~informative_groups(s.rewards)
        out.solved += sum(bool(flat[gi]) and _solved(s.full, gi, g) for gi in groups)
        for name, vals in s.components.items():
            out.components.setdefault(name, []).extend(vals[r] for r in rows)
    if not out.microbatches and scored:
        # Every selected completion was masked: one row that trains nothing keeps this
        # rank's forward/backward count (and DDP/FSDP collectives) in step with the others.
        (mb,) = split(scored[0].batch, [0], torch.zeros(1), 1)
        out.microbatches = [replace(mb, weight=0.0)]
    return out


def _solved(full: list[bool], group: int, g: int) -> bool:
    """Whether every completion of ``group`` earned full marks (False when not known)."""
    rows = full[group * g : (group + 1) * g]
    return len(rows) == g and all(rows)


def cut_rows(batch: RolloutBatch, rows: list[int]) -> set[int]:
    """The rows among ``rows`` whose completion hit the length cap without EOS."""
    if batch.finished is None:
        return set()
    finished = batch.finished.tolist()
    return {r for r in rows if not finished[r]}
