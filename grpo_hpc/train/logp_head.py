"""Log-probabilities of chosen tokens straight from hidden states: the LM head fused with
the selection, so the ``[tokens, vocab]`` logits never exist in full.

For a vocabulary of 152k, the logits of one 4k-token micro-batch are 1.2 GB in bf16 and
2.5 GB in fp32, and a plain ``log_softmax`` keeps several such tensors for backward. Here
the head's matrix product runs ``chunk`` tokens at a time; forward keeps only the
log-sum-exp per token, and backward recomputes each chunk's logits and uses

    d log p_y / d z_k = 1[k = y] - softmax(z)_k,   z = h W^T,
    dL/dh = (dL/dz) W,   dL/dW = sum over tokens (dL/dz)^T h.

Peak extra memory is one chunk of logits, in fp32 (the softmax is always taken in fp32).

With a sampling temperature ``T`` (``algo.tempered_logp``) the logits are ``z = h W^T / T``,
the distribution the completions were drawn from; the chain rule adds the factor ``1/T``
to both gradients.

The product ``h W^T`` runs in the autocast dtype (bf16 on a GPU), so each logit is rounded
to 8 significant bits: at |z| of 16-32 a step of 0.125. The engine rounds its own logits
the same way from slightly different hidden states, and the two roundings disagree where
a value lies near a step. ``Scoring.fp32`` (``algo.fp32_lm_head``) takes the product in
fp32 instead, on both sides (the fix MiniMax-M1 reported for the same mismatch).

:func:`fused_logp_head` installs this as the model's LM head for one forward, so the
forward still goes through the DDP/FSDP wrapper (hooks, gradient sync, unsharding).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

DEFAULT_CHUNK_TOKENS = 1024


@dataclass(frozen=True)
class Scoring:
    """How the update scores a completion token (the native engine reports its log-probs
    the same way, so that the two can be compared)."""

    temperature: float = 1.0
    """Log-probs of ``softmax(logits / temperature)`` (``Config.logp_temperature``)."""
    fp32: bool = False
    """The LM head's product in fp32 instead of the autocast dtype (``algo.fp32_lm_head``)."""


def _compute_dtype(weight: torch.Tensor) -> torch.dtype:
    dev = weight.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return weight.dtype


class _LinearLogp(torch.autograd.Function):
    @staticmethod
    def forward(  # noqa: ANN205
        ctx,
        h: torch.Tensor,
        weight: torch.Tensor,
        ids: torch.Tensor,
        chunk: int,
        inv_t: float,
        fp32: bool,
    ):
        cd = _compute_dtype(weight)
        if fp32:
            cd = torch.promote_types(cd, torch.float32)
        hc, wc = h.to(cd), weight.to(cd)
        n, acc = hc.shape[0], torch.promote_types(cd, torch.float32)  # fp64 stays fp64
        chosen = torch.empty(n, dtype=acc, device=h.device)
        lse = torch.empty_like(chosen)
        entropy = torch.empty_like(chosen)
        with torch.autocast(h.device.type, enabled=False):
            for s in range(0, n, chunk):
                z = (hc[s : s + chunk] @ wc.T).to(acc) * inv_t
                lse[s : s + chunk] = torch.logsumexp(z, -1)
                chosen[s : s + chunk] = z.gather(-1, ids[s : s + chunk, None])[:, 0]
                p = torch.exp(z - lse[s : s + chunk, None])
                entropy[s : s + chunk] = lse[s : s + chunk] - (p * z).sum(-1)
        ctx.save_for_backward(hc, wc, ids, lse)
        ctx.chunk, ctx.h_dtype, ctx.w_dtype, ctx.inv_t = chunk, h.dtype, weight.dtype, inv_t
        ctx.mark_non_differentiable(entropy)
        return chosen - lse, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logp: torch.Tensor, _grad_entropy: torch.Tensor):  # noqa: ANN205
        hc, wc, ids, lse = ctx.saved_tensors
        grad_h = torch.empty(hc.shape, dtype=ctx.h_dtype, device=hc.device)
        acc = lse.dtype
        # A frozen head (LoRA) needs no [vocab, hidden] fp32 gradient accumulator.
        want_w = ctx.needs_input_grad[1]
        grad_w = torch.zeros(wc.shape, dtype=acc, device=wc.device) if want_w else None
        with torch.autocast(hc.device.type, enabled=False):
            for s in range(0, hc.shape[0], ctx.chunk):
                sl = slice(s, s + ctx.chunk)
                g = grad_logp[sl].to(acc)[:, None] * ctx.inv_t  # d z / d(h W^T) = 1/T
                d = -g * torch.exp((hc[sl] @ wc.T).to(acc) * ctx.inv_t - lse[sl, None])
                d.scatter_add_(-1, ids[sl, None], g)
                d = d.to(wc.dtype)
                grad_h[sl] = (d @ wc).to(ctx.h_dtype)
                if grad_w is not None:
                    grad_w += (d.T @ hc[sl]).to(acc)  # bf16 product, fp32 sum over chunks
        grad_w = grad_w.to(ctx.w_dtype) if grad_w is not None else None
        return grad_h, grad_w, None, None, None, None


def linear_logp(
    h: torch.Tensor,
    weight: torch.Tensor,
    ids: torch.Tensor,
    chunk: int = DEFAULT_CHUNK_TOKENS,
    scoring: Scoring = Scoring(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(h @ weight.T / T)[ids]`` and the entropy of that softmax (detached),
    both fp32, for ``h`` [N, H], ``weight`` [V, H], ``ids`` [N]; differentiable w.r.t.
    ``h`` and ``weight``. ``scoring``: ``T`` and the precision of the product."""
    t = scoring.temperature
    if not t > 0:
        raise ValueError(f"temperature must be > 0, got {t}")
    return _LinearLogp.apply(h, weight, ids.long(), chunk, 1.0 / t, scoring.fp32)


@dataclass
class HeadResult:
    logp: torch.Tensor | None = None
    """[B, C] log-probability of each target token (fp32)."""
    entropy: torch.Tensor | None = None
    """[B, C] entropy of the next-token distribution there (fp32, detached)."""


@contextlib.contextmanager
def fused_logp_head(
    model: torch.nn.Module,
    positions: torch.Tensor,
    targets: torch.Tensor,
    chunk: int = DEFAULT_CHUNK_TOKENS,
    scoring: Scoring = Scoring(),
    packed: bool = False,
) -> Iterator[HeadResult]:
    """During one forward of ``model``, its LM head computes, for every row ``b`` and
    completion index ``t``, the log-prob of ``targets[b, t]`` from the hidden state at
    ``positions[b, t]`` (instead of logits for every position). The HF model returns a
    placeholder as ``logits``; read the result from the yielded :class:`HeadResult`.
    ``scoring``: the temperature of the softmax and the precision of the product.
    ``packed``: the forward is one sequence holding every row ([1, N] hidden states), and
    ``positions`` index into it."""
    inner = getattr(model, "module", model)  # DDP keeps the HF model in .module
    head = inner.get_output_embeddings()
    result = HeadResult()

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        b, c = targets.shape
        if packed:
            picked = hidden[0][positions]  # [B, C, H]
        else:
            picked = hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        flat = picked.reshape(b * c, -1)
        logp, ent = linear_logp(flat, head.weight, targets.reshape(-1), chunk, scoring)
        result.logp, result.entropy = logp.view(b, c), ent.view(b, c)
        return result.logp.unsqueeze(-1)

    head.forward = forward
    try:
        yield result
    finally:
        del head.forward  # back to the class's forward
