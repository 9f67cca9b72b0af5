"""rollout.seed_per_group's parts (train/rollout/per_group.py): the seeds, the batch of the
groups' batches, and one generate call per group under its own seed. The whole run on
4 -> 2 -> 4 processes: tests/e2e/test_resize_resume.py."""

from __future__ import annotations

import torch

from grpo_hpc.train.rollout.per_group import concat, generate_per_group, group_seed
from grpo_hpc.train.rollout.types import RolloutBatch


def batch(prompt: list[int], completions: list[list[int]], pad: int = 0) -> RolloutBatch:
    """Rows of one prompt (no padding: a group shares it) and its completions, right-padded."""
    c = max(len(x) for x in completions)
    comp = torch.tensor([x + [pad] * (c - len(x)) for x in completions])
    cmask = torch.tensor([[1] * len(x) + [0] * (c - len(x)) for x in completions])
    p = torch.tensor([prompt] * len(completions))
    return RolloutBatch(torch.cat([p, comp], 1), torch.cat([torch.ones_like(p), cmask], 1),
                        cmask, len(prompt), ["t"] * len(completions), pad,
                        torch.ones(len(completions), dtype=torch.bool))  # fmt: skip


def test_group_seeds_depend_on_the_data_order_only() -> None:
    seeds = {group_seed(7, draw, g) for draw in (0, 4, 8) for g in range(4)}
    assert len(seeds) == 12 and all(0 <= s < 2**63 for s in seeds)
    assert group_seed(7, 4, 1) == group_seed(7, 4, 1) != group_seed(8, 4, 1)


def test_concat_pads_prompts_left_and_completions_right() -> None:
    a = batch([5, 6, 7], [[1, 2], [3]])
    b = batch([9], [[4, 4, 4, 4]])
    out = concat([a, b])
    assert out.prompt_len == 3 and out.input_ids.shape == (3, 3 + 4)
    assert out.input_ids.tolist() == [[5, 6, 7, 1, 2, 0, 0], [5, 6, 7, 3, 0, 0, 0],
                                      [0, 0, 9, 4, 4, 4, 4]]  # fmt: skip
    assert out.attention_mask.tolist()[2] == [0, 0, 1, 1, 1, 1, 1]
    assert out.completion_mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert out.texts == ["t"] * 3 and out.finished.tolist() == [True] * 3


def test_each_group_draws_from_its_own_seed_and_the_caller_s_stream_is_untouched() -> None:
    heard: list[list[int]] = []

    def sample(prompts: list[str], g: int, on_done=None) -> RolloutBatch:  # noqa: ANN001
        draws = torch.randint(10, 99, (g, 2)).tolist()  # the engine's sampling
        if on_done is not None:
            on_done(list(range(g)), draws)
        return batch([len(prompts[0])], draws)

    torch.manual_seed(0)
    before = torch.get_rng_state()
    two = generate_per_group(sample, ["a", "bb"], 3, [11, 22], on_done=lambda r, t: heard.append(r))
    assert torch.equal(torch.get_rng_state(), before)
    assert heard == [[0, 1, 2], [3, 4, 5]]  # row indices in the whole batch
    one = generate_per_group(sample, ["bb"], 3, [22])  # the second group alone, as on 2x ranks
    assert torch.equal(two.input_ids[3:], one.input_ids)
