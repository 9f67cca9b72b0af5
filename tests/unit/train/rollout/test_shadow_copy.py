"""An asynchronous run's generating copy (the shadow, ``making.plain_copy``) of a LoRA
policy shares the frozen base with the policy and copies only what trains: the tiny model
loaded and prepared as the trainer does (``setup.loading``), then an update and the copy of
the weights (``copy_full_weights``) as each step makes them."""

from __future__ import annotations

from pathlib import Path

import torch

from grpo_hpc.config.load import build_config
from grpo_hpc.train.distributed import dist
from grpo_hpc.train.distributed.gather import copy_full_weights
from grpo_hpc.train.setup import autos, loading, models


def _policy(tmp_path: Path, *overrides: str) -> loading.Policy:
    info = dist.DistInfo()
    cfg = autos.resolve(
        build_config(
            "tiny", ["algo.max_staleness=1", "model.attn_implementation=sdpa", *overrides]
        ),
        info,
    )
    model_dir = loading.model_directory(cfg, tmp_path, info)
    dtype = loading.load_dtype(cfg, info.device)
    model, _ = models.load_model_and_tokenizer(
        model_dir, cfg.model.attn_implementation, info.device, dtype=dtype
    )
    return loading.wrap_policy(model, cfg, info, async_thread=True)


def _update(model: torch.nn.Module) -> None:
    """What an optimizer step does to the policy: every trained tensor moves."""
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p))


def test_a_lora_copy_shares_the_frozen_base_and_copies_the_adapters(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "model.lora_rank=4")
    assert policy.shadow is not None
    mine = dict(dist.unwrap(policy.model).named_parameters())
    theirs = dict(policy.shadow.named_parameters())
    assert mine.keys() == theirs.keys()
    trained = {n for n, p in mine.items() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    frozen = mine.keys() - trained
    assert frozen and all(theirs[n] is mine[n] for n in frozen)  # the same tensors
    assert all(theirs[n].data_ptr() != mine[n].data_ptr() for n in trained)
    before = {n: theirs[n].clone() for n in trained}
    _update(dist.unwrap(policy.model))
    # version t's copy keeps its adapters while the policy trains
    assert all(torch.equal(theirs[n], before[n]) for n in trained)
    copy_full_weights(dist.unwrap(policy.model), policy.shadow)
    state, copied = dist.unwrap(policy.model).state_dict(), policy.shadow.state_dict()
    assert state.keys() == copied.keys()
    assert all(torch.equal(state[k], copied[k]) for k in state)
    assert not any(p.requires_grad for p in policy.shadow.parameters())
    assert all(mine[n].requires_grad for n in trained)  # the policy still trains them


def test_a_full_parameter_copy_shares_nothing(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    assert policy.shadow is not None
    mine = list(dist.unwrap(policy.model).parameters())
    ptrs = {p.data_ptr() for p in mine}
    assert all(p.data_ptr() not in ptrs for p in policy.shadow.parameters())
    assert all(p.requires_grad for p in mine)
