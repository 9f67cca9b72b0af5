"""Group-relative advantages for GRPO-family algorithms.

Each prompt is sampled ``G`` times; the ``G`` rewards form a *group* and each
completion's advantage is its reward relative to its own group. Variants:

* ``group_norm`` -- GRPO (Shao et al. 2024, DeepSeekMath, eq. 3 "outcome supervision"):
  ``A_i = (r_i - mean(r)) / (std(r) + eps)``.
  ``std`` is the **unbiased** (Bessel-corrected, ``/(G-1)``) sample standard deviation,
  which is what ``torch.std`` does by default and what TRL's ``GRPOTrainer`` uses.
  ``eps`` defaults to ``1e-4`` (TRL's value).
* ``mean_only`` -- Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"):
  ``A_i = r_i - mean(r)``. Dividing by the group std up-weights questions that are
  nearly always (or nearly never) solved; dropping it removes that difficulty bias.
* ``loo`` -- leave-one-out baseline as in RLOO (Ahmadian et al. 2024):
  ``A_i = r_i - mean_{j != i} r_j``. Since ``sum_{j != i} r_j = G*mean - r_i``,
  ``A_i = r_i - (G*mean - r_i)/(G-1) = G/(G-1) * (r_i - mean)``.

In every mode a group whose rewards are all equal gets an advantage of exactly 0
(it carries no learning signal); DAPO (Yu et al. 2025) "dynamic sampling" drops such
groups altogether, see :func:`informative_groups` (batching.py keeps informative groups
first).
"""

from __future__ import annotations

import torch

ADVANTAGE_MODES = ("group_norm", "mean_only", "loo")

# Two rewards closer than this are "equal" for the purpose of detecting a group
# that carries no signal (binary/verifier rewards are exactly equal anyway).
_EQUAL_TOL = 1e-8


def _check_rewards(rewards: torch.Tensor) -> torch.Tensor:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape [num_groups, G], got {tuple(rewards.shape)}")
    return rewards if rewards.is_floating_point() else rewards.float()


def informative_groups(rewards: torch.Tensor) -> torch.Tensor:
    """Bool mask ``[num_groups]``: True where the group's rewards are not all equal.

    A group is uninformative when ``max(r) - min(r) <= 1e-8``: all its advantages
    are zero, so it contributes no policy gradient (DAPO dynamic sampling filters it).
    """
    rewards = _check_rewards(rewards)
    if rewards.shape[1] == 0:
        return torch.zeros(rewards.shape[0], dtype=torch.bool, device=rewards.device)
    spread = rewards.amax(dim=1) - rewards.amin(dim=1)
    return spread > _EQUAL_TOL


def group_advantages(
    rewards: torch.Tensor, mode: str = "group_norm", eps: float = 1e-4
) -> torch.Tensor:
    """Advantages from rewards of shape ``[num_groups, G]``; returns the same shape.

    See the module docstring for the formula of each ``mode``
    (``group_norm`` = GRPO with unbiased std, ``mean_only`` = Dr. GRPO,
    ``loo`` = RLOO leave-one-out). Groups with all-equal rewards get exactly 0.

    Raises:
        ValueError: unknown ``mode``, rewards not 2-D, or ``G < 2`` with ``loo``
            (the leave-one-out baseline of a single sample is undefined).
    """
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"unknown advantage mode {mode!r}; expected one of {ADVANTAGE_MODES}")
    rewards = _check_rewards(rewards)
    g = rewards.shape[1]
    if mode == "loo" and g < 2:
        raise ValueError(f"loo advantages need at least 2 completions per group, got G={g}")
    if g < 2:
        # A single completion is always an "all-equal" group; the unbiased std is
        # undefined (division by G-1 = 0), so return zeros without computing it.
        return torch.zeros_like(rewards)

    centered = rewards - rewards.mean(dim=1, keepdim=True)  # r_i - mean_g
    if mode == "group_norm":
        std = rewards.std(dim=1, keepdim=True, correction=1)  # sqrt(sum (r-mean)^2 / (G-1))
        adv = centered / (std + eps)
    elif mode == "mean_only":
        adv = centered
    else:  # loo: r_i - mean_{j!=i} r_j == G/(G-1) * (r_i - mean_g)
        adv = centered * (g / (g - 1))

    # Force exact zeros for all-equal groups: floating-point mean of equal values
    # need not round-trip exactly (e.g. three copies of 0.1), which would leak tiny
    # non-zero advantages that group_norm could then amplify by 1/eps.
    keep = informative_groups(rewards).unsqueeze(1)
    return torch.where(keep, adv, torch.zeros_like(adv))
