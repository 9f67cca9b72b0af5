"""Partial rollouts' decisions (pure): which groups must finish in a round, when a round may
stop, which complete groups train, which are too stale, the staleness histogram of mixed
ages, the schedule's depth, and the config's refusals."""

from __future__ import annotations

import dataclasses

import pytest

from grpo_hpc.config.schema import Config
from grpo_hpc.config.validate import partial_problem
from grpo_hpc.train.rollout.partial import (
    Flight,
    PartialPool,
    choose,
    expired,
    must_finish,
    round_over,
)
from grpo_hpc.train.rollout.schedule import Made, Plan, plan, staleness_histogram


@pytest.mark.parametrize(
    ("version", "step", "k", "must"),
    [
        (-1, 5, 2, False),  # not started: starts now, at this round's weights
        (4, 5, 2, False),  # unfinished, it would train at 6 or later: 2 stale at 6
        (3, 5, 2, True),  # unfinished, 3 stale at 6: finish now
        (3, 5, 3, False),  # a bound of 3 lets it go on once more
        (2, 5, 3, True),
        (5, 5, 2, False),  # started by the round for step 5 made now (version 5)
    ],
)
def test_must_finish(version: int, step: int, k: int, must: bool) -> None:
    assert must_finish(version, step, k) is must


@pytest.mark.parametrize(
    ("complete", "must", "want", "over"),
    [
        ([True, True, False, False], [False] * 4, 2, True),
        ([True, False, False, False], [False] * 4, 2, False),  # too few complete
        ([True, True, True, False], [False, False, False, True], 2, False),  # an old one runs
        ([True, True, False, True], [False, False, False, True], 2, True),
        ([False, False, True, True], [True, True, False, False], 2, False),  # must ones first
        ([], [], 0, True),
    ],
)
def test_round_over(complete: list[bool], must: list[bool], want: int, over: bool) -> None:
    assert round_over(complete, must, want) is over


def test_the_oldest_complete_groups_train_in_pool_order() -> None:
    versions = [5, 4, 5, 4, 6]
    orders = [10, 8, 11, 9, 12]
    complete = [True, True, True, False, True]
    # version 4 first (index 1; index 3 is not complete), then version 5 by draw order
    assert choose(versions, orders, complete, 2) == [0, 1]
    assert choose(versions, orders, complete, 3) == [0, 1, 2]
    assert choose(versions, orders, complete, 9) == [0, 1, 2, 4]
    assert choose([7, 6], [1, 0], [True, True], 1) == [1]


@pytest.mark.parametrize(
    ("version", "step", "k", "too_stale"),
    [(-1, 9, 1, False), (7, 9, 2, False), (6, 9, 2, True), (9, 9, 0, False)],
)
def test_expired(version: int, step: int, k: int, too_stale: bool) -> None:
    assert expired(version, step, k) is too_stale


def test_a_histogram_of_groups_of_mixed_ages() -> None:
    row = staleness_histogram([1, 2, 2, 1], 8, 2)
    assert row == {"staleness/0": 0.0, "staleness/1": 16.0, "staleness/2": 16.0,
                   "staleness/max": 2.0}  # fmt: skip
    # a broken bound shows in a bucket past k
    assert staleness_histogram([3], 4, 2)["staleness/3"] == 4.0


def test_partial_rollouts_generate_one_step_ahead_and_keep_the_bound_for_continuations() -> None:
    # k = 2 with depth 1: at step 6 the batch of 7 exists (version 5... or 6 once made now)
    assert plan(6, 2, 0, [Made(6, 4, 0)], depth=1) == Plan((), False, (7,))
    assert plan(0, 2, 0, [], depth=1) == Plan((), True, (1,))
    # without depth: k steps ahead, as before
    assert plan(0, 2, 0, []) == Plan((), True, (1, 2))


def _cfg(**rollout: object) -> Config:
    cfg = Config()
    cfg.algo.max_staleness = int(rollout.pop("k", 2))  # type: ignore[call-overload]
    for key, value in rollout.items():
        setattr(cfg.rollout, key, value)
    return cfg


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"partial_pool": 0, "k": 0}, None),
        ({"partial_pool": 2}, None),
        ({"partial_pool": 3, "k": 4}, None),
        ({"partial_pool": 3, "k": 2}, "set rollout.partial_pool to at most 2"),
        ({"partial_pool": 1}, "must be 0 (off) or at least 2"),
        ({"partial_pool": -2}, "must be 0 (off) or at least 2"),
        ({"partial_pool": 2, "k": 1}, "set algo.max_staleness=2 or more"),
        ({"partial_pool": 2, "k": 0}, "set algo.max_staleness=2 or more"),
        ({"partial_pool": 2, "placement": "split"}, None),
        ({"partial_pool": 2, "dynamic_sampling": True}, "rollout.dynamic_sampling"),
        ({"partial_pool": 2, "seed_per_group": True}, "rollout.seed_per_group"),
    ],
)
def test_what_partial_rollouts_refuse(settings: dict, says: str | None) -> None:
    problem = partial_problem(_cfg(**settings))
    if says is None:
        assert problem is None
    else:
        assert problem is not None and says in problem and "\n" not in problem


def test_a_saved_pool_comes_back_bit_for_bit_and_reads_the_list_format() -> None:
    """The pool's state packs each row's tokens and log-probs as bytes: loaded again, every
    value is the same Python number (a log-prob no float32 holds included); a pool saved as
    plain lists (before packing) still loads."""
    f = Flight(7, [1, 2, 3], [[5, 2**40], []], [[-0.1, -1e-300], []], [True, False], 3, 1, 4)
    f.spans = [2, 0]
    pool = PartialPool(2, 2, [f], drawn=5)
    state = pool.state_dict()
    assert all(isinstance(r, bytes) for r in state["flights"][0]["rows"])
    back = PartialPool(2, 2)
    back.load_state_dict(state)
    assert back.flights == [f] and back.drawn == 5
    old = {"flights": [dataclasses.asdict(f)], "drawn": 5}
    listed = PartialPool(2, 2)
    listed.load_state_dict(old)
    assert listed.flights == [f]
