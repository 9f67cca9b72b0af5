"""``rollout.steps_per_generation`` (several steps' batches from one rollout), its pure
parts: the schedule's decision at each step, what the config refuses, and the cut of a
rollout's rows into one step's batch. The real trainer runs it in
tests/e2e/test_async_grouped.py."""

from __future__ import annotations

import pytest
import torch

from grpo_hpc.config.schema import Config
from grpo_hpc.config.validate import grouped_problem
from grpo_hpc.train.rollout.schedule import Made, Plan, grouped_plan
from grpo_hpc.train.rollout.types import RolloutBatch, row_range


def _made(*triples: tuple[int, int, int]) -> list[Made]:
    return [Made(step, version, lineage) for step, version, lineage in triples]


@pytest.mark.parametrize(
    ("step", "k", "m", "made", "end", "depth", "expected"),
    [
        # the first step: its batch and the next two, all by version 0, now
        (0, 2, 3, [], None, None, Plan((), True, (1, 2))),
        # the group's later steps train what was made: nothing generated
        (1, 2, 3, _made((1, 0, 0), (2, 0, 0)), None, None, Plan((), False, ())),
        (2, 2, 3, _made((2, 0, 0)), None, None, Plan((), False, ())),
        # the next group starts where the last ran out
        (3, 2, 3, [], None, None, Plan((), True, (4, 5))),
        # not past the run's end
        (4, 2, 3, [], 6, None, Plan((), True, (5,))),
        (5, 2, 3, [], 6, None, Plan((), True, ())),
        # synchronous after a rollback (depth 0): what was made still trains, then one
        # batch a rollout
        (2, 2, 3, _made((2, 0, 0)), None, 0, Plan((), False, ())),
        (5, 2, 3, [], None, 0, Plan((), True, ())),
        # resumed with a smaller bound: a batch 2 stale under k = 1 is made again, with its
        # group's next step
        (2, 1, 2, _made((2, 0, 0)), None, None, Plan((2,), True, (3,))),
    ],
)
def test_the_grouped_schedule(
    step: int, k: int, m: int, made: list[Made], end: int | None, depth: int | None,
    expected: Plan,
) -> None:  # fmt: skip
    assert grouped_plan(step, k, m, 0, made, end, depth) == expected


def test_a_rollback_drops_the_abandoned_lines_batches() -> None:
    got = grouped_plan(2, 2, 3, 1, _made((2, 0, 0)), None, None)
    assert got == Plan((2,), True, (3, 4))


def _cfg(m: int, k: int, **rollout: object) -> Config:
    cfg = Config()
    cfg.algo.max_staleness = k
    cfg.rollout.steps_per_generation = m
    for key, value in rollout.items():
        setattr(cfg.rollout, key, value)
    return cfg


@pytest.mark.parametrize(
    ("m", "k", "rollout", "says"),
    [
        (1, 0, {}, None),
        (2, 1, {}, None),
        (3, 2, {}, None),
        (3, 4, {}, None),
        (0, 0, {}, "must be >= 1"),
        (2, 0, {}, "set algo.max_staleness=1 or more"),
        (3, 1, {}, "set algo.max_staleness=2 or more"),
        (2, 2, {"partial_pool": 2}, "rollout.partial_pool"),
        (2, 1, {"placement": "split"}, "rollout.placement=split"),
        (2, 1, {"dynamic_sampling": True}, "rollout.dynamic_sampling"),
        (2, 1, {"seed_per_group": True}, "rollout.seed_per_group"),
    ],
)
def test_what_grouped_generation_refuses(m: int, k: int, rollout: dict, says: str | None) -> None:
    problem = grouped_problem(_cfg(m, k, **rollout))
    if says is None:
        assert problem is None
    else:
        assert problem is not None and says in problem and "\n" not in problem


def test_a_steps_rows_are_cut_out_with_their_own_width() -> None:
    """Rows ``[lo, hi)`` keep their prompt columns and lose the completion columns none of
    them uses; every per-row field follows."""
    p, c = 3, 5
    ids = torch.arange(4 * (p + c)).view(4, p + c)
    cmask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    amask = torch.cat([torch.ones(4, p, dtype=torch.long), cmask], 1)
    logp = -cmask.float()
    batch = RolloutBatch(ids, amask, cmask, p, ["a", "b", "c", "d"], 0,
                         torch.tensor([True, False, True, True]), logp)  # fmt: skip
    part = row_range(batch, 2, 4)
    assert part.texts == ["c", "d"] and part.prompt_len == p
    assert torch.equal(part.input_ids, ids[2:4, : p + 3])
    assert torch.equal(part.completion_mask, cmask[2:4, :3])
    assert torch.equal(part.attention_mask, amask[2:4, : p + 3])
    assert part.finished.tolist() == [True, True]
    assert torch.equal(part.sampled_logp, logp[2:4, :3])
    assert row_range(batch, 0, 1).completion_mask.shape == (1, 5)
