"""Which AdamW implementation the trainer uses where, and when it skips a zero gradient (pure
decisions, pinned here; the GPU test ``tests/e2e/test_gpu.py::test_sharded_adamw_matches_unsharded``
steps the first for real, ``tests/e2e/test_skip_empty_steps.py`` the second's defaults)."""

from __future__ import annotations

import pytest
import torch

from grpo_hpc.config.schema import Config
from grpo_hpc.train.algo.optimization import _fused, skips_empty_steps
from grpo_hpc.train.distributed.dist import DistInfo


@pytest.mark.parametrize(
    ("device", "strategy", "offload", "fused"),
    [
        ("cuda", "ddp", False, True),
        # FSDP2 on the GPU: fused, not torch's default foreach, whose sqrt of the second
        # moments is a temporary as large as a whole fp32 state.
        ("cuda", "fsdp", False, True),
        ("cuda", "fsdp", True, False),  # the step runs on the CPU shards
        ("cpu", "ddp", False, False),
        ("cpu", "fsdp", False, False),
    ],
)
def test_fused_adamw_where_the_parameters_are_on_the_gpu(
    device: str, strategy: str, offload: bool, fused: bool
) -> None:
    cfg = Config()
    cfg.dist.strategy, cfg.dist.cpu_offload = strategy, offload
    assert _fused(DistInfo(0, 2, 0, torch.device(device)), cfg) is fused


@pytest.mark.parametrize(
    ("staleness", "setting", "skips"),
    [
        (0, None, False),  # synchronous, unset: AdamW steps on a zero gradient, as TRL's does
        (1, None, True),  # asynchronous, unset: no step (the learning benchmark's gain)
        (2, None, True),
        (0, True, True),  # as set, either way
        (1, False, False),
    ],
)
def test_zero_gradient_steps_are_skipped_by_default_in_asynchronous_runs(
    staleness: int, setting: bool | None, skips: bool
) -> None:
    cfg = Config()
    cfg.algo.max_staleness, cfg.optim.skip_empty_steps = staleness, setting
    assert skips_empty_steps(cfg) is skips
