"""Token choice on the device, without a host round trip (safe inside a CUDA graph).

Sampling uses the exponential race: ``argmax_k p_k / E_k`` with ``E_k ~ Exp(1)`` i.i.d.
picks token k with probability ``p_k`` (equivalent to the Gumbel-max trick, since
``-log E`` is Gumbel). It needs no cumulative sum and no host-side multinomial.
"""

from __future__ import annotations

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


def choose(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    greedy: bool,
    rows_of: torch.Tensor | None = None,
    draw_rows: int = 0,
    logp_temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token [B] and its log-probability [B] (fp32) under ``softmax(z /
    logp_temperature)``: the distribution the update scores (1: the untempered policy;
    the sampling temperature with ``algo.tempered_logp``), so that the engine's and the
    trainer's log-probs of a token can be compared.

    ``rows_of`` [B] / ``draw_rows``: the rows are a subset (``rows_of``) of a batch of
    ``draw_rows`` rows (the decode batch after finished rows were compacted out). The
    race noise is then drawn for the whole batch and the subset's rows taken from it, so
    each row sees the same random numbers as it would without compaction."""
    z = logits.float()
    logp_all = torch.log_softmax(z if logp_temperature == 1.0 else z / logp_temperature, dim=-1)
    if greedy:
        token = z.argmax(-1)
    else:
        probs = top_p_filter(torch.softmax(z / temperature, dim=-1), top_p)
        if rows_of is None:
            race = torch.empty_like(probs).exponential_()
        else:
            race = probs.new_empty(draw_rows, probs.shape[1]).exponential_()[rows_of]
        race = race.clamp_(min=1e-30)  # 0/0 would be NaN
        token = (probs / race).argmax(-1)
    return token, logp_all.gather(-1, token.unsqueeze(-1)).squeeze(-1)
