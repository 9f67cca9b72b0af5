"""One policy update from a batch of scored rollouts (the GRPO objective).

Micro-batches accumulate gradients; the loss normalisers are *global* (all
micro-batches, all ranks), so the gradient equals that of the full batch no
matter how it is split. DDP/FSDP average gradients over ranks, hence the
``world_size`` factor on each rank's loss.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from grpo_hpc.config import AlgoConfig
from grpo_hpc.train.dist import DistInfo, all_reduce_max, all_reduce_sum
from grpo_hpc.train.logp_head import fused_logp_head
from grpo_hpc.train.loss import aggregate, loss_stats, per_token_loss
from grpo_hpc.train.rollout import RolloutBatch


@dataclass
class MicroBatch:
    """Rows of one rollout batch that train together."""

    batch: RolloutBatch
    rows: torch.Tensor
    """Row indices into ``batch``."""
    advantages: torch.Tensor
    """[len(rows)] advantage per sequence."""
    weight: float = 1.0
    """0.0 for padding micro-batches that only keep collectives in step across ranks."""
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None


def row_lengths(batch: RolloutBatch, rows: list[int]) -> list[int]:
    """Real tokens (prompt without padding + completion up to EOS) of each row."""
    return batch.attention_mask[rows].sum(1).tolist()


def split(
    batch: RolloutBatch, rows: list[int], adv: torch.Tensor, max_rows: int, max_tokens: int = 0
) -> list[MicroBatch]:
    """Consecutive rows in micro-batches of at most ``max_rows`` rows and, when
    ``max_tokens`` > 0, at most ``max_tokens`` padded tokens (rows x longest row): the
    activation memory of a forward grows with tokens, not rows. A row longer than the
    budget trains alone."""
    lengths = row_lengths(batch, rows) if max_tokens else [0] * len(rows)
    out, start, longest = [], 0, 0
    for i, n in enumerate(lengths):
        longest_with = max(longest, n)
        full = i - start == max_rows or (max_tokens and (i - start + 1) * longest_with > max_tokens)
        if full and i > start:
            out.append(_micro(batch, rows, adv, start, i))
            start, longest_with = i, n
        longest = longest_with
    if rows:
        out.append(_micro(batch, rows, adv, start, len(rows)))
    return out


def _micro(batch: RolloutBatch, rows: list[int], adv: torch.Tensor, a: int, b: int) -> MicroBatch:
    return MicroBatch(batch, torch.tensor(rows[a:b], dtype=torch.long), adv[a:b])


def right_align(
    ids: torch.Tensor, mask: torch.Tensor, prompt_len: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Move each row's left padding to the end; return (ids, mask, completion_start).

    Generation needs left padding, but in a training forward a left pad is a query
    with every key masked: in bf16 its softmax is NaN, and NaN times a zero gradient
    is still NaN in backward. Right-aligned rows have no fully masked query (causal
    attention never looks ahead), and plain 0..n positions are the right ones.
    """
    left = prompt_len - mask[:, :prompt_len].sum(1)  # leading pads per row
    n = ids.shape[1]
    src = torch.arange(n, device=ids.device).unsqueeze(0) + left.unsqueeze(1)
    valid = src < n
    src = src.clamp(max=n - 1)
    new_ids = torch.where(valid, ids.gather(1, src), torch.full_like(ids, pad_id))
    new_mask = torch.where(valid, mask.gather(1, src), torch.zeros_like(mask))
    return new_ids, new_mask, prompt_len - left


def completion_logp(
    model: torch.nn.Module, mb: MicroBatch, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the completion tokens under ``model`` ([B, C], fp32), and the
    entropy of each next-token distribution when asked.

    The LM head is fused with the token selection (:mod:`logp_head`): no [B, T, vocab]
    logits. Columns past the micro-batch's longest row are cut before the forward; the
    result is zero-padded back to the batch's C columns.
    """
    b = mb.batch
    ids, mask, start = right_align(
        b.input_ids[mb.rows], b.attention_mask[mb.rows], b.prompt_len, b.pad_token_id
    )
    c_all = b.input_ids.shape[1] - b.prompt_len
    c = max(int(b.completion_mask[mb.rows].sum(1).max()), 1)
    width = int((start + c).max())
    # Token t of the completion is predicted at position start + t - 1.
    pos = start.unsqueeze(1) - 1 + torch.arange(c, device=ids.device)
    targets = b.input_ids[mb.rows, b.prompt_len : b.prompt_len + c]
    with fused_logp_head(model, pos, targets) as head:
        model(input_ids=ids[:, :width], attention_mask=mask[:, :width], use_cache=False)
    assert head.logp is not None and head.entropy is not None
    pad = (0, c_all - c)
    entropy = torch.nn.functional.pad(head.entropy, pad) if with_entropy else None
    return torch.nn.functional.pad(head.logp, pad), entropy


@torch.no_grad()
def fill_fixed_logp(
    model: torch.nn.Module,
    mbs: list[MicroBatch],
    attr: str,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> None:
    """Store old (or reference) log-probs once, before the updates change the policy.
    Same precision as the training forward, so the first ratio is exactly 1."""
    for mb in mbs:
        with autocast():
            logp, _ = completion_logp(model, mb)
        setattr(mb, attr, logp)


def _no_sync(model: torch.nn.Module, last: bool):  # noqa: ANN202
    if last:
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(False)
        return _restore_sync(model)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _restore_sync(model: torch.nn.Module):  # noqa: ANN202
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def pad_microbatches(mbs: list[MicroBatch], info: DistInfo) -> list[MicroBatch]:
    """All ranks run the same number of forward/backward passes (FSDP collectives)."""
    target = int(all_reduce_max(len(mbs), info))
    pad = [
        MicroBatch(mbs[0].batch, mbs[0].rows, mbs[0].advantages, weight=0.0)
        for _ in range(target - len(mbs))
    ]
    return mbs + pad


def accumulate(
    model: torch.nn.Module,
    mbs: list[MicroBatch],
    algo: AlgoConfig,
    info: DistInfo,
    max_new_tokens: int,
    scaler: torch.amp.GradScaler | None,
    autocast: Callable[[], contextlib.AbstractContextManager],
) -> dict[str, float]:
    """Forward/backward every micro-batch; gradients end up summed for one step."""
    local_tokens = sum(float(mb.batch.completion_mask[mb.rows].sum()) for mb in mbs if mb.weight)
    local_seqs = sum(len(mb.rows) for mb in mbs if mb.weight)
    total_tokens, num_seqs = all_reduce_sum([local_tokens, float(local_seqs)], info)
    sums = {
        "loss": 0.0,
        "kl": 0.0,
        "clip_frac": 0.0,
        "clip_frac_low": 0.0,
        "clip_frac_high": 0.0,
        "entropy": 0.0,
        "tokens": 0.0,
    }
    for i, mb in enumerate(mbs):
        with _no_sync(model, last=i == len(mbs) - 1), autocast():
            logp, entropy = completion_logp(model, mb, with_entropy=True)
            cmask = mb.batch.completion_mask[mb.rows]
            loss_tok, stats = per_token_loss(
                logp,
                mb.old_logp,
                mb.advantages.to(logp.device),
                algo.eps_low,
                algo.eps_high,
                ref_logp=mb.ref_logp,
                beta=algo.beta,
            )
            loss = aggregate(
                loss_tok,
                cmask,
                algo.aggregation,
                total_tokens=max(total_tokens, 1.0),
                num_sequences=max(num_seqs, 1.0),
                max_len=max_new_tokens,
            ) * (info.world_size * mb.weight)
            (scaler.scale(loss) if scaler else loss).backward()
        if mb.weight:
            n = float(cmask.sum())
            st = loss_stats(stats, cmask)
            sums["loss"] += float(loss.detach()) / info.world_size
            sums["entropy"] += float((entropy * cmask).sum())
            for key in ("kl", "clip_frac", "clip_frac_low", "clip_frac_high"):
                sums[key] += st[key] * n
            sums["tokens"] += n
    keys = list(sums)
    reduced = dict(zip(keys, all_reduce_sum([sums[k] for k in keys], info), strict=True))
    tokens = max(reduced.pop("tokens"), 1.0)
    return {"loss": reduced.pop("loss"), **{k: v / tokens for k, v in reduced.items()}}
