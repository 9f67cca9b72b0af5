"""Token choice on the device, without a host round trip (safe inside a CUDA graph).

Sampling uses the exponential race: ``argmax_k p_k / E_k`` with ``E_k ~ Exp(1)`` i.i.d.
picks token k with probability ``p_k`` (equivalent to the Gumbel-max trick, since
``-log E`` is Gumbel). It needs no cumulative sum and no host-side multinomial.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail outside the smallest set of tokens whose mass reaches ``top_p``
    (nucleus sampling; the most likely token always stays)."""
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each token
    sorted_p = sorted_p.masked_fill(before >= top_p, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_p)


def race_noise(
    logits: torch.Tensor, rows_of: torch.Tensor | None = None, draw_rows: int = 0
) -> torch.Tensor:
    """``Exp(1)`` noise [B, V] (fp32) for the exponential race. ``rows_of`` [B] /
    ``draw_rows``: the rows are a subset (``rows_of``) of a batch of ``draw_rows`` rows (the
    decode batch after finished rows were compacted out). The noise is then drawn for the
    whole batch and the subset's rows taken from it, so each row sees the same random
    numbers as it would without compaction. Drawn eagerly, outside any compiled code: a
    compiled kernel would draw from another generator and change the token stream."""
    if rows_of is None:
        return torch.empty(logits.shape, dtype=torch.float32, device=logits.device).exponential_()
    noise = torch.empty(draw_rows, logits.shape[1], dtype=torch.float32, device=logits.device)
    return noise.exponential_()[rows_of]


def pick(
    logits: torch.Tensor,
    race: torch.Tensor | None,
    temperature: float,
    top_p: float,
    logp_temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The arithmetic of :func:`choose` once the noise is drawn (``race`` None: greedy).
    Pure and free of randomness, so the engine compiles it on CUDA, where its passes over
    the [B, vocab] logits (casts, two softmaxes, the race, the argmax) become a few fused
    kernels (bench/results/LOG.md, the decode's token choice)."""
    z = logits.float()
    logp_all = torch.log_softmax(z if logp_temperature == 1.0 else z / logp_temperature, dim=-1)
    if race is None:
        token = z.argmax(-1)
    else:
        probs = top_p_filter(torch.softmax(z / temperature, dim=-1), top_p)
        token = (probs / race.clamp(min=1e-30)).argmax(-1)  # 0/0 would be NaN
    return token, logp_all.gather(-1, token.unsqueeze(-1)).squeeze(-1)


Pick = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def choose(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    greedy: bool,
    rows_of: torch.Tensor | None = None,
    draw_rows: int = 0,
    logp_temperature: float = 1.0,
    pick_fn: Pick = pick,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token [B] and its log-probability [B] (fp32) under ``softmax(z /
    logp_temperature)``: the distribution the update scores (1: the untempered policy;
    the sampling temperature with ``algo.tempered_logp``), so that the engine's and the
    trainer's log-probs of a token can be compared. ``rows_of`` / ``draw_rows``: see
    :func:`race_noise`; ``pick_fn``: :func:`pick`, or its compiled form."""
    race = None if greedy else race_noise(logits, rows_of, draw_rows)
    return pick_fn(logits, race, temperature, top_p, logp_temperature)
