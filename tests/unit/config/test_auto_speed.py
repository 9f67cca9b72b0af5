"""``auto`` for dist.compile and algo.packing: on exactly where they were measured to pay
(full parameters, one GPU, DDP or FSDP2, on a GPU of capability 8.0+; packing also in half
precision with the varlen kernel), as given when set, and validated at load."""

from __future__ import annotations

import dataclasses

import pytest

from grpo_hpc.config import speed as auto_speed
from grpo_hpc.config.load import build_config
from grpo_hpc.config.speed import Where, compile_on, packing_on
from grpo_hpc.core.errors import ConfigError

H100 = Where(cuda=True, capability=(9, 0), precision="bf16", lora=False, varlen=True)


@pytest.mark.parametrize(
    ("change", "compiled", "packed"),
    [
        ({}, True, True),
        ({"capability": (8, 0)}, True, True),  # A100
        ({"capability": (7, 0), "precision": "fp16"}, False, False),  # V100 (Supercloud)
        ({"precision": "fp32"}, True, False),  # the varlen kernel takes half precision only
        ({"varlen": False}, True, False),  # a torch without varlen attention
        ({"lora": True}, False, False),
        ({"cuda": False, "capability": (0, 0), "precision": "fp32"}, False, False),  # CPU
    ],
)
def test_auto_is_on_only_where_measured(change: dict, compiled: bool, packed: bool) -> None:
    where = dataclasses.replace(H100, **change)
    assert compile_on("auto", where) is compiled
    assert packing_on("auto", where) is packed


def test_explicit_settings_are_taken_as_given() -> None:
    cpu = dataclasses.replace(H100, cuda=False, capability=(0, 0))
    assert compile_on(True, cpu) and packing_on(True, cpu)
    assert not compile_on(False, H100) and not packing_on(False, H100)


def test_resolve_replaces_auto_and_leaves_the_input() -> None:
    cfg = build_config("tiny", ["dist.compile=false"])
    assert cfg.algo.packing == "auto"
    out = auto_speed.resolve(cfg, H100)
    assert out.dist.compile is False and out.algo.packing is True
    assert cfg.algo.packing == "auto"  # a copy
    said = "[Speed] dist.compile=false, algo.packing=true (auto), dist.deterministic_kernels=true"
    assert auto_speed.describe(cfg, out) == said


def test_kernels_by_rule_on_a_gpu_only() -> None:
    """``dist.deterministic_kernels`` sets Inductor's deterministic mode where the trainer
    compiles (a CUDA device; setting the flag needs no GPU) and leaves it alone on a CPU."""
    import torch
    import torch._inductor.config as inductor_config

    from grpo_hpc.train.distributed.dist import choose_kernels_by_rule

    before = inductor_config.deterministic
    try:
        inductor_config.deterministic = False
        choose_kernels_by_rule(torch.device("cpu"), True)
        assert inductor_config.deterministic is False
        choose_kernels_by_rule(torch.device("cuda", 0), True)
        assert inductor_config.deterministic is True
        choose_kernels_by_rule(torch.device("cuda", 0), False)
        assert inductor_config.deterministic is False
    finally:
        inductor_config.deterministic = before


@pytest.mark.parametrize("override", ["algo.packing=sometimes", "dist.compile=maybe"])
def test_a_bad_value_is_one_clear_error(override: str) -> None:
    with pytest.raises(ConfigError, match="is not one of true, false, auto"):
        build_config("tiny", [override])


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        ({}, False),  # H100, bf16
        ({"capability": (8, 0)}, False),  # A100
        ({"capability": (7, 0)}, True),  # V100 asked for bf16 (a command-line override)
        ({"capability": (7, 0), "precision": "fp16"}, False),  # what supercloud runs
        ({"capability": (7, 0), "precision": "fp32"}, False),
        ({"cuda": False, "capability": (0, 0)}, False),  # the trainer refuses half on a CPU
    ],
)
def test_bf16_is_refused_on_a_gpu_without_it(change: dict, refused: bool) -> None:
    why = auto_speed.precision_problem(dataclasses.replace(H100, **change))
    assert (why is not None) is refused
    if refused:
        assert "compute capability 7.0" in why and "dist.precision=fp16" in why


def test_auto_packing_stays_off_for_attention_it_cannot_honour() -> None:
    """Gemma 2's attention logits are soft-capped: the packed attention would refuse it at
    the first forward, so ``auto`` leaves packing off there (compiling is unaffected)."""
    gemma2 = {"model_type": "gemma2", "attn_logit_softcapping": 50.0}
    assert "soft-capping" in (auto_speed.packing_problem(gemma2) or "")
    assert (
        auto_speed.packing_problem({"model_type": "gemma2", "attn_logit_softcapping": None}) is None
    )
    assert auto_speed.packing_problem(None) is None  # config.json not on this machine
    capped = dataclasses.replace(H100, packable=False)
    assert packing_on("auto", H100) and not packing_on("auto", capped)
    assert packing_on(True, capped)  # explicit: taken as given (refused at the forward)
    assert compile_on("auto", capped)
