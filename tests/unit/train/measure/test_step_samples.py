"""Which completions of a step go to samples.jsonl (tracking.step_samples, pure)."""

from __future__ import annotations

import torch

from grpo_hpc.train.algo.batching import Scored
from grpo_hpc.train.measure.tracking import step_samples
from grpo_hpc.train.rollout.types import RolloutBatch


def _scored(texts: list[str], questions: list[str], g: int) -> Scored:
    n = len(texts)
    cmask = torch.tensor([[1] * (i % 3 + 1) + [0] * (3 - i % 3 - 1) for i in range(n)])
    batch = RolloutBatch(
        input_ids=torch.zeros(n, 5, dtype=torch.long),
        attention_mask=torch.ones(n, 5, dtype=torch.long),
        completion_mask=cmask,
        prompt_len=2,
        texts=texts,
        finished=torch.tensor([i % 2 == 0 for i in range(n)]),
    )
    rewards = torch.arange(n, dtype=torch.float32).view(-1, g)
    return Scored(batch, rewards, {}, {}, questions)


def test_first_completion_of_each_group_first_groups_first_across_rounds() -> None:
    a = _scored(["a0", "a1", "b0", "b1"], ["qa", "qb"], g=2)
    b = _scored(["c0", "c1"], ["qc"], g=2)
    rows = step_samples(7, [a, b], 3)
    assert [r["completion"] for r in rows] == ["a0", "b0", "c0"]
    assert [r["question"] for r in rows] == ["qa", "qb", "qc"]
    assert [r["reward"] for r in rows] == [0.0, 2.0, 0.0]
    assert [r["tokens"] for r in rows] == [1, 3, 1]
    assert [r["finished"] for r in rows] == [True, True, True]
    assert {r["step"] for r in rows} == {7}


def test_zero_writes_nothing_and_fewer_groups_than_asked_write_what_there_is() -> None:
    a = _scored(["a0", "a1"], ["qa"], g=2)
    assert step_samples(1, [a], 0) == []
    assert len(step_samples(1, [a], 5)) == 1
