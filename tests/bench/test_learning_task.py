"""bench/sums_task.py: the reward and problems both systems of bench/learning/run.py get."""

from __future__ import annotations

import argparse

from bench.sums_task import REWARD, SYSTEM, data_config, reward_config


def test_overlong_mask_zeroes_only_the_length_penalty() -> None:
    mask = reward_config(argparse.Namespace(overlong="mask"))
    penalty = reward_config(argparse.Namespace(overlong="penalty"))
    assert (mask.overlong, penalty.overlong) == (0.0, 0.5)
    for cfg in (mask, penalty):
        assert (cfg.correctness, cfg.format, cfg.require_marker) == (1.0, 0.2, False)
    assert REWARD.overlong == 0.5  # the shared default is left as it was


def test_data_config_follows_the_command_line() -> None:
    cfg = data_config(argparse.Namespace(num_eval=64, terms=3))
    assert (cfg.source, cfg.num_train, cfg.num_eval) == ("arithmetic", 2000, 64)
    assert (cfg.min_terms, cfg.max_terms, cfg.max_operand) == (3, 3, 20)
    assert cfg.system_prompt == SYSTEM
