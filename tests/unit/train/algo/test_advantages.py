"""Group-relative advantages, pinned to hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_hpc.train.algo.advantages import group_advantages, informative_groups

MODES = ("group_norm", "mean_only", "loo")


def test_group_norm_uses_unbiased_std() -> None:
    # r = [1, 0, 0, 1]: mean 0.5, r - mean = [+.5, -.5, -.5, +.5]
    # unbiased var = (4 * 0.25) / (4 - 1) = 1/3 -> std = sqrt(1/3) = 0.577350
    # A = 0.5 / (0.577350 + 1e-4) = 0.865875   (biased std 0.5 would give exactly 1.0)
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert a == pytest.approx(0.8658754, abs=1e-7)
    torch.testing.assert_close(adv, torch.tensor([[a, -a, -a, a]]), atol=1e-6, rtol=0)
    # eps = 0: exactly sqrt(3)/2 = 0.866025
    adv0 = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), eps=0.0)
    s = math.sqrt(3) / 2
    torch.testing.assert_close(adv0, torch.tensor([[s, -s, -s, s]]))


def test_group_norm_skewed_group() -> None:
    # r = [0, 0, 0, 1]: mean 0.25, r - mean = [-.25, -.25, -.25, .75]
    # unbiased var = (3 * 0.0625 + 0.5625) / 3 = 0.75 / 3 = 0.25 -> std 0.5
    # A = [-0.5, -0.5, -0.5, 1.5] (eps = 0)
    adv = group_advantages(torch.tensor([[0.0, 0.0, 0.0, 1.0]]), eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([[-0.5, -0.5, -0.5, 1.5]]))


def test_mean_only_dr_grpo() -> None:
    # [1, 0, 0, 1] - 0.5 = [.5, -.5, -.5, .5];  [3, 1, 2] - 2 = [1, -1, 0]
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), mode="mean_only")
    torch.testing.assert_close(adv, torch.tensor([[0.5, -0.5, -0.5, 0.5]]))
    adv = group_advantages(torch.tensor([[3.0, 1.0, 2.0]]), mode="mean_only")
    torch.testing.assert_close(adv, torch.tensor([[1.0, -1.0, 0.0]]))


def test_loo_rloo() -> None:
    # [1, 0, 0]: 1 - mean(0, 0) = 1;  0 - mean(1, 0) = -0.5 (twice)
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0]]), mode="loo")
    torch.testing.assert_close(adv, torch.tensor([[1.0, -0.5, -0.5]]))
    # [1, 0, 0, 1]: 1 - mean(0, 0, 1) = 2/3;  0 - mean(1, 0, 1) = -2/3
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), mode="loo")
    t = 2 / 3
    torch.testing.assert_close(adv, torch.tensor([[t, -t, -t, t]]))


def test_several_groups_are_independent() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0], [0.0, 0.0, 0.0, 1.0]])
    adv = group_advantages(rewards, eps=0.0)
    s = math.sqrt(3) / 2
    expected = torch.tensor([[s, -s, -s, s], [0.0] * 4, [-0.5, -0.5, -0.5, 1.5]])
    torch.testing.assert_close(adv, expected)
    assert adv.shape == rewards.shape


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("value", [0.0, 1.0, 0.1, -3.7, 1e6])
def test_all_equal_group_is_exactly_zero(mode: str, value: float) -> None:
    # 0.1 is the tricky one: the float mean of [0.1]*3 need not equal 0.1 exactly.
    rewards = torch.full((2, 3), value)
    adv = group_advantages(rewards, mode=mode)
    assert torch.equal(adv, torch.zeros(2, 3))


def test_int_rewards_are_accepted() -> None:
    adv = group_advantages(torch.tensor([[1, 0, 0]]), mode="loo")
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor([[1.0, -0.5, -0.5]]))


def test_errors() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        group_advantages(torch.tensor([[1.0], [0.0]]), mode="loo")
    with pytest.raises(ValueError, match="unknown"):
        group_advantages(torch.zeros(1, 2), mode="nope")
    with pytest.raises(ValueError, match="shape"):
        group_advantages(torch.zeros(4))


def test_single_completion_groups_are_zero_outside_loo() -> None:
    rewards = torch.tensor([[1.0], [0.0]])
    for mode in ("group_norm", "mean_only"):
        assert torch.equal(group_advantages(rewards, mode=mode), torch.zeros(2, 1))


def test_informative_groups() -> None:
    rewards = torch.tensor(
        [[1.0, 0.0], [1.0, 1.0], [0.5, 0.5 + 1e-9], [0.5, 0.5 + 1e-6]], dtype=torch.float64
    )
    assert informative_groups(rewards).tolist() == [True, False, False, True]
