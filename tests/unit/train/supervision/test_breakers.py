"""The circuit breakers' decision table (grpo_hpc.train.supervision.breakers); the real trainer
trips them in tests/e2e/test_trainer_behaviour.py. The cut-off breaker is now the collapse
detector's ``all_cut`` signal (tests/unit/train/supervision/test_collapse.py)."""

from __future__ import annotations

from dataclasses import replace

from grpo_hpc.config.schema import Config
from grpo_hpc.train.supervision.breakers import Streaks, tripped


def _cfg(zero: int = 0) -> Config:
    cfg = Config()
    cfg.training = replace(cfg.training, zero_reward_patience=zero)
    return cfg


def _run(rewards: list[float]) -> Streaks:
    s = Streaks()
    for reward in rewards:
        s = s.after(reward)
    return s


def test_streaks_count_consecutive_steps_and_reset() -> None:
    assert _run([0.0, 0.0]) == Streaks(zero_reward=2)
    assert _run([0.0, 0.2]) == Streaks(zero_reward=0)


def test_zero_reward_breaker_trips_at_its_patience_and_is_off_by_default() -> None:
    assert tripped(Streaks(zero_reward=3), _cfg(zero=4)) is None
    assert "mean reward was 0 for 4 consecutive steps" in (
        tripped(Streaks(zero_reward=4), _cfg(zero=4)) or ""
    )
    assert tripped(Streaks(zero_reward=50), _cfg(zero=0)) is None
    assert Config().training.zero_reward_patience == 0
