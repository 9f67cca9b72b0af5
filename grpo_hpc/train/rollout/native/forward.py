"""Decoder math of the native engine: prefill of the prompts and one decode step.

One decoder layer, written once, for every family of ``SUPPORTED_TYPES``
(grpo_hpc.config.rollout_engine): llama (Llama 2/3, 3.x rotary scaling), qwen2, qwen3,
mistral and ministral (sliding windows), olmo2, smollm3, phi3, gemma3_text. What differs
between them is data, fields of the packed :class:`~weights.Shape` and which optional
weights a layer has, never a class of its own:

- norms: before attention and MLP (``pre_norms``), after them (``post_norms``: OLMo 2
  alone, Gemma 3 both); q/k RMSNorm per head or over the whole projection (``qk_norm``);
- rotary: one table per layer type (``rope``: Gemma 3's local and global bases), an
  all-zero table for layers without rotary (SmolLM3), the first ``rotary_dim`` dimensions
  of a head only (Phi-3's partial rotary), the model's own frequencies and attention
  scaling (llama3, linear, longrope's short factors);
- attention: a per-layer sliding window (``window``), the family's score scale
  (``attn_scale``: Gemma's ``query_pre_attn_scalar``);
- embeddings scaled after the lookup (Gemma), SiLU or GELU-tanh gating in the MLP.

Numerics follow transformers under autocast, so that greedy tokens match HF ``generate``:
the residual stream and RMSNorm are fp32, matrix products take compute-dtype (bf16/fp16)
inputs, rotary embedding is applied in fp32 and rounded once when it enters the cache; a
post-norm's output is rounded to the compute dtype before it joins the residual, as HF's
norm returns its input's dtype. In fp32 on the CPU every family's greedy tokens equal HF
``generate``'s (tests/unit/train/rollout/test_native_families.py).

Attention at decode is grouped-query aware without expanding the KV heads: the query of
each KV head's group of ``heads / kv_heads`` heads attends to that head's cache directly
(:mod:`attention`: two batched matrix products, or one Triton kernel in bf16/fp16 on
CUDA), over the cache prefix ``[0, span)`` only, where ``span`` is the caller's length
bucket. Masked keys are the left padding of each row, keys that left a sliding window,
and the not-yet-written tail. The decode functions (:class:`DecodeFns`) branch only on
which arguments are None and on tensor sizes, both fixed per model, so each compiles to
one full graph and the step replays as a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grpo_hpc.train.rollout.native import attention
from grpo_hpc.train.rollout.native.sampling import Pick, pick
from grpo_hpc.train.rollout.native.weights import Packed
from grpo_hpc.train.rollout.types import repeat_rows


@dataclass
class KVCache:
    """Static cache: ``k``/``v`` are [layers, rows, kv_heads, capacity, head_dim], every
    layer at full capacity, sliding-window layers too (a windowed layer's slots older
    than its window are kept and masked, not reused): one tensor per K and V, static
    addresses for the CUDA graphs. Holds k after rotary (and q/k norm), v as projected."""

    k: torch.Tensor
    v: torch.Tensor

    @classmethod
    def empty(cls, packed: Packed, rows: int, capacity: int, dtype: torch.dtype) -> KVCache:
        s = packed.shape
        size = (s.layers, rows, s.kv_heads, capacity, s.head_dim)
        dev = packed.embed.device
        return cls(
            torch.zeros(size, dtype=dtype, device=dev), torch.zeros(size, dtype=dtype, device=dev)
        )

    @property
    def rows(self) -> int:
        return self.k.shape[1]

    @property
    def capacity(self) -> int:
        return self.k.shape[3]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm in fp32: ``w * x / sqrt(mean(x^2) + eps)`` (Gemma's ``1 + w`` is
    folded into the packed weight)."""
    x = x.float()
    var = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(var + eps))


def rope_tables(packed: Packed, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """cos/sin [..., rotary_dim] (fp32) of every rotary table for integer ``positions``."""
    freqs = positions.float().unsqueeze(-1).unsqueeze(-2) * packed.inv_freq  # [.., T, d/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    return [
        (cos[..., i, :] * scale, sin[..., i, :] * scale)
        for i, scale in enumerate(packed.rope_scale)
    ]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [..., heads, d] by positions (cos/sin [..., r], broadcast over heads):
    the first ``r`` dimensions of each head (r < d: partial rotary, the rest passes through
    as HF's Phi-3 does). Returns fp32."""
    r = cos.shape[-1]
    x = x.float()
    xr = x[..., :r]
    half = r // 2
    rot = torch.cat((-xr[..., half:], xr[..., :half]), dim=-1)
    out = xr * cos.unsqueeze(-2) + rot * sin.unsqueeze(-2)
    return out if r == x.shape[-1] else torch.cat((out, x[..., r:]), dim=-1)


def qk_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """q or k [..., heads, d] after their RMSNorm (fp32): over each head when the weight
    has ``d`` entries (Qwen3, Gemma 3), else over the whole projection (OLMo 2); ``x``
    itself without a weight. The weight's size is static, so this branch is too."""
    if weight is None:
        return x
    if weight.shape[0] == x.shape[-1]:
        return rms_norm(x, weight, eps)
    return rms_norm(x.flatten(-2), weight, eps).view(x.shape)


def split_qkv(
    qkv: torch.Tensor, heads: int, kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused projection's output [..., (heads + 2 kv) d] as q [.., heads, d], k and v
    [.., kv_heads, d]."""
    d = qkv.shape[-1] // (heads + 2 * kv_heads)
    q = qkv[..., : heads * d].unflatten(-1, (heads, d))
    k = qkv[..., heads * d : (heads + kv_heads) * d].unflatten(-1, (kv_heads, d))
    v = qkv[..., (heads + kv_heads) * d :].unflatten(-1, (kv_heads, d))
    return q, k, v


def _maybe_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    return x if weight is None else rms_norm(x, weight, eps)


def _joined(y: torch.Tensor, norm: torch.Tensor | None, eps: float) -> torch.Tensor:
    """A sublayer's output (compute dtype) as it joins the fp32 residual stream: after its
    post-norm where the family has one, rounded to the compute dtype as HF's norm returns
    its input's dtype (OLMo 2, Gemma 3; a no-op in fp32)."""
    if norm is None:
        return y.float()
    return rms_norm(y, norm, eps).to(y.dtype).float()


def _mlp(
    x: torch.Tensor,
    norm: torch.Tensor | None,
    wgu: torch.Tensor,
    wdown: torch.Tensor,
    out_norm: torch.Tensor | None,
    eps: float,
    gelu: bool,
) -> torch.Tensor:
    """``x`` plus the MLP of ``x`` (SwiGLU, or GELU-tanh gated for Gemma)."""
    h = _maybe_norm(x, norm, eps).to(wgu.dtype)
    gate, up = F.linear(h, wgu).chunk(2, dim=-1)
    act = F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)
    return x + _joined(F.linear(act * up, wdown), out_norm, eps)


def prefill_chunks(lengths: list[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive chunks ``[a, b)`` of the prompts (their token ``lengths``, in order)
    whose ``prompts x longest prompt`` (the chunk's padded tokens) stays within ``budget``;
    a prompt longer than the budget is a chunk of its own. ``budget`` 0: one chunk (pure).

    Why: the prefill's transient (each layer's q/k/v, the MLP's [P, L, intermediate]
    products, a [P, 1, L, L] mask) grows with the padded tokens of the prompts run at once;
    partial rollouts give the engine many continued answers of thousands of tokens each."""
    n = len(lengths)
    if not budget or n == 0:
        return [(0, n)]
    chunks: list[tuple[int, int]] = []
    start, widest = 0, 0
    for i, length in enumerate(lengths):
        wider = max(widest, length, 1)
        if i > start and (i + 1 - start) * wider > budget:
            chunks.append((start, i))
            start, wider = i, max(length, 1)
        widest = wider
    chunks.append((start, n))
    return chunks


def prefill(
    packed: Packed,
    ids: torch.Tensor,
    left_pad: torch.Tensor,
    cache: KVCache,
    rows_per_prompt: int | list[int],
    dtype: torch.dtype,
    first_row: int = 0,
    first_slot: int = 0,
    pad_after: bool = True,
) -> torch.Tensor:
    """Run the prompts [P, L] (left-padded) once; write their K/V into the cache rows of
    every completion of the group (``rows_per_prompt``: G, rows ``i*G .. i*G+G-1`` get
    prompt ``i``; or one count per prompt, prompt ``i``'s rows following prompt ``i-1``'s);
    return the last position's logits [P, V] (the head's dtype: compute dtype, like the HF
    model's, or fp32 with ``algo.fp32_lm_head``).

    A chunk of a rollout's prompts (:func:`prefill_chunks`) passes where its rows and
    slots lie in the rollout's cache: its first prompt's rows start at ``first_row``, and
    ``ids``' column 0 is slot ``first_slot`` (the chunk dropped the rollout's leading
    columns that are padding in each of its prompts: every row of a rollout decodes at one
    slot index, so a prompt's last token stays at slot ``first_slot + L - 1``, where the
    unchunked prefill writes it). Slots ``[0, first_slot)`` of its rows are left padding,
    masked at decode, and are zeroed: a masked key still meets an additive -inf bias (the
    matrix-product attention) and its value a zero weight (both attentions), so it must be
    finite; a workspace's stale values of an earlier rollout are, but zeros need no proof.
    ``pad_after``: fill the cache's bucket-padding rows after the last row (the last chunk
    does). The defaults are the unchunked prefill, the code path of every rollout that fits
    one chunk."""
    s = packed.shape
    n, length = ids.shape
    rows = cache.k.shape[1]
    counts = [rows_per_prompt] * n if isinstance(rows_per_prompt, int) else rows_per_prompt
    need = sum(counts)
    end = first_row + need  # one past this call's last row
    padded = pad_after and end < rows  # bucket padding rows: copies of the last row
    slots = slice(first_slot, first_slot + length)
    if first_slot:
        cache.k[:, first_row : rows if padded else end, :, :first_slot] = 0
        cache.v[:, first_row : rows if padded else end, :, :first_slot] = 0
    pos = torch.arange(length, device=ids.device)
    key_ok = pos.unsqueeze(0) >= left_pad.unsqueeze(1)  # [P, L]
    causal = pos.unsqueeze(1) >= pos.unsqueeze(0)
    masks = {}
    for window in set(s.window) | {0}:
        near = causal if not window else causal & (pos.unsqueeze(1) - pos.unsqueeze(0) < window)
        # No padding keys; a padding query may see itself so no softmax row is empty.
        allowed = near & key_ok.unsqueeze(1)
        masks[window] = (
            allowed | torch.eye(length, dtype=torch.bool, device=ids.device)
        ).unsqueeze(1)
    tables = rope_tables(packed, (pos.unsqueeze(0) - left_pad.unsqueeze(1)).clamp(min=0))
    x = packed.embed[ids].float() * s.embed_scale
    group = s.heads // s.kv_heads
    # Each completion row's prompt, made once rather than per layer (equal counts keep the
    # integer repeat every rollout used before mixed counts existed).
    source = (
        None if len(set(counts)) == 1 else repeat_rows(torch.arange(n, device=ids.device), counts)
    )

    def spread(x: torch.Tensor) -> torch.Tensor:
        return x.repeat_interleave(counts[0], 0) if source is None else x.index_select(0, source)

    for li, lw in enumerate(packed.layers):
        h = _maybe_norm(x, lw.attn_norm, s.eps).to(dtype)
        q, k, v = split_qkv(F.linear(h, lw.wqkv, lw.bqkv), s.heads, s.kv_heads)
        cos, sin = tables[s.layer_rope(li)]
        q = apply_rope(qk_norm(q, lw.q_norm, s.eps), cos, sin).to(dtype).transpose(1, 2)
        k = apply_rope(qk_norm(k, lw.k_norm, s.eps), cos, sin).to(dtype).transpose(1, 2)
        v = v.transpose(1, 2)  # [P, kv_heads, L, d]
        cache.k[li, first_row:end, :, slots] = spread(k)
        cache.v[li, first_row:end, :, slots] = spread(v)
        if padded:  # bucket padding rows: copies of the last row keep values finite
            cache.k[li, end:, :, slots] = k[-1:]
            cache.v[li, end:, :, slots] = v[-1:]
        out = F.scaled_dot_product_attention(
            q,
            k.repeat_interleave(group, 1),
            v.repeat_interleave(group, 1),
            attn_mask=masks[s.layer_window(li)],
            scale=s.attn_scale or None,
        )
        x = x + _joined(F.linear(out.transpose(1, 2).flatten(2), lw.wo), lw.attn_out_norm, s.eps)
        x = _mlp(x, lw.mlp_norm, lw.wgu, lw.wdown, lw.mlp_out_norm, s.eps, s.gelu)
    last = rms_norm(x[:, -1], packed.final_norm, s.eps).to(packed.lm_head.dtype)
    return F.linear(last, packed.lm_head)


def attn_in(
    x: torch.Tensor,
    norm: torch.Tensor | None,
    wqkv: torch.Tensor,
    bqkv: torch.Tensor | None,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    heads: int,
    kv_heads: int,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    pos: torch.Tensor,
) -> torch.Tensor:
    """Decode-step attention input of one layer: norm (if the family has pre-norms), fused
    q/k/v projection, q/k norms (if any), rotary; k and v written into this layer's cache
    (``cache_k``/``cache_v`` [B, kv_heads, capacity, d]) at slot ``pos``. Returns q [B,
    heads, d] in the compute dtype. Writing the cache here lets the compiled step store k
    and v from the kernel that rotates them, instead of two more kernels per layer (0.2 ms
    of a 3B model's step at 64 rows, profile24). Every branch is on an argument being None
    or on a size: static for a compiled graph."""
    dtype = wqkv.dtype
    qkv = F.linear(_maybe_norm(x, norm, eps).to(dtype), wqkv, bqkv)
    q, k, v = split_qkv(qkv, heads, kv_heads)
    k = apply_rope(qk_norm(k, k_norm, eps), cos, sin).to(dtype)
    cache_k.index_copy_(2, pos, k.unsqueeze(2))
    cache_v.index_copy_(2, pos, v.unsqueeze(2))
    return apply_rope(qk_norm(q, q_norm, eps), cos, sin).to(dtype)


def out_mlp(
    x: torch.Tensor,
    out: torch.Tensor,
    wo: torch.Tensor,
    attn_out_norm: torch.Tensor | None,
    norm: torch.Tensor | None,
    wgu: torch.Tensor,
    wdown: torch.Tensor,
    mlp_out_norm: torch.Tensor | None,
    eps: float,
    gelu: bool,
) -> torch.Tensor:
    """Rest of the layer after the attention (``out`` [B, heads * d]): output projection
    (and its post-norm), MLP (with its norms); returns the new residual stream (fp32)."""
    x = x + _joined(F.linear(out, wo), attn_out_norm, eps)
    return _mlp(x, norm, wgu, wdown, mlp_out_norm, eps, gelu)


@dataclass
class DecodeFns:
    """The per-layer pieces of a decode step; :meth:`compiled` fuses their elementwise
    work (norms, rotary, casts, softmax) into a few kernels, which is most of the gain
    once the step runs as a CUDA graph: a 0.5B model's step is hundreds of tiny kernels."""

    attn_in: Callable[..., torch.Tensor] = attn_in
    attend: Callable[..., torch.Tensor] = attention.grouped_attention
    """Attention over the cache (:mod:`attention`: plain operations, or one Triton kernel)."""
    out_mlp: Callable[..., torch.Tensor] = out_mlp
    pick: Pick = pick
    """Token choice from the logits (:func:`sampling.pick`). Compiled, its passes over the
    [rows, vocab] logits fuse: eager, two softmaxes over a 152k vocabulary alone took
    0.15 ms of a 3B model's 5 ms step at 64 rows
    (bench/results/archive/profile_step_eager_h100_2026-11-25)."""

    @classmethod
    def compiled(cls, mode: str | None = None, fused_attention: bool = False) -> DecodeFns:
        """``mode``: torch.compile's (None: the default; benchmarks try others);
        ``fused_attention``: the Triton attention kernel (``attention.fused_available``)."""
        attend = (
            attention.fused_attention
            if fused_attention
            else torch.compile(attention.grouped_attention, dynamic=None, fullgraph=True, mode=mode)
        )
        return cls(
            torch.compile(attn_in, dynamic=False, fullgraph=True, mode=mode),
            attend,
            torch.compile(out_mlp, dynamic=False, fullgraph=True, mode=mode),
            torch.compile(pick, dynamic=False, fullgraph=True, mode=mode),
        )


EAGER = DecodeFns()


def decode_step(
    packed: Packed,
    cache: KVCache,
    tokens: torch.Tensor,
    pos: torch.Tensor,
    left_pad: torch.Tensor,
    span: int,
    fns: DecodeFns = EAGER,
) -> torch.Tensor:
    """One token for every row: ``tokens`` [B] sit at cache slot ``pos`` (a 1-element
    device tensor, so CUDA graphs can replay this for any position in the bucket);
    attention reads slots ``[0, span)``. Returns logits [B, V] (compute dtype).

    A row sees slots from ``lower`` to ``pos``: ``lower`` is its left padding, or, in a
    sliding-window layer, ``max(left_pad, pos - window + 1)`` (the window counts the
    current token, as HF's mask does). One mask per distinct window of the model, built
    once per step from device tensors (no host branch on positions)."""
    s = packed.shape
    b = tokens.shape[0]
    tables = rope_tables(packed, pos - left_pad)  # each [B, r]
    slots = torch.arange(span, device=tokens.device).unsqueeze(0)
    masks = {}
    for window in set(s.window) | {0}:
        lower = left_pad if not window else torch.maximum(left_pad, pos - (window - 1))
        ok = (slots >= lower.unsqueeze(1)) & (slots <= pos)
        bias = torch.zeros(ok.shape, dtype=torch.float32, device=tokens.device)
        masks[window] = (bias.masked_fill(~ok, float("-inf")).view(b, 1, 1, span), lower)
    scale = s.attn_scale or s.head_dim**-0.5
    x = packed.embed[tokens].float() * s.embed_scale
    for li, lw in enumerate(packed.layers):
        cos, sin = tables[s.layer_rope(li)]
        q = fns.attn_in(
            x,
            lw.attn_norm,
            lw.wqkv,
            lw.bqkv,
            lw.q_norm,
            lw.k_norm,
            cos,
            sin,
            s.eps,
            s.heads,
            s.kv_heads,
            cache.k[li],
            cache.v[li],
            pos,
        )
        keys, vals = cache.k[li, :, :, :span], cache.v[li, :, :, :span]
        bias, lower = masks[s.layer_window(li)]
        out = fns.attend(q, keys, vals, bias, lower, pos, scale)
        x = fns.out_mlp(
            x,
            out,
            lw.wo,
            lw.attn_out_norm,
            lw.mlp_norm,
            lw.wgu,
            lw.wdown,
            lw.mlp_out_norm,
            s.eps,
            s.gelu,
        )
    h = rms_norm(x, packed.final_norm, s.eps).to(packed.lm_head.dtype)
    return F.linear(h, packed.lm_head)
