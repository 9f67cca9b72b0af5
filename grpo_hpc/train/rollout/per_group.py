"""``rollout.seed_per_group``: each prompt group sampled from its own random stream, one
group per generate call, so that the completions do not depend on how many ranks share
the step (a run resumed on fewer or more nodes continues as it would have).

A group's seed comes from the run's seed and its place in the data order (the sampler's
draw before the step's ``take`` and the group's global index in it), never from the rank:
rank r of W holds groups ``r*k .. r*k+k-1`` of the same global draw on any W. Each group
decodes alone (no padding shared with other prompts), under ``torch.random.fork_rng``, so
the rank's own random state is left as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from grpo_hpc.train.rollout.types import OnRows, RolloutBatch

MASK = (1 << 63) - 1


def group_seed(seed: int, draw: int, group: int) -> int:
    """The seed of the group at global index ``group`` of the step whose prompts were drawn
    from position ``draw`` of the data order (pure; a splitmix64-style mix, so nearby
    groups get unrelated streams)."""
    z = (seed * 0x9E3779B97F4A7C15 + draw * 0xBF58476D1CE4E5B9 + group) & ((1 << 64) - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (z ^ (z >> 31)) & MASK


def concat(batches: list[RolloutBatch]) -> RolloutBatch:
    """One batch of the groups' batches, rows in order: prompts left-padded to the longest
    prompt, completions right-padded to the longest completion."""
    p = max(b.prompt_len for b in batches)
    c = max(b.completion_mask.shape[1] for b in batches)
    pad = batches[0].pad_token_id
    ids, att, comp, logp = [], [], [], []
    for b in batches:
        n, width = b.input_ids.shape[0], b.completion_mask.shape[1]
        left, right = p - b.prompt_len, c - width
        ids.append(torch.nn.functional.pad(b.input_ids, (left, right), value=pad))
        att.append(torch.nn.functional.pad(b.attention_mask, (left, right), value=0))
        comp.append(torch.nn.functional.pad(b.completion_mask, (0, right), value=0))
        if b.sampled_logp is not None:
            logp.append(torch.nn.functional.pad(b.sampled_logp, (0, right), value=0.0))
        assert b.input_ids.shape[1] == b.prompt_len + width, (n, b.prompt_len, width)
    finished = [b.finished for b in batches]
    return RolloutBatch(
        input_ids=torch.cat(ids),
        attention_mask=torch.cat(att),
        completion_mask=torch.cat(comp),
        prompt_len=p,
        texts=[t for b in batches for t in b.texts],
        pad_token_id=pad,
        finished=torch.cat(finished) if all(f is not None for f in finished) else None,
        sampled_logp=torch.cat(logp) if len(logp) == len(batches) else None,
    )


def _shifted(hear: OnRows | None, offset: int) -> OnRows | None:
    """A row listener for one group's call, told the rows' places in the whole batch."""
    if hear is None:
        return None
    return lambda rows, tokens: hear([r + offset for r in rows], tokens)


def generate_per_group(
    generate: Callable[..., RolloutBatch],
    prompts: list[str],
    g: int,
    seeds: list[int],
    **hand: Any,
) -> RolloutBatch:
    """``generate(prompts, g, **hand)`` one prompt at a time, each under its own seed."""
    cuda = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    out = []
    for i, (prompt, seed) in enumerate(zip(prompts, seeds, strict=True)):
        mine = {k: _shifted(v, i * g) for k, v in hand.items()}
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(seed)
            out.append(generate([prompt], g, **{k: v for k, v in mine.items() if v}))
    return concat(out)
