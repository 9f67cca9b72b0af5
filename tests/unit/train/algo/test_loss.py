"""GRPO/DAPO/Dr. GRPO loss pieces, pinned to hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_hpc.train.algo.loss import (
    aggregate,
    masked_mean,
    per_token_loss,
    selective_log_softmax,
    token_entropy,
)

MODES = ("sequence", "token", "constant")


def _naive_logp(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[..., None])[..., 0]


# --------------------------------------------------------------- selective_log_softmax


def test_selective_log_softmax_hand_value() -> None:
    # logits [0, ln 3] -> softmax [1/4, 3/4]; log p(id 1) = ln 0.75 = -0.287682
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    out = selective_log_softmax(logits, torch.tensor([[1]]))
    torch.testing.assert_close(out, torch.tensor([[math.log(0.75)]]))


@pytest.mark.parametrize("chunk", [1, 3, 1024])
def test_selective_log_softmax_fp32_matches_naive(chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=g) * 3
    ids = torch.randint(0, 50, (3, 7), generator=g)
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    out = selective_log_softmax(a, ids, chunk_size=chunk)
    ref = _naive_logp(b, ids)
    torch.testing.assert_close(out, ref)
    w = torch.randn(3, 7, generator=g)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_selective_log_softmax_bf16() -> None:
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 6, 64, generator=g) * 2).bfloat16()
    ids = torch.randint(0, 64, (2, 6), generator=g)
    out = selective_log_softmax(logits, ids, chunk_size=4)
    assert out.dtype == torch.float32
    # exact (fp32) on the same bf16 values: the upcast happens before the reduction
    torch.testing.assert_close(out, _naive_logp(logits.float(), ids))
    # within bf16 rounding of a naive all-bf16 log_softmax + gather (|logp| <~ 10)
    torch.testing.assert_close(out, _naive_logp(logits, ids).float(), atol=0.05, rtol=0.01)
    # gradient: bf16 dtype, close to the fp32 gradient
    a = logits.clone().requires_grad_()
    b = logits.float().requires_grad_()
    selective_log_softmax(a, ids, chunk_size=4).sum().backward()
    _naive_logp(b, ids).sum().backward()
    assert a.grad.dtype == torch.bfloat16
    torch.testing.assert_close(a.grad.float(), b.grad, atol=1e-2, rtol=1e-2)


def test_selective_log_softmax_gradcheck_and_noncontiguous() -> None:
    g = torch.Generator().manual_seed(2)
    full = torch.randn(2, 4, 5, dtype=torch.float64, generator=g)
    ids = torch.randint(0, 5, (2, 3), generator=g)
    logits = full[:, :-1].detach().requires_grad_()  # leaf for gradcheck
    assert torch.autograd.gradcheck(lambda z: selective_log_softmax(z, ids, 2), (logits,))
    view = full.requires_grad_()[:, :-1]  # non-contiguous view, as in logits[:, :-1]
    assert not view.is_contiguous()
    torch.testing.assert_close(selective_log_softmax(view, ids, 2), _naive_logp(view, ids))


def test_selective_log_softmax_shape_errors() -> None:
    with pytest.raises(ValueError):
        selective_log_softmax(torch.zeros(2, 3, 4), torch.zeros(2, 2, dtype=torch.long))


# ---------------------------------------------------------------------- token_entropy


def test_token_entropy_hand_values() -> None:
    # p = [1/4, 3/4]: H = 0.25 ln 4 + 0.75 ln(4/3) = 0.346574 + 0.215762 = 0.562335
    # uniform over 4: H = ln 4 = 1.386294;  [0, -inf]: deterministic, H = 0 (0 log 0 = 0)
    logits = torch.tensor(
        [
            [
                [0.0, math.log(3.0), -math.inf, -math.inf],
                [1.0, 1.0, 1.0, 1.0],
                [0.0] + [-math.inf] * 3,
            ]
        ]
    ).requires_grad_()
    h = token_entropy(logits, chunk_size=2)
    torch.testing.assert_close(h, torch.tensor([[0.5623351, math.log(4.0), 0.0]]))
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_token_entropy_matches_naive() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 5, 30, generator=g)
    p = logits.softmax(-1)
    ref = -(p * p.log()).sum(-1)
    for chunk in (1, 2, 1024):
        torch.testing.assert_close(token_entropy(logits, chunk), ref)
    torch.testing.assert_close(
        token_entropy(logits.bfloat16()), token_entropy(logits), atol=0.02, rtol=0
    )


# --------------------------------------------------------------------- per_token_loss


def test_clipping_both_sides() -> None:
    # old_logp = 0, so ratio = exp(logp). eps_low 0.2 -> [0.8, 1.28] <- eps_high 0.28.
    # tok  A   r     r*A    clip(r)*A     min     loss   clipped   dloss/dlogp
    # 0    2   1.5   3.0    1.28*2=2.56   2.56   -2.56   high      0
    # 1   -1   0.5  -0.5    0.8*-1=-0.8  -0.8     0.8    low       0
    # 2   -1   1.5  -1.5    1.28*-1=-1.28 -1.5    1.5    -         -A*r = 1.5
    # 3    2   0.5   1.0    0.8*2=1.6     1.0    -1.0    -         -A*r = -1.0
    # 4    1   1.1   1.1    1.1           1.1    -1.1    -         -1.1
    # 5    3   1.0   3.0    3.0           3.0    -3.0    -         -3.0
    ratio = torch.tensor([1.5, 0.5, 1.5, 0.5, 1.1, 1.0])
    adv = torch.tensor([2.0, -1.0, -1.0, 2.0, 1.0, 3.0])
    logp = ratio.log()[:, None].requires_grad_()
    loss, st = per_token_loss(logp, torch.zeros(6, 1), adv, eps_low=0.2, eps_high=0.28)
    expected = torch.tensor([-2.56, 0.8, 1.5, -1.0, -1.1, -3.0])[:, None]
    torch.testing.assert_close(loss, expected)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, 0.0, 1.5, -1.0, -1.1, -3.0])[:, None])
    assert st.is_clipped_high[:, 0].tolist() == [True, False, False, False, False, False]
    assert st.is_clipped_low[:, 0].tolist() == [False, True, False, False, False, False]
    torch.testing.assert_close(st.ratio, ratio[:, None])
    assert torch.equal(st.kl, torch.zeros(6, 1))


def test_on_policy_default_and_token_level_advantages() -> None:
    # old_logp None -> ratio 1 -> loss = -A, grad = -A
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    loss, st = per_token_loss(logp, None, torch.tensor([[1.0, 2.0], [-3.0, 0.0]]), 0.2, 0.2)
    torch.testing.assert_close(loss, torch.tensor([[-1.0, -2.0], [3.0, 0.0]]))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, -2.0], [3.0, 0.0]]))
    assert torch.equal(st.ratio, torch.ones(2, 2))


def test_k3_kl_value_and_gradient() -> None:
    # logp = ln .5, ref = ln .25: ref - logp = ln .5; k3 = .5 - ln .5 - 1 = 0.193147
    # logp = ln .25, ref = ln .5: ref - logp = ln 2;  k3 = 2 - ln 2 - 1 = 0.306853
    # logp = ref: k3 = 1 - 0 - 1 = 0
    # d k3 / d logp = 1 - exp(ref - logp) = [0.5, -1, 0]; A = 0 so loss = beta * k3
    logp = torch.tensor([[math.log(0.5), math.log(0.25), -1.0]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25), math.log(0.5), -1.0]])
    loss, st = per_token_loss(logp, None, torch.zeros(1), 0.2, 0.2, ref_logp=ref, beta=0.1)
    kl = torch.tensor([[0.1931472, 0.3068528, 0.0]])
    torch.testing.assert_close(st.kl, kl)
    torch.testing.assert_close(loss, 0.1 * kl)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.05, -0.1, 0.0]]))


def test_beta_zero_ignores_ref_but_reports_kl() -> None:
    logp = torch.tensor([[math.log(0.5), -2.0]])
    ref = torch.tensor([[math.log(0.25), -3.0]])
    adv = torch.tensor([1.5])
    with_ref, st = per_token_loss(logp, logp - 0.1, adv, 0.2, 0.28, ref_logp=ref, beta=0.0)
    without, _ = per_token_loss(logp, logp - 0.1, adv, 0.2, 0.28)
    assert torch.equal(with_ref, without)
    assert st.kl[0, 0].item() == pytest.approx(0.1931472, abs=1e-6)
    with pytest.raises(ValueError, match="ref_logp"):
        per_token_loss(logp, None, adv, 0.2, 0.2, beta=0.1)


# -------------------------------------------------------------------------- aggregate

# Ragged batch; 99 marks padding that must be ignored.
LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 99.0, 99.0], [7.0, 99.0, 99.0, 99.0]])
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)


def test_aggregate_hand_values() -> None:
    # per-sequence sums 10, 11, 7 over lengths 4, 2, 1 -> means 2.5, 5.5, 7.0
    # sequence: (2.5 + 5.5 + 7) / 3 = 5.0 ; token: 28 / 7 = 4.0 ; constant: 28 / (3*4) = 7/3
    assert aggregate(LOSS, MASK, "sequence").item() == pytest.approx(5.0)
    assert aggregate(LOSS, MASK, "token").item() == pytest.approx(4.0)
    assert aggregate(LOSS, MASK, "constant").item() == pytest.approx(7 / 3)
    # explicit normalisers: 15 / 6 = 2.5 ; 28 / 14 = 2.0 ; 28 / (3 * 8) = 7/6 ; 28 / (5*4)
    assert aggregate(LOSS, MASK, "sequence", num_sequences=6).item() == pytest.approx(2.5)
    assert aggregate(LOSS, MASK, "token", total_tokens=14).item() == pytest.approx(2.0)
    assert aggregate(LOSS, MASK, "constant", max_len=8).item() == pytest.approx(7 / 6)
    assert aggregate(LOSS, MASK, "constant", num_sequences=5).item() == pytest.approx(1.4)
    # float 0/1 mask works the same
    assert aggregate(LOSS, MASK.float(), "token").item() == pytest.approx(4.0)


def test_aggregate_empty_sequence_and_errors() -> None:
    loss = torch.cat([LOSS, torch.full((1, 4), 99.0)])
    mask = torch.cat([MASK, torch.zeros(1, 4, dtype=torch.bool)])
    # empty row contributes 0 but counts as a sequence: (2.5 + 5.5 + 7 + 0) / 4 = 3.75
    assert aggregate(loss, mask, "sequence").item() == pytest.approx(3.75)
    assert aggregate(loss, mask, "token").item() == pytest.approx(4.0)
    assert aggregate(loss[3:], mask[3:], "token").item() == 0.0  # all padding: 0, not nan
    with pytest.raises(ValueError, match="unknown"):
        aggregate(LOSS, MASK, "mean")
    with pytest.raises(ValueError, match="total_tokens"):
        aggregate(LOSS, MASK, "token", total_tokens=0)


@pytest.mark.parametrize("mode", MODES)
def test_padding_does_not_change_loss_or_grad(mode: str) -> None:
    g = torch.Generator().manual_seed(4)
    logp = -torch.rand(3, 4, generator=g)
    old = logp + 0.1 * torch.randn(3, 4, generator=g)
    adv = torch.tensor([1.0, -2.0, 0.5])

    def run(lp: torch.Tensor, ol: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lp = lp.clone().requires_grad_()
        loss_tok, _ = per_token_loss(lp, ol, adv, 0.2, 0.28)
        out = aggregate(loss_tok, MASK, mode)
        out.backward()
        return out.detach(), lp.grad

    garbage_lp, garbage_old = logp.clone(), old.clone()
    garbage_lp[~MASK], garbage_old[~MASK] = 5.0, -50.0  # ratio e^55 in the padding
    a, ga = run(logp, old)
    b, gb = run(garbage_lp, garbage_old)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(ga, gb)
    assert torch.equal(gb[~MASK], torch.zeros(int((~MASK).sum())))


@pytest.mark.parametrize("mode", MODES)
def test_micro_batch_split_equals_full_batch(mode: str) -> None:
    # Gradient accumulation / DDP: micro-batches with the *global* normalisers sum
    # exactly to the full-batch loss, and so do their gradients.
    g = torch.Generator().manual_seed(5)
    b, t = 7, 6
    lens = torch.tensor([6, 1, 3, 5, 2, 6, 4])
    mask = torch.arange(t)[None, :] < lens[:, None]
    logp0 = -torch.rand(b, t, generator=g) * 3
    old = logp0 + 0.3 * torch.randn(b, t, generator=g)
    ref = logp0 + 0.3 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, generator=g)
    norms = {"total_tokens": float(mask.sum()), "num_sequences": float(b), "max_len": 16}

    def loss_of(lp: torch.Tensor, rows: slice, **kw: float) -> torch.Tensor:
        tok, _ = per_token_loss(lp[rows], old[rows], adv[rows], 0.2, 0.28, ref[rows], 0.04)
        return aggregate(tok, mask[rows], mode, **kw)

    full_lp = logp0.clone().requires_grad_()
    full = loss_of(full_lp, slice(None), max_len=16)
    full.backward()

    split_lp = logp0.clone().requires_grad_()
    parts = [loss_of(split_lp, s, **norms) for s in (slice(0, 2), slice(2, 3), slice(3, 7))]
    for p in parts:
        p.backward()  # accumulates like loss.backward() per micro-batch
    torch.testing.assert_close(sum(p.detach() for p in parts), full.detach())
    torch.testing.assert_close(split_lp.grad, full_lp.grad)
    if mode != "constant":
        # sanity: local (default) normalisers do NOT give the full-batch value here
        local = sum(loss_of(logp0, s, max_len=16) for s in (slice(0, 2), slice(2, 7))) / 2
        assert not torch.allclose(local, full.detach())


# ---------------------------------------------------------------- masked_mean, stats


def test_masked_mean() -> None:
    # valid values 1, 2, 3, 4 | 5, 6 | 7: mean 28 / 7 = 4; per row [2.5, 5.5, 7]
    assert masked_mean(LOSS, MASK).item() == pytest.approx(4.0)
    torch.testing.assert_close(masked_mean(LOSS, MASK, dim=1), torch.tensor([2.5, 5.5, 7.0]))
    assert masked_mean(LOSS, torch.zeros_like(MASK)).item() == 0.0


def test_token_stats_hand_values() -> None:
    # 4 tokens, last one padded. ratios [1.5, 0.5, 1.0 | 9.0], A = [2, -1, 1 | 5]
    # valid: clipped high tok 0, clipped low tok 1 -> 1/3 each, 2/3 either; ratio mean 1.0
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0, 9.0]]))
    ref = torch.log(torch.tensor([[0.75, 0.5, 1.0, 9.0]]))  # k3 at ratio ref/pi = .5: 0.193147
    adv = torch.tensor([[2.0, -1.0, 1.0, 5.0]])
    _, st = per_token_loss(logp, torch.zeros(1, 4), adv, 0.2, 0.28, ref_logp=ref)
    mask = torch.tensor([[1, 1, 1, 0]])
    assert masked_mean(st.is_clipped_high, mask).item() == pytest.approx(1 / 3)
    assert masked_mean(st.is_clipped_low, mask).item() == pytest.approx(1 / 3)
    either = st.is_clipped_low | st.is_clipped_high
    assert masked_mean(either, mask).item() == pytest.approx(2 / 3)
    assert masked_mean(st.ratio, mask).item() == pytest.approx(1.0)
    assert masked_mean(st.kl, mask).item() == pytest.approx(0.1931472 / 3, abs=1e-6)
