"""Group selection for the update: informative groups first, fixed count (pure)."""

from __future__ import annotations

import torch

from grpo_hpc.config.schema import AlgoConfig
from grpo_hpc.train.algo.batching import Scored, select_groups
from grpo_hpc.train.rollout.engines import RolloutBatch


def _scored(rewards: list[list[float]]) -> Scored:
    n = len(rewards) * len(rewards[0])
    batch = RolloutBatch(
        torch.arange(n).view(n, 1).repeat(1, 3),
        torch.ones(n, 3, dtype=torch.long),
        torch.ones(n, 1, dtype=torch.long),
        prompt_len=2,
        texts=[""] * n,
    )
    flat = [r for g in rewards for r in g]
    return Scored(batch, torch.tensor(rewards), {"correctness": flat})


def test_informative_groups_are_kept_first_then_flat_ones_fill_the_batch() -> None:
    first = _scored([[0.0, 0.0], [1.0, 0.0]])  # group 0 flat, group 1 informative
    second = _scored([[1.0, 1.0], [0.0, 1.0]])  # resampled round: group 1 informative
    sel = select_groups([first, second], want=3, g=2, algo=AlgoConfig(micro_batch_size=4))
    # Kept: round 0 group 1, round 1 group 1 (informative), then round 0 group 0 (flat).
    assert sel.rewards == [0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    advs = torch.cat([mb.advantages for mb in sel.microbatches])
    assert advs[:2].tolist() == [0.0, 0.0]  # the flat group adds no policy gradient
    assert advs[2] > 0 > advs[3] and advs[4] < 0 < advs[5]
    rows = [mb.rows.tolist() for mb in sel.microbatches]
    assert rows == [[0, 1, 2, 3], [2, 3]]  # micro-batches never mix two rollout batches


def test_fewer_groups_than_wanted_keeps_them_all() -> None:
    sel = select_groups([_scored([[1.0, 0.0]])], want=4, g=2, algo=AlgoConfig())
    assert len(sel.rewards) == 2 and sel.components["correctness"] == [1.0, 0.0]


def _with_cut(rewards: list[list[float]], finished: list[bool]) -> Scored:
    s = _scored(rewards)
    s.batch.finished = torch.tensor(finished)
    return s


def test_mask_truncated_drops_cut_rows_after_they_shaped_the_advantages() -> None:
    # Group 0: rows 0-3, row 1 cut off; group 1: rows 4-7, rows 6 and 7 cut off.
    rewards = [[1.0, -0.5, 0.0, 0.0], [1.0, 0.0, -0.5, -0.5]]
    finished = [True, False, True, True, True, True, False, False]
    kept = select_groups([_with_cut(rewards, finished)], 2, 4, AlgoConfig(mask_truncated=True))
    every = select_groups([_with_cut(rewards, finished)], 2, 4, AlgoConfig())
    assert [mb.rows.tolist() for mb in kept.microbatches] == [[0, 2, 3, 4, 5]]
    adv_all = torch.cat([mb.advantages for mb in every.microbatches])
    adv_kept = torch.cat([mb.advantages for mb in kept.microbatches])
    # The kept rows keep the advantages the whole group gave them (cut rows included).
    assert torch.equal(adv_kept, adv_all[[0, 2, 3, 4, 5]])
    assert kept.truncated == every.truncated == 3
    assert len(kept.rewards) == 8  # the step's reward still counts every completion


def test_all_rows_cut_leaves_one_micro_batch_that_trains_nothing() -> None:
    sel = select_groups(
        [_with_cut([[1.0, 0.0]], [False, False])], 1, 2, AlgoConfig(mask_truncated=True)
    )
    (mb,) = sel.microbatches
    assert mb.weight == 0.0 and mb.advantages.abs().max() == 0


def test_groups_whose_every_completion_earned_full_marks_are_counted_solved() -> None:
    """A solved group (all right) and a dead one (all wrong) are both flat; the step's
    count tells them apart for the collapse watch. Unknown full marks count as unsolved."""
    s = _scored([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [1.2, 1.0]])
    s.full = [True, True, False, False, True, False, True, True]  # group 3: right, not flat
    sel = select_groups([s], want=4, g=2, algo=AlgoConfig())
    assert (sel.groups, sel.solved) == (4, 1)
    unknown = select_groups([_scored([[1.0, 1.0]])], want=1, g=2, algo=AlgoConfig())
    assert (unknown.groups, unknown.solved) == (1, 0)
