"""Corrections for tokens sampled by another policy than the one that trains: the engine's
numerics, and in an asynchronous run weights up to ``algo.max_staleness`` updates old.

Two corrections, both detached (a weight on the gradient, not a term of it):

- :func:`tis_weight`, per token: truncated importance sampling (``algo.tis_cap``);
- :func:`sequence_keep`, per completion: off-policy sequence masking
  (``algo.offpolicy_mask``).

``pi_old`` below is the trainer's probability of the token at update time (``old_logp``,
or the update's own forward detached when it is on-policy), ``pi_sampler`` the one the
token was drawn with (``RolloutBatch.sampled_logp``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # update.py imports this module
    from grpo_hpc.train.algo.update import MicroBatch


def _old_and_sampled(logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(pi_old, pi_sampler) log-probs of ``mb``'s tokens, on ``logp``'s device;
    ``mb.batch.sampled_logp`` must be there."""
    assert mb.batch.sampled_logp is not None
    old = mb.old_logp if mb.old_logp is not None else logp.detach()
    return old, mb.batch.sampled_logp[mb.rows].to(logp.device)


def tis_weight(logp: torch.Tensor, mb: MicroBatch, cap: float) -> torch.Tensor | float:
    """Truncated importance sampling weights ``min(pi_old / pi_sampler, cap)`` per token
    (``algo.tis_cap``; 1.0 when off or when the sampler's log-probs are not known). The
    sampler drew from its own distribution; the update's estimator assumes the trainer's.
    Variant: token-level TIS (Yao et al. 2025) on the behaviour policy, with the clipped
    ratio taken against the trainer's own ``pi_old``: the decoupled PPO objective of
    asynchronous RL (Hilton et al. 2022; AReaL), its behaviour weight truncated instead of
    unbounded. Masked positions are capped like the rest and dropped by the aggregation."""
    if cap <= 0 or mb.batch.sampled_logp is None:
        return 1.0
    return raw_weight(logp, mb).clamp(max=cap)


def raw_weight(logp: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    """``pi_old / pi_sampler`` per token before any cap (:func:`tis_weight`'s ratio)."""
    old, sampled = _old_and_sampled(logp, mb)
    return torch.exp(old - sampled)


@torch.no_grad()
def largest_weight(logp: torch.Tensor, mb: MicroBatch, cmask: torch.Tensor) -> torch.Tensor:
    """The largest uncapped importance weight of ``mb``'s tokens (0 without sampler
    log-probs or tokens), on the device."""
    if mb.batch.sampled_logp is None or not mb.weight:
        return torch.zeros((), dtype=torch.float64, device=logp.device)
    raw = torch.where(cmask.bool(), raw_weight(logp, mb), 0.0)
    return raw.max().double() if raw.numel() else raw.new_zeros((), dtype=torch.float64)


@torch.no_grad()
def sequence_keep(
    logp: torch.Tensor, mb: MicroBatch, cmask: torch.Tensor, delta: float
) -> torch.Tensor | float:
    """Off-policy sequence masking (``algo.offpolicy_mask`` = ``delta``; the variant of
    DeepSeek-V3.2's report): 0 for a completion whose advantage is negative and whose
    tokens the sampler drew, on average, more readily than the trainer now would,
    ``mean_t log(pi_sampler / pi_old) > delta`` (a per-sequence estimate of KL(sampler ||
    trainer)); 1 for every other completion. ``[rows, 1]``, or 1.0 when off or without the
    sampler's log-probs.

    Why only negative advantages: a stale completion the policy has already moved away
    from is pushed further away by a negative advantage, and such pushes are what drive a
    policy off its support; a positive advantage pulls it back towards what it sampled,
    which the importance weight already bounds. The loss's normaliser is unchanged (a
    masked completion counts as trained to zero), as in the report."""
    if delta <= 0 or mb.batch.sampled_logp is None:
        return 1.0
    old, sampled = _old_and_sampled(logp, mb)
    m = cmask.bool()
    drift = torch.where(m, sampled - old, 0.0).sum(-1) / m.sum(-1).clamp(min=1)
    masked = (mb.advantages.to(logp.device) < 0) & (drift > delta)
    return (~masked).to(logp.dtype).unsqueeze(-1)
