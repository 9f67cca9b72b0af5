"""Per-token clipped policy-gradient loss for GRPO / DAPO / Dr. GRPO.

The objective (to *minimise*) per completion token ``t`` of sequence ``i`` is the
PPO clipped surrogate (Schulman et al. 2017) as used by GRPO (Shao et al. 2024)::

    r_it   = pi(o_it) / pi_old(o_it) = exp(logp_it - old_logp_it)
    l_it   = -min(r_it * A_i, clip(r_it, 1 - eps_low, 1 + eps_high) * A_i) + beta * KL_it

with separate ``eps_low`` / ``eps_high`` = DAPO "clip-higher" (Yu et al. 2025), and
``KL_it`` the k3 estimator (Schulman, "Approximating KL divergence", 2020) of
``KL(pi || pi_ref)``: ``exp(ref - logp) - (ref - logp) - 1 >= 0``.

How the per-token losses become one scalar is the main difference between the
variants, see :func:`aggregate`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

AGGREGATION_MODES = ("sequence", "token", "constant")
DEFAULT_CHUNK = 1024  # token positions per vocabulary reduction (bounds temp memory)


class _SelectiveLogSoftmax(torch.autograd.Function):
    """``log_softmax(logits)[ids]`` without a full ``[B, T, V]`` log-softmax copy.

    Forward keeps only ``lse = logsumexp(z)`` per position (fp32). Backward uses
    ``d log p_y / d z_k = 1[k == y] - softmax(z)_k``, recomputing the softmax one
    chunk at a time, so the temporary fp32 memory is ``chunk * V`` both ways.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, ids: torch.Tensor, chunk: int) -> torch.Tensor:
        b, t, _ = logits.shape
        acc = torch.promote_types(logits.dtype, torch.float32)  # bf16/fp16 -> fp32
        chosen = torch.empty(b, t, dtype=acc, device=logits.device)
        lse = torch.empty_like(chosen)
        for i in range(b):
            for s in range(0, t, chunk):
                z = logits[i, s : s + chunk].to(acc)  # [c, V]: one chunk upcast at a time
                lse[i, s : s + chunk] = torch.logsumexp(z, dim=-1)
                chosen[i, s : s + chunk] = z.gather(-1, ids[i, s : s + chunk, None])[:, 0]
        ctx.save_for_backward(logits, ids, lse)
        ctx.chunk = chunk
        return chosen - lse  # log p_y = z_y - logsumexp(z)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, ids, lse = ctx.saved_tensors
        chunk, acc = ctx.chunk, lse.dtype
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        for i in range(logits.shape[0]):
            for s in range(0, logits.shape[1], chunk):
                sl = slice(s, s + chunk)
                g = grad_out[i, sl].to(acc)[:, None]  # [c, 1]
                d = -g * torch.exp(logits[i, sl].to(acc) - lse[i, sl, None])  # -g * softmax
                d.scatter_add_(-1, ids[i, sl, None], g)  # + g at the chosen token
                grad[i, sl] = d.to(grad.dtype)
        return grad, None, None


def selective_log_softmax(
    logits: torch.Tensor, ids: torch.Tensor, chunk_size: int = DEFAULT_CHUNK
) -> torch.Tensor:
    """Log-probability of ``ids`` under ``softmax(logits)``: ``[B,T,V], [B,T] -> [B,T]``.

    Computed and returned in at least fp32 (bf16 logits are upcast ``chunk_size``
    positions at a time; fp64 stays fp64): the ratio ``exp(logp - old_logp)`` is
    sensitive to rounding. Differentiable
    w.r.t. ``logits``; the gradient has the logits' dtype. Non-contiguous logits
    (e.g. ``logits[:, :-1]``) are read in place, never copied whole.
    """
    if logits.dim() != 3 or ids.shape != logits.shape[:2]:
        shapes = f"{tuple(logits.shape)}, {tuple(ids.shape)}"
        raise ValueError(f"expected logits [B,T,V] and ids [B,T], got {shapes}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return _SelectiveLogSoftmax.apply(logits, ids.long(), chunk_size)


def token_entropy(logits: torch.Tensor, chunk_size: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Entropy ``H = -sum_k p_k log p_k`` of the next-token distribution, ``[B,T]`` (>= fp32).

    Chunked over positions like :func:`selective_log_softmax`. Terms with ``p_k = 0``
    (e.g. ``-inf`` logits of banned tokens) count as 0, the ``0 log 0 = 0`` convention.
    """
    if logits.dim() != 3:
        raise ValueError(f"expected logits [B,T,V], got {tuple(logits.shape)}")
    acc = torch.promote_types(logits.dtype, torch.float32)
    rows = []
    for i in range(logits.shape[0]):
        parts = []
        for s in range(0, logits.shape[1], chunk_size):
            logp = torch.log_softmax(logits[i, s : s + chunk_size].to(acc), dim=-1)
            p = logp.exp()
            # masked_fill (not where on the product): keeps the gradient finite at p = 0.
            parts.append(-(p * logp.masked_fill(p == 0, 0.0)).sum(-1))
        rows.append(torch.cat(parts) if parts else logits.new_zeros(0, dtype=acc))
    return torch.stack(rows)


@dataclass(frozen=True)
class TokenStats:
    """Per-token diagnostics from :func:`per_token_loss`, ``[B,T]``, detached, not masked.

    ``ratio`` = ``exp(logp - old_logp)``; ``is_clipped_low`` = ``ratio < 1 - eps_low`` and
    ``A < 0``, ``is_clipped_high`` = ``ratio > 1 + eps_high`` and ``A > 0`` (the clip is
    active, the token has zero gradient); ``kl`` = k3 estimate (zeros without ``ref_logp``).
    """

    ratio: torch.Tensor
    is_clipped_low: torch.Tensor
    is_clipped_high: torch.Tensor
    kl: torch.Tensor


def per_token_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    eps_low: float,
    eps_high: float,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
) -> tuple[torch.Tensor, TokenStats]:
    """Clipped-surrogate loss per token (module docstring has the formula), ``[B,T]``.

    Args:
        logp: log-probs of the sampled tokens under the current policy, ``[B,T]``.
        old_logp: the same under the sampling policy; ``None`` means on-policy
            (``logp.detach()``: ratio 1, gradient ``-A * grad logp``).
        advantages: ``[B]`` (one per sequence, broadcast over T) or ``[B,T]``.
        eps_low, eps_high: clip range ``[1 - eps_low, 1 + eps_high]`` (DAPO: 0.2, 0.28).
        ref_logp: log-probs under the frozen reference policy, for the KL term.
        beta: KL coefficient; the term ``beta * k3`` is added only when ``beta > 0``.

    Raises:
        ValueError: ``beta > 0`` without ``ref_logp`` (silently dropping the KL
            penalty would hide a configuration bug).
    """
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp for the KL penalty")
    if old_logp is None:
        old_logp = logp.detach()
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    adv = adv.to(logp.dtype)

    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    # Pessimistic bound: min of the unclipped and clipped objective. Where the clipped
    # term wins, clamp() has zero gradient, so the token stops pushing the policy.
    loss = -torch.minimum(ratio * adv, clipped * adv)

    if ref_logp is not None:
        log_rho = ref_logp.detach() - logp  # log(pi_ref / pi); the reference is frozen
        # k3 = rho - log(rho) - 1 >= 0 (as x - 1 >= log x); E_pi[k3] = KL(pi || pi_ref)
        kl = torch.exp(log_rho) - log_rho - 1.0
        if beta > 0:
            loss = loss + beta * kl
    else:
        kl = torch.zeros_like(logp)

    with torch.no_grad():
        stats = TokenStats(
            ratio=ratio.detach(),
            is_clipped_low=(ratio < 1.0 - eps_low) & (adv < 0),
            is_clipped_high=(ratio > 1.0 + eps_high) & (adv > 0),
            kl=kl.detach(),
        )
    return loss, stats


def _positive(name: str, value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


def aggregate(
    loss_tok: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    total_tokens: float | None = None,
    num_sequences: float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Reduce per-token losses ``[B,T]`` with a binary ``mask`` ``[B,T]`` to a scalar.

    Modes (``N`` sequences, ``|o_i|`` = unmasked tokens of sequence ``i``):

    * ``sequence`` -- original GRPO: ``(1/N) sum_i (1/|o_i|) sum_t l_it``. Long
      sequences get less weight per token. A sequence with no tokens contributes 0.
    * ``token`` -- DAPO token-level: ``sum_it l_it / sum_i |o_i|``.
    * ``constant`` -- Dr. GRPO: ``sum_it l_it / (N * max_len)``, a length-independent
      constant (``max_len`` should be the generation budget, e.g. max_new_tokens).

    The normalisers ``num_sequences`` (N), ``total_tokens`` and ``max_len`` default to
    the local batch's own (``B``, ``mask.sum()``, ``T``). For gradient accumulation
    pass the *full* batch's values to every micro-batch: the terms are then linear,
    so the sum of the micro-batch losses equals the full-batch loss exactly. Under
    DDP the gradient all-reduce *averages* over the W ranks, so also multiply each
    rank's loss by W (the global loss is the sum over ranks, not the mean).
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown aggregation {mode!r}; expected one of {AGGREGATION_MODES}")
    if mask.shape != loss_tok.shape:
        raise ValueError(f"mask {tuple(mask.shape)} != loss {tuple(loss_tok.shape)}")
    keep = mask.bool()
    # where, not multiply: garbage (inf/nan) in padded positions must not leak in.
    masked = torch.where(keep, loss_tok, torch.zeros_like(loss_tok))
    n_seq = _positive("num_sequences", num_sequences) or loss_tok.shape[0]
    if mode == "sequence":
        lens = keep.sum(-1).clamp(min=1).to(loss_tok.dtype)
        return (masked.sum(-1) / lens).sum() / n_seq
    if mode == "token":
        n_tok = _positive("total_tokens", total_tokens) or max(int(keep.sum()), 1)
        return masked.sum() / n_tok
    length = _positive("max_len", max_len) or loss_tok.shape[1]
    return masked.sum() / (n_seq * length)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is true (0 where nothing is unmasked)."""
    keep = mask.bool()
    x = x.float() if not x.is_floating_point() else x
    total = torch.where(keep, x, torch.zeros_like(x))
    if dim is None:
        return total.sum() / keep.sum().clamp(min=1)
    return total.sum(dim) / keep.sum(dim).clamp(min=1)
