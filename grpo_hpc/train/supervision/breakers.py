"""Circuit breakers: when going on with a run cannot help, stop it (exit 3, checkpoint
saved) with a line that says why and what to change. Pure: the trainer feeds each step's
all-reduced metrics in, so every rank trips at the same step."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_hpc.config.schema import Config


@dataclass(frozen=True)
class Streaks:
    """Consecutive steps, up to the last one, of each condition a breaker watches."""

    zero_reward: int = 0
    """Mean reward exactly 0 (a dead rollout or reward: ``training.zero_reward_patience``)."""
    all_cut: int = 0
    """Every completion cut off at the length cap while ``algo.mask_truncated`` trains none
    of them, so the step trained nothing (``training.cut_off_patience``)."""

    def after(self, reward_mean: float, truncated: float, masked: bool) -> Streaks:
        """The streaks once a step with this mean reward and share of cut-off completions
        (``rollout/truncated``) has run; ``masked``: ``algo.mask_truncated``."""
        return Streaks(
            zero_reward=self.zero_reward + 1 if reward_mean == 0 else 0,
            all_cut=self.all_cut + 1 if masked and truncated >= 1.0 else 0,
        )


def tripped(streaks: Streaks, cfg: Config) -> str | None:
    """Why the run must stop now, or None."""
    t = cfg.training
    if t.zero_reward_patience and streaks.zero_reward >= t.zero_reward_patience:
        return (
            f"mean reward was 0 for {streaks.zero_reward} consecutive steps: the rollout or "
            "reward is broken (check the model, the prompts and the reward function)"
        )
    if t.cut_off_patience and streaks.all_cut >= t.cut_off_patience:
        return (
            f"every completion ran to rollout.max_new_tokens={cfg.rollout.max_new_tokens} "
            f"for {streaks.all_cut} consecutive steps and algo.mask_truncated trains none of "
            "them, so nothing trained: raise rollout.max_new_tokens (or set "
            "algo.mask_truncated=false)"
        )
    return None
