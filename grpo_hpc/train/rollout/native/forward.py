"""Decoder math of the native engine: prefill of the prompts and one decode step.

Numerics follow transformers under autocast, so that greedy tokens match HF ``generate``:
the residual stream and RMSNorm are fp32, matrix products take compute-dtype (bf16/fp16)
inputs, rotary embedding is applied in fp32 and rounded once when it enters the cache.

Attention at decode is grouped-query aware without expanding the KV heads: the query of
each KV head's group of ``heads / kv_heads`` heads attends to that head's cache directly
(:mod:`attention`: two batched matrix products, or one Triton kernel in bf16/fp16 on
CUDA), over the cache prefix ``[0, span)`` only, where ``span`` is the caller's length
bucket. Masked keys are the left padding of each row and the not-yet-written tail.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grpo_hpc.train.rollout.native import attention
from grpo_hpc.train.rollout.native.sampling import Pick, pick
from grpo_hpc.train.rollout.native.weights import LayerWeights, Packed


@dataclass
class KVCache:
    """Static cache: ``k``/``v`` are [layers, rows, kv_heads, capacity, head_dim]."""

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
    """HF's LlamaRMSNorm in fp32: ``w * x / sqrt(mean(x^2) + eps)``."""
    var = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(var + eps))


def rope_tables(packed: Packed, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [..., head_dim] (fp32) for integer ``positions``."""
    freqs = positions.float().unsqueeze(-1) * packed.inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * packed.rope_scale, emb.sin() * packed.rope_scale


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [..., heads, d] by positions (cos/sin [..., d], broadcast over heads)."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x.float() * cos.unsqueeze(-2) + rot.float() * sin.unsqueeze(-2)


def _qkv(
    lw: LayerWeights, h: torch.Tensor, packed: Packed
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused projection, split into q [.., heads, d], k and v [.., kv_heads, d]."""
    s = packed.shape
    qkv = F.linear(h, lw.wqkv, lw.bqkv)
    nq, nkv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    q = qkv[..., :nq].unflatten(-1, (s.heads, s.head_dim))
    k = qkv[..., nq : nq + nkv].unflatten(-1, (s.kv_heads, s.head_dim))
    v = qkv[..., nq + nkv :].unflatten(-1, (s.kv_heads, s.head_dim))
    return q, k, v


def _mlp(lw: LayerWeights, x: torch.Tensor, packed: Packed, dtype: torch.dtype) -> torch.Tensor:
    h = rms_norm(x, lw.post_norm, packed.shape.eps).to(dtype)
    gate, up = F.linear(h, lw.wgu).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, lw.wdown).float()


def prefill(
    packed: Packed,
    ids: torch.Tensor,
    left_pad: torch.Tensor,
    cache: KVCache,
    rows_per_prompt: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Run the prompts [P, L] (left-padded) once; write their K/V into the cache rows of
    every completion of the group (rows ``i*G .. i*G+G-1`` get prompt ``i``); return the
    last position's logits [P, V] (the head's dtype: compute dtype, like the HF model's, or
    fp32 with ``algo.fp32_lm_head``)."""
    s = packed.shape
    n, length = ids.shape
    pos = torch.arange(length, device=ids.device)
    key_ok = pos.unsqueeze(0) >= left_pad.unsqueeze(1)  # [P, L]
    # Causal, no padding keys; a padding query may see itself so no softmax row is empty.
    allowed = (pos.unsqueeze(1) >= pos.unsqueeze(0)) & key_ok.unsqueeze(1)
    allowed |= torch.eye(length, dtype=torch.bool, device=ids.device)
    cos, sin = rope_tables(packed, (pos.unsqueeze(0) - left_pad.unsqueeze(1)).clamp(min=0))
    x = packed.embed[ids].float()
    group = s.heads // s.kv_heads
    rows = cache.k.shape[1]
    for li, lw in enumerate(packed.layers):
        h = rms_norm(x, lw.in_norm, s.eps).to(dtype)
        q, k, v = _qkv(lw, h, packed)
        q = apply_rope(q, cos, sin).to(dtype).transpose(1, 2)  # [P, heads, L, d]
        k = apply_rope(k, cos, sin).to(dtype).transpose(1, 2)
        v = v.transpose(1, 2)
        need = n * rows_per_prompt
        cache.k[li, :need, :, :length] = k.repeat_interleave(rows_per_prompt, 0)
        cache.v[li, :need, :, :length] = v.repeat_interleave(rows_per_prompt, 0)
        if need < rows:  # bucket padding rows: copies of the last row keep values finite
            cache.k[li, need:, :, :length] = k[-1:]
            cache.v[li, need:, :, :length] = v[-1:]
        out = F.scaled_dot_product_attention(
            q,
            k.repeat_interleave(group, 1),
            v.repeat_interleave(group, 1),
            attn_mask=allowed.unsqueeze(1),
        )
        x = x + F.linear(out.transpose(1, 2).flatten(2), lw.wo).float()
        x = _mlp(lw, x, packed, dtype)
    last = rms_norm(x[:, -1], packed.final_norm, s.eps).to(packed.lm_head.dtype)
    return F.linear(last, packed.lm_head)


def attn_in(
    x: torch.Tensor,
    norm: torch.Tensor,
    wqkv: torch.Tensor,
    bqkv: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    heads: int,
    kv_heads: int,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    pos: torch.Tensor,
) -> torch.Tensor:
    """Decode-step attention input of one layer: norm, fused q/k/v projection, rotary; k
    and v written into this layer's cache (``cache_k``/``cache_v`` [B, kv_heads, capacity,
    d]) at slot ``pos``. Returns q [B, heads, d] in the compute dtype. Writing the cache
    here lets the compiled step store k and v from the kernel that rotates them, instead
    of two more kernels per layer (0.2 ms of a 3B model's step at 64 rows, profile24)."""
    dtype = wqkv.dtype
    qkv = F.linear(rms_norm(x, norm, eps).to(dtype), wqkv, bqkv)
    d = cos.shape[-1]
    q = qkv[:, : heads * d].unflatten(-1, (heads, d))
    k = qkv[:, heads * d : (heads + kv_heads) * d].unflatten(-1, (kv_heads, d))
    v = qkv[:, (heads + kv_heads) * d :].unflatten(-1, (kv_heads, d))
    cache_k.index_copy_(2, pos, apply_rope(k, cos, sin).to(dtype).unsqueeze(2))
    cache_v.index_copy_(2, pos, v.unsqueeze(2))
    return apply_rope(q, cos, sin).to(dtype)


def out_mlp(
    x: torch.Tensor,
    out: torch.Tensor,
    wo: torch.Tensor,
    norm: torch.Tensor,
    wgu: torch.Tensor,
    wdown: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """Rest of the layer after the attention (``out`` [B, heads * d]): output projection,
    MLP; returns the new residual stream (fp32)."""
    x = x + F.linear(out, wo).float()
    gate, up = F.linear(rms_norm(x, norm, eps).to(wo.dtype), wgu).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, wdown).float()


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
    attention reads slots ``[0, span)``. Returns logits [B, V] (compute dtype)."""
    s = packed.shape
    b = tokens.shape[0]
    cos, sin = rope_tables(packed, pos - left_pad)  # [B, d]
    slots = torch.arange(span, device=tokens.device)
    ok = (slots.unsqueeze(0) >= left_pad.unsqueeze(1)) & (slots.unsqueeze(0) <= pos)
    bias = torch.zeros(ok.shape, dtype=torch.float32, device=tokens.device)
    bias = bias.masked_fill(~ok, float("-inf")).view(b, 1, 1, span)
    x = packed.embed[tokens].float()
    for li, lw in enumerate(packed.layers):
        q = fns.attn_in(
            x,
            lw.in_norm,
            lw.wqkv,
            lw.bqkv,
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
        out = fns.attend(q, keys, vals, bias, left_pad, pos)
        x = fns.out_mlp(x, out, lw.wo, lw.post_norm, lw.wgu, lw.wdown, s.eps)
    h = rms_norm(x, packed.final_norm, s.eps).to(packed.lm_head.dtype)
    return F.linear(h, packed.lm_head)
