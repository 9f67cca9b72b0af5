"""The LM head's weight gradient on the GPU: one GEMM adds each chunk's bf16 product into
the fp32 sum (``logp_head.accumulate_product``), at least as exact as a product rounded
to bf16 and added after, and the head's gradients still those of an fp32 reference."""

from __future__ import annotations

import pytest
import torch

from grpo_hpc.train.algo import logp_head

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_one_gemm_accumulates_at_least_as_exactly_as_product_then_add() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(4096, 512, device="cuda", generator=g).bfloat16()
    b = torch.randn(512, 1024, device="cuda", generator=g).bfloat16()
    start = torch.randn(4096, 1024, device="cuda", generator=g)
    assert logp_head._gemm_accumulates(start, a)  # the fused path is the one under test
    exact = start.double() + a.double() @ b.double()
    fused = start.clone()
    logp_head.accumulate_product(fused, a, b)
    two_pass = start.clone().add_(a @ b)
    err_fused = (fused.double() - exact).abs().max().item()
    err_two = (two_pass.double() - exact).abs().max().item()
    assert err_fused <= err_two
    assert err_fused < 1e-3  # fp32 sum of exact bf16 products


def test_head_gradients_under_bf16_autocast_match_fp32() -> None:
    g = torch.Generator(device="cuda").manual_seed(1)
    n, hidden, vocab = 3000, 256, 5000  # three chunks of 1,024 and a partial one
    h = torch.randn(n, hidden, device="cuda", generator=g, requires_grad=True)
    w = (0.05 * torch.randn(vocab, hidden, device="cuda", generator=g)).requires_grad_()
    ids = torch.randint(0, vocab, (n,), device="cuda", generator=g)
    upstream = torch.randn(n, device="cuda", generator=g)

    def grads(autocast: bool) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
            logp, _ = logp_head.linear_logp(h, w, ids)
        gh, gw = torch.autograd.grad((logp * upstream).sum(), (h, w))
        return gh, gw

    (ref_h, ref_w), (bf_h, bf_w) = grads(False), grads(True)
    assert bf_w.dtype == torch.float32
    cos = torch.nn.functional.cosine_similarity
    assert cos(bf_w.flatten(), ref_w.flatten(), dim=0) > 0.999
    assert cos(bf_h.flatten(), ref_h.flatten(), dim=0) > 0.999
