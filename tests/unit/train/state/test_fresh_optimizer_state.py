"""A checkpoint saved before the first optimizer step (every step so far skipped its zero
gradient: ``optim.skip_empty_steps``) gives the optimizer the state its first step starts
from (``checkpoint.fresh_optimizer_state``): the next real step must compute exactly what
it computes from torch's own lazy start, or a run that saved early would part from one
that did not. Real optimizers (torch's AdamW, torchao's AdamW8bit), real steps."""

from __future__ import annotations

import pytest
import torch

from grpo_hpc.train.state.checkpoint import fresh_optimizer_state


def _model_and_optimizer(foreach: bool, wd: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    model[2].bias.requires_grad_(False)  # a frozen parameter gets no state either way
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=1e-2,
        betas=(0.9, 0.99),
        weight_decay=wd,
        foreach=foreach,
    )
    return model, opt


def _real_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    _real_step_on(model, opt, "cpu")


def _real_step_on(model: torch.nn.Module, opt: torch.optim.Optimizer, device: str) -> None:
    x = torch.linspace(-1, 1, 24, device=device).reshape(4, 6)
    model(x).pow(2).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_the_first_real_step_is_the_same_as_from_a_lazy_start(foreach: bool, wd: float) -> None:
    lazy_model, lazy = _model_and_optimizer(foreach, wd)
    early_model, early = _model_and_optimizer(foreach, wd)
    before = [p.detach().clone() for p in early_model.parameters()]

    fresh_optimizer_state(early)
    assert all(
        torch.equal(a, b) for a, b in zip(before, early_model.parameters(), strict=True)
    )  # no move
    assert all(float(s["step"]) == 0 for s in early.state.values())
    assert all(p.grad is None for p in early_model.parameters())

    for _ in range(2):
        _real_step(lazy_model, lazy)
        _real_step(early_model, early)
    for a, b in zip(lazy_model.parameters(), early_model.parameters(), strict=True):
        assert torch.equal(a, b)
    for key in ("step", "exp_avg", "exp_avg_sq"):
        for p_lazy, p_early in zip(lazy.state.values(), early.state.values(), strict=True):
            assert torch.equal(p_lazy[key], p_early[key]), key
    assert [g["lr"] for g in early.param_groups] == [1e-2]


def test_without_the_reset_the_first_step_would_differ() -> None:
    """The check can fail: a zero step left counted (torch's get_state_dict does that)
    changes AdamW's bias correction, so the weights after the first real step differ."""
    lazy_model, lazy = _model_and_optimizer(False, 0.0)
    early_model, early = _model_and_optimizer(False, 0.0)
    fresh_optimizer_state(early)
    for s in early.state.values():
        s["step"] += 1
    _real_step(lazy_model, lazy)
    _real_step(early_model, early)
    assert any(
        not torch.equal(a, b)
        for a, b in zip(lazy_model.parameters(), early_model.parameters(), strict=True)
    )


@pytest.mark.slow
def test_torchaos_8bit_adamw_starts_the_same() -> None:
    """``optim.state=int8`` (torchao's AdamW8bit, its step compiled): the same two real steps
    from the fresh state and from the lazy start give the same weights and counts."""
    from torchao.optim import AdamW8bit

    def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 32)
        )
        return model, AdamW8bit(model.parameters(), lr=1e-2, betas=(0.9, 0.99))

    (lazy_model, lazy), (early_model, early) = make(), make()
    fresh_optimizer_state(early)
    x = torch.linspace(-1, 1, 256).reshape(4, 64)
    for _ in range(2):
        for model, opt in ((lazy_model, lazy), (early_model, early)):
            model(x).pow(2).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    pairs = zip(lazy_model.parameters(), early_model.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert [float(s["step"]) for s in early.state.values()] == [2.0] * 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fused_adamw_on_the_gpu_starts_the_same() -> None:
    """The trainer's AdamW on a GPU (``fused=True``: its step count a float32 tensor on the
    device): the same two real steps from the fresh state and from the lazy start agree.
    (Passed on one H100, 2026-12-06: bench/results/gpu_tests_fresh_state_h100_2026-12-06.log.)"""

    def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
        model = model.cuda()
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)

    (lazy_model, lazy), (early_model, early) = make(), make()
    fresh_optimizer_state(early)
    assert all(s["step"].device.type == "cuda" for s in early.state.values())
    for _ in range(2):
        _real_step_on(lazy_model, lazy, "cuda")
        _real_step_on(early_model, early, "cuda")
    pairs = zip(lazy_model.parameters(), early_model.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
