"""The fused log-prob head with a frozen weight (LoRA): same input gradient, and no
[vocab, hidden] weight-gradient accumulator (grpo_hpc.memory.estimate counts none)."""

from __future__ import annotations

import torch

from grpo_hpc.train.algo.logp_head import linear_logp


def test_frozen_head_gives_the_same_input_gradient() -> None:
    torch.manual_seed(0)
    h = torch.randn(37, 16, dtype=torch.float64)
    w = torch.randn(50, 16, dtype=torch.float64)
    ids = torch.randint(0, 50, (37,))
    grads = []
    for trainable in (True, False):
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_(trainable)
        logp, _ = linear_logp(hh, ww, ids, chunk=8)
        (logp * torch.linspace(-1, 1, 37, dtype=torch.float64)).sum().backward()
        grads.append(hh.grad)
        assert (ww.grad is not None) == trainable
    torch.testing.assert_close(grads[0], grads[1])
    ref = torch.log_softmax(h @ w.T, -1).gather(1, ids[:, None])[:, 0]
    torch.testing.assert_close(linear_logp(h, w, ids, chunk=8)[0], ref)
