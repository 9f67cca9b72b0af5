"""The circuit breakers' decision table (grpo_hpc.train.supervision.breakers); the real trainer
trips them in tests/e2e/test_trainer_behaviour.py."""

from __future__ import annotations

from dataclasses import replace

from grpo_hpc.config.schema import Config
from grpo_hpc.train.supervision.breakers import Streaks, tripped


def _cfg(zero: int = 0, cut: int = 3) -> Config:
    cfg = Config()
    cfg.training = replace(cfg.training, zero_reward_patience=zero, cut_off_patience=cut)
    return cfg


def _run(steps: list[tuple[float, float]], masked: bool = True) -> Streaks:
    s = Streaks()
    for reward, truncated in steps:
        s = s.after(reward, truncated, masked)
    return s


def test_streaks_count_consecutive_steps_and_reset() -> None:
    assert _run([(0.0, 1.0), (0.0, 1.0)]) == Streaks(zero_reward=2, all_cut=2)
    assert _run([(0.0, 1.0), (0.2, 1.0)]) == Streaks(zero_reward=0, all_cut=2)
    assert _run([(0.0, 1.0), (0.0, 0.97)]) == Streaks(zero_reward=2, all_cut=0)
    # without the mask a cut-off completion still trains: no streak
    assert _run([(0.1, 1.0)] * 5, masked=False) == Streaks(zero_reward=0, all_cut=0)


def test_cut_off_breaker_trips_at_its_patience_and_names_the_fix() -> None:
    cfg = _cfg(cut=3)
    assert tripped(Streaks(all_cut=2), cfg) is None
    why = tripped(Streaks(all_cut=3), cfg)
    assert why is not None
    assert "rollout.max_new_tokens=48 for 3 consecutive steps" in why
    assert "raise rollout.max_new_tokens" in why
    assert tripped(Streaks(all_cut=50), _cfg(cut=0)) is None  # 0 disables


def test_zero_reward_breaker_comes_first_and_is_off_by_default() -> None:
    both = Streaks(zero_reward=4, all_cut=4)
    assert "mean reward was 0 for 4 consecutive steps" in (tripped(both, _cfg(zero=4)) or "")
    assert "rollout.max_new_tokens" in (tripped(both, _cfg(zero=0)) or "")
    assert Config().training.zero_reward_patience == 0
    assert Config().training.cut_off_patience == 10
