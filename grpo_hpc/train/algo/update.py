"""One policy update from a batch of scored rollouts (the GRPO objective).

Micro-batches accumulate gradients; the loss normalisers are *global* (all
micro-batches, all ranks), so the gradient equals that of the full batch no
matter how it is split. DDP/FSDP average gradients over ranks, hence the
``world_size`` factor on each rank's loss.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from grpo_hpc.config.schema import AlgoConfig
from grpo_hpc.train.algo.logp_head import Scoring, fused_logp_head, head_problem
from grpo_hpc.train.algo.loss import TokenStats, aggregate, per_token_loss
from grpo_hpc.train.algo.offpolicy import largest_weight, raw_weight, sequence_keep, tis_weight
from grpo_hpc.train.algo.packing import host_to_device, pack, packed_forward
from grpo_hpc.train.distributed.dist import DistInfo, all_reduce_max, all_reduce_sum
from grpo_hpc.train.rollout.types import RolloutBatch


@dataclass
class MicroBatch:
    """Rows of one rollout batch that train together."""

    batch: RolloutBatch
    rows: torch.Tensor
    """Row indices into ``batch``, on the batch's device: a host index into a device
    tensor is copied over first, and such a copy waits for the GPU to run everything
    queued before it (the last micro-batch's backward), once per use."""
    advantages: torch.Tensor
    """[len(rows)] advantage per sequence (on the batch's device, for the same reason)."""
    weight: float = 1.0
    """0.0 for padding micro-batches that only keep collectives in step across ranks."""
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    extent: tuple[int, int] | None = None
    """(longest completion, columns needed after right-alignment), known on the host
    when the split was made, so the forward needs no device-to-host sync to trim."""
    lengths: tuple[tuple[int, int], ...] | None = None
    """(prompt, completion) real tokens of each row when the micro-batch trains packed
    (``algo.packing``): its rows run as one sequence, see :mod:`packing`."""
    tokens: int | None = None
    """Completion tokens of its rows, known on the host when the split was made (None:
    counted on the device)."""


def split(
    batch: RolloutBatch,
    rows: list[int],
    adv: torch.Tensor,
    max_rows: int,
    max_tokens: int = 0,
    packing: bool = False,
) -> list[MicroBatch]:
    """Consecutive rows in micro-batches of at most ``max_rows`` rows and, when
    ``max_tokens`` > 0, at most ``max_tokens`` tokens: padded tokens (rows x longest row),
    or with ``packing`` the rows' real tokens (a packed forward computes no padding). The
    activation memory of a forward grows with tokens, not rows. A row longer than the
    budget trains alone."""
    prompt = batch.attention_mask[rows, : batch.prompt_len].sum(1).tolist()
    completion = batch.completion_mask[rows].sum(1).tolist()  # one sync per rollout batch
    lengths = [p + c for p, c in zip(prompt, completion, strict=True)]
    out, start, longest, total = [], 0, 0, 0
    for i, n in enumerate(lengths):
        longest_with, total_with = max(longest, n), total + n
        cost = total_with if packing else (i - start + 1) * longest_with
        over = max_tokens and cost > max_tokens
        if (i - start == max_rows or over) and i > start:
            out.append(_micro(batch, rows, adv, start, i, prompt, completion, packing))
            start, longest_with, total_with = i, n, n
        longest, total = longest_with, total_with
    if rows:
        out.append(_micro(batch, rows, adv, start, len(rows), prompt, completion, packing))
    return out


def _micro(
    batch: RolloutBatch,
    rows: list[int],
    adv: torch.Tensor,
    a: int,
    b: int,
    prompt: list[int],
    completion: list[int],
    packing: bool = False,
) -> MicroBatch:
    c = max(max(completion[a:b]), 1)
    extent = (c, max(p + c for p in prompt[a:b]))
    lengths = tuple(zip(prompt[a:b], completion[a:b], strict=True)) if packing else None
    # Both copied now, without waiting: the update then indexes with no host sync between
    # micro-batches, and the host queues the next forward while the GPU runs this backward.
    dev = batch.input_ids.device
    idx = host_to_device(torch.tensor(rows[a:b], dtype=torch.long), dev)
    mine = host_to_device(adv[a:b].contiguous(), dev)
    tokens = sum(completion[a:b])
    return MicroBatch(batch, idx, mine, extent=extent, lengths=lengths, tokens=tokens)


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
    model: torch.nn.Module, mb: MicroBatch, with_entropy: bool = False, scoring: Scoring = Scoring()
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the completion tokens under ``softmax(logits / scoring.temperature)`` of
    ``model`` ([B, C], fp32), and the entropy of each next-token distribution when asked.

    The LM head is fused with the token selection (:mod:`logp_head`): no [B, T, vocab]
    logits. Columns past the micro-batch's longest row are cut before the forward; the
    result is zero-padded back to the batch's C columns. A micro-batch with ``lengths``
    runs packed (:mod:`packing`).
    """
    if mb.lengths is not None:
        return _packed_logp(model, mb, with_entropy, scoring)
    b = mb.batch
    ids, mask, start = right_align(
        b.input_ids[mb.rows], b.attention_mask[mb.rows], b.prompt_len, b.pad_token_id
    )
    c_all = b.input_ids.shape[1] - b.prompt_len
    if mb.extent is None:
        c = max(int(b.completion_mask[mb.rows].sum(1).max()), 1)
        width = int((start + c).max())
    else:
        c, width = mb.extent
    # Token t of the completion is predicted at position start + t - 1.
    pos = start.unsqueeze(1) - 1 + torch.arange(c, device=ids.device)
    targets = b.input_ids[mb.rows, b.prompt_len : b.prompt_len + c]
    if head_problem(model) is not None:
        logp, ent = _model_logits_logp(
            model,
            dict(input_ids=ids[:, :width], attention_mask=mask[:, :width]),
            pos,
            targets,
            scoring,
        )
        pad = (0, c_all - c)
        entropy = torch.nn.functional.pad(ent, pad) if with_entropy else None
        return torch.nn.functional.pad(logp, pad), entropy
    with fused_logp_head(model, pos, targets, scoring=scoring) as head:
        model(input_ids=ids[:, :width], attention_mask=mask[:, :width], use_cache=False)
    assert head.logp is not None and head.entropy is not None
    pad = (0, c_all - c)
    entropy = torch.nn.functional.pad(head.entropy, pad) if with_entropy else None
    return torch.nn.functional.pad(head.logp, pad), entropy


def _packed_logp(
    model: torch.nn.Module, mb: MicroBatch, with_entropy: bool, scoring: Scoring
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`completion_logp` of a packed micro-batch: its rows as one sequence."""
    b = mb.batch
    assert mb.lengths is not None
    c_all = b.input_ids.shape[1] - b.prompt_len
    c = max(max(n for _, n in mb.lengths), 1)
    packed = pack(b.input_ids[mb.rows], b.prompt_len, list(mb.lengths), c)
    targets = b.input_ids[mb.rows, b.prompt_len : b.prompt_len + c]
    pad = (0, c_all - c)
    if head_problem(model) is not None:
        with packed_forward():
            logp, ent = _model_logits_logp(
                model, packed.model_kwargs(), packed.head_positions, targets, scoring
            )
        entropy = torch.nn.functional.pad(ent, pad) if with_entropy else None
        return torch.nn.functional.pad(logp, pad), entropy
    head_ctx = fused_logp_head(model, packed.head_positions, targets, scoring=scoring, packed=True)
    with head_ctx as head:
        with packed_forward():
            model(**packed.model_kwargs(), use_cache=False)
    assert head.logp is not None and head.entropy is not None
    entropy = torch.nn.functional.pad(head.entropy, pad) if with_entropy else None
    return torch.nn.functional.pad(head.logp, pad), entropy


def _model_logits_logp(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    positions: torch.Tensor,
    targets: torch.Tensor,
    scoring: Scoring,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies ([B, C], fp32) from the model's own logits, for a model
    whose logits are more than its head's product ``h W^T`` (:func:`logp_head.head_problem`:
    Gemma 2's final soft-capping, a logit scale, a head bias, a LoRA adapter on the head).
    The fused head would score such a model wrongly, so the forward computes the logits as
    HF does, at the cost the fused head exists to avoid: ``[rows, kept, vocab]`` logits,
    kept from the first completion position on (``logits_to_keep``). ``positions`` index
    the forward's sequence (row by row; a packed forward is one row). ``scoring.fp32`` does
    not apply: the logits are the model's, in its compute dtype, taken to fp32 here."""
    first = int(positions.min())
    width = inputs["input_ids"].shape[1]
    out = model(**inputs, use_cache=False, logits_to_keep=width - first)
    logits = out.logits  # [rows, width - first, vocab]
    rel = positions - first
    if logits.shape[0] == 1 and positions.shape[0] > 1:  # packed: one sequence
        picked = logits[0][rel]
    else:
        picked = logits[torch.arange(rel.shape[0], device=rel.device)[:, None], rel]
    z = picked.float() / scoring.temperature  # [B, C, vocab]
    lse = torch.logsumexp(z, -1)
    logp = z.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1) - lse
    with torch.no_grad():
        entropy = lse - (torch.softmax(z, -1) * z).sum(-1)
    return logp, entropy


@torch.no_grad()
def fill_fixed_logp(
    model: torch.nn.Module,
    mbs: list[MicroBatch],
    attr: str,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    scoring: Scoring = Scoring(),
) -> None:
    """Store old (or reference) log-probs once, before the updates change the policy.
    Same precision and scoring as the training forward, so the first ratio is exactly 1."""
    for mb in mbs:
        with autocast():
            logp, _ = completion_logp(model, mb, scoring=scoring)
        setattr(mb, attr, logp)


def _no_sync(model: torch.nn.Module, last: bool):  # noqa: ANN202
    """DDP: all-reduce once, after the last micro-batch (the gradients are full-size either
    way). FSDP2: reduce-scatter after every micro-batch. Skipping FSDP2's gradient sync
    would keep each rank's gradient of the whole model unsharded in fp32 until the last
    micro-batch: measured at 7B on 2 GPUs, 28.4 GiB where the sharded gradient is 14.2,
    and the h100x2 plan ran out of memory at step 2
    (bench/results/mem_probe_7b_h200x2_2026-11-26.md).
    FSDP is chosen for memory, so it pays a reduce-scatter per micro-batch instead."""
    if last or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


def pad_microbatches(mbs: list[MicroBatch], info: DistInfo) -> list[MicroBatch]:
    """All ranks run the same number of forward/backward passes (FSDP collectives)."""
    target = int(all_reduce_max(len(mbs), info))
    pad = [replace(mbs[0], weight=0.0) for _ in range(target - len(mbs))]
    return mbs + pad


def accumulate(
    model: torch.nn.Module,
    mbs: list[MicroBatch],
    algo: AlgoConfig,
    info: DistInfo,
    max_new_tokens: int,
    scaler: torch.amp.GradScaler | None,
    autocast: Callable[[], contextlib.AbstractContextManager],
    scoring: Scoring = Scoring(),
) -> dict[str, float]:
    """Forward/backward every micro-batch; gradients end up summed for one step. Tokens are
    scored as ``scoring`` says (temperature, precision of the LM head)."""
    local_tokens = sum(_tokens(mb) for mb in mbs if mb.weight)
    local_seqs = sum(len(mb.rows) for mb in mbs if mb.weight)
    total_tokens, num_seqs = all_reduce_sum([local_tokens, float(local_seqs)], info)
    # Statistics stay on the device until the end: a host sync per micro-batch would
    # stall the launch queue, and this loop is launch-bound on a GPU.
    sums = torch.zeros(len(STAT_KEYS), dtype=torch.float64, device=info.device)
    top = torch.zeros((), dtype=torch.float64, device=info.device)  # largest raw IS weight
    cap = algo.importance_cap
    for i, mb in enumerate(mbs):
        with _no_sync(model, last=i == len(mbs) - 1), autocast():
            logp, entropy = completion_logp(model, mb, True, scoring)
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
            keep = sequence_keep(logp, mb, cmask, algo.offpolicy_mask)
            loss_tok = loss_tok * tis_weight(logp, mb, cap) * keep
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
            sums += _stat_sums(
                loss.detach() / info.world_size, logp, entropy, stats, cmask, mb, cap, keep
            )
            top = torch.maximum(top, largest_weight(logp, mb, cmask))
    reduced = dict(zip(STAT_KEYS, all_reduce_sum(sums.tolist(), info), strict=True))
    tokens = max(reduced.pop("tokens"), 1.0)
    # The step's size, summed over ranks: a step's time is compared with steps of a similar
    # size (a steady step), and micro-batches count the launches it took.
    out = {"loss": reduced.pop("loss"), "train/tokens": total_tokens, "train/sequences": num_seqs}
    out["train/micro_batches"] = float(len(mbs))
    diff, engine_tokens = reduced.pop("logp_diff"), reduced.pop("engine_tokens")
    engine_kl, weight, clipped = (reduced.pop(k) for k in ("engine_kl", "is_weight", "is_clip"))
    if engine_tokens:
        out["rollout/logp_diff"] = diff / engine_tokens
        out["rollout/engine_kl"] = engine_kl / engine_tokens
        # the importance weights pi_old / pi_sampler: their mean as applied (capped where
        # algo.tis_cap is on), the largest before the cap, the share the cap cut
        out["rollout/is_weight_mean"] = weight / engine_tokens
        out["rollout/is_weight_max"] = all_reduce_max(float(top), info)
        out["rollout/is_clipped_frac"] = clipped / engine_tokens
    masked = reduced.pop("seq_masked")
    if algo.offpolicy_mask > 0 and engine_tokens:
        # completions off-policy sequence masking dropped (algo.offpolicy_mask)
        out["rollout/offpolicy_masked_frac"] = masked / max(num_seqs, 1.0)
    return out | {k: v / tokens for k, v in reduced.items()}


def _tokens(mb: MicroBatch) -> float:
    """Completion tokens of ``mb``: from the host when the split counted them."""
    if mb.tokens is not None:
        return float(mb.tokens)
    return float(mb.batch.completion_mask[mb.rows].sum())  # a device sync


STAT_KEYS = (
    "loss",
    "entropy",
    "kl",
    "clip_frac",
    "clip_frac_low",
    "clip_frac_high",
    "tokens",
    "logp_diff",
    "engine_kl",
    "engine_tokens",
    "is_weight",
    "is_clip",
    "seq_masked",
)


@torch.no_grad()
def _stat_sums(
    loss: torch.Tensor,
    logp: torch.Tensor,
    entropy: torch.Tensor | None,
    stats: TokenStats,
    cmask: torch.Tensor,
    mb: MicroBatch,
    cap: float = 0.0,
    keep: torch.Tensor | float = 1.0,
) -> torch.Tensor:
    """Token sums of the step statistics (order of STAT_KEYS), as one device tensor.
    ``logp_diff`` compares the rollout engine's log-probs with this forward's: a large
    value means the engine and the trainer disagree about the policy. ``engine_kl`` is the
    k3 estimate of KL(engine || trainer) on the engine's samples: with ``d = log p_trainer -
    log p_engine``, ``exp(d) - d - 1 >= 0`` per token (Schulman's k3; unbiased for the KL
    when the tokens are drawn from the engine's distribution, i.e. at T = 1 or with
    ``algo.tempered_logp``). ``is_weight`` / ``is_clip``: the importance weights
    :func:`tis_weight` applies (uncapped where ``cap`` is 0) and the tokens the cap cut;
    ``seq_masked``: the completions :func:`sequence_keep` dropped (``keep``), a count of
    rows, not tokens."""
    m = cmask.bool()
    low, high = stats.is_clipped_low & m, stats.is_clipped_high & m
    zero = loss.new_zeros(())
    diff, kl, n_engine, weight, cut = zero, zero, zero, zero, zero
    if mb.batch.sampled_logp is not None:
        sampled = mb.batch.sampled_logp[mb.rows].to(loss.device)
        d = logp - sampled
        diff = torch.where(m, d.abs(), 0.0).sum()
        kl = torch.where(m, torch.exp(d) - d - 1.0, 0.0).sum()
        n_engine = m.sum()
        raw = raw_weight(logp, mb)
        weight = torch.where(m, raw.clamp(max=cap) if cap > 0 else raw, 0.0).sum()
        cut = (m & (raw > cap)).sum() if cap > 0 else zero
    parts = [
        loss,
        torch.where(m, entropy, 0.0).sum() if entropy is not None else zero,
        torch.where(m, stats.kl, 0.0).sum(),
        (low | high).sum(),
        low.sum(),
        high.sum(),
        m.sum(),
        diff,
        kl,
        n_engine,
        weight,
        cut,
        (keep == 0).sum() if isinstance(keep, torch.Tensor) else zero,
    ]
    return torch.stack([p.double() for p in parts])
