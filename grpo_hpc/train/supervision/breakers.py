"""Circuit breakers: when going on with a run cannot help, stop it (exit 3, checkpoint
saved) with a line that says why and what to change. Pure: the trainer feeds each step's
all-reduced metrics in, so every rank trips at the same step.

A broken rollout or reward (zero reward) is a breaker: no setting of the run helps. A run
that trains nothing because every completion is cut at the cap under the overlong mask
(``training.cut_off_patience``) is a collapse: the collapse detector's ``all_cut`` signal
(grpo_hpc/train/supervision/collapse.py), acted on as ``training.on_collapse`` says
(``stop``, the default, is this breaker's former behaviour: exit 3, checkpoint saved)."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_hpc.config.schema import Config


@dataclass(frozen=True)
class Streaks:
    """Consecutive steps, up to the last one, of each condition a breaker watches."""

    zero_reward: int = 0
    """Mean reward exactly 0 (a dead rollout or reward: ``training.zero_reward_patience``)."""

    def after(self, reward_mean: float) -> Streaks:
        """The streaks once a step with this mean reward has run."""
        return Streaks(zero_reward=self.zero_reward + 1 if reward_mean == 0 else 0)


def tripped(streaks: Streaks, cfg: Config) -> str | None:
    """Why the run must stop now, or None."""
    t = cfg.training
    if t.zero_reward_patience and streaks.zero_reward >= t.zero_reward_patience:
        return (
            f"mean reward was 0 for {streaks.zero_reward} consecutive steps: the rollout or "
            "reward is broken (check the model, the prompts and the reward function)"
        )
    return None
