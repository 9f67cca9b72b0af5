"""Decode-step attention over the static KV cache: one new query token per row, grouped
query heads (GQA), keys masked where they are a row's left padding, outside a sliding
window, or not yet written.

Two implementations of the same function ``attend(q, keys, vals, bias, lower, pos,
scale)``: a row sees the slots ``[lower, pos]`` (``lower``: its left padding, or in a
sliding-window layer ``max(left_pad, pos - window + 1)``); ``scale`` multiplies the
scores (``head_dim ** -0.5`` unless the family sets its own: Gemma 3).

- :func:`grouped_attention`, plain tensor operations: the ``heads / kv_heads`` query heads
  that share a KV head are the rows of one batched matrix product for the scores and one
  for the values, softmax in fp32 between them (``bias`` holds the mask). Used on the CPU,
  in fp32, and wherever Triton is missing.
- :func:`fused_attention`, one Triton kernel per layer (bf16/fp16 on CUDA): a program per
  (row, KV head) streams that head's keys and values once, block by block, with the
  running maximum and sum of the softmax (online softmax, as in flash-decoding, without
  splitting the span: 64 rows x 2 KV heads already fill an H100's 132 SMs), and skips
  the blocks that lie wholly below ``lower`` (left padding, or keys that left the
  window). The mask comes from ``lower`` and ``pos``.
  The scores stay in fp32 (the plain path rounds them to bf16 first), so the two differ
  by bf16 rounding; tests/e2e/test_native_gpu.py bounds the difference.

Why a kernel of our own: at 64 rows the plain path is three kernels per layer (scores,
softmax, values) and took ~17 us of a 3B model's ~125 us layer while moving ~10 MB, about
a quarter of the memory bandwidth; PyTorch's SDPA kernels and FlexAttention's decoding
kernel were no faster at this shape (``bench/probes/decode_attention.py``).
"""

from __future__ import annotations

import functools

import torch

from grpo_hpc.train.distributed import gpu

try:  # Triton ships with CUDA builds of PyTorch; CPU builds have none
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installed torch
    triton = None


def grouped_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    vals: torch.Tensor,
    bias: torch.Tensor,
    lower: torch.Tensor,
    pos: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """q [B, heads, d]; keys/vals [B, kv, span, d]; ``bias`` [B, 1, 1, span] (0 or -inf)
    masks; returns [B, heads * d] in q's dtype. ``lower``/``pos`` are unused here (the
    fused kernel's mask); ``scale``: of the scores (None: ``d ** -0.5``)."""
    b, kv, _, d = keys.shape
    qg = q.view(b, kv, q.shape[1] // kv, d)  # the query heads that share one KV head
    scale = d**-0.5 if scale is None else scale
    scores = torch.matmul(qg, keys.transpose(-1, -2)).float() * scale + bias
    return torch.matmul(torch.softmax(scores, dim=-1).to(q.dtype), vals).reshape(b, -1)


def fused_available(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the engine uses :func:`fused_attention`: Triton present, bf16/fp16, a head
    size that is a power of two from 16 to 256 (the kernel's block shape), and a GPU of
    compute capability 8.0+ (A100, H100: where it was measured; a V100 keeps the matrix
    products, as ``auto_speed`` keeps its plain update; an emulated one under
    ``GRPO_HPC_EMULATE_GPU`` counts as what it emulates)."""
    if triton is None or device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return False
    if head_dim not in (16, 32, 64, 128, 256):
        return False
    return gpu.capability(device) >= (8, 0)


if triton is not None:

    @triton.jit
    def _decode_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        out_ptr,
        left_pad_ptr,
        pos_ptr,
        stride_qb,
        stride_qh,
        stride_kb,
        stride_kh,
        stride_ks,
        stride_vb,
        stride_vh,
        stride_vs,
        scale,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        D: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        head = tl.program_id(1)  # the KV head
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, D)
        q_rows = head * GROUP + g
        q = tl.load(
            q_ptr + row * stride_qb + q_rows[:, None] * stride_qh + d[None, :],
            mask=(g < GROUP)[:, None],
            other=0.0,
        )
        lp = tl.load(left_pad_ptr + row)
        last = tl.load(pos_ptr)  # slots [lp, last] are this row's keys
        k_base = k_ptr + row * stride_kb + head * stride_kh
        v_base = v_ptr + row * stride_vb + head * stride_vh
        m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        total = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, D], tl.float32)
        for start in range((lp // BLOCK) * BLOCK, last + 1, BLOCK):
            s = start + tl.arange(0, BLOCK)
            inside = s <= last
            keep = inside[:, None]
            k = tl.load(k_base + s[:, None] * stride_ks + d[None, :], mask=keep, other=0.0)
            v = tl.load(v_base + s[:, None] * stride_vs + d[None, :], mask=keep, other=0.0)
            scores = tl.dot(q, tl.trans(k)) * scale  # [GROUP_PAD, BLOCK], fp32
            scores = tl.where(((s >= lp) & inside)[None, :], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, 1))
            p = tl.exp(scores - m_new[:, None])
            alpha = tl.exp(m - m_new)
            total = total * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        out = acc / total[:, None]
        out_rows = row * (tl.num_programs(1) * GROUP) + q_rows
        tl.store(
            out_ptr + out_rows[:, None] * D + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=(g < GROUP)[:, None],
        )


@functools.cache
def _group_pad(group: int) -> int:
    """Query rows per program: a power of two of at least 16 (``tl.dot``'s least size)."""
    return max(16, triton.next_power_of_2(group))


@torch.library.custom_op("grpo_hpc::decode_attention", mutates_args=())
def _fused_op(
    q: torch.Tensor,
    keys: torch.Tensor,
    vals: torch.Tensor,
    left_pad: torch.Tensor,
    pos: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    # ``left_pad``: each row's first visible slot (the window's start in windowed layers)
    b, heads, d = q.shape
    kv = keys.shape[1]
    out = torch.empty(b, heads * d, dtype=q.dtype, device=q.device)
    group = heads // kv
    _decode_kernel[(b, kv)](
        q,
        keys,
        vals,
        out,
        left_pad,
        pos,
        q.stride(0),
        q.stride(1),
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        vals.stride(0),
        vals.stride(1),
        vals.stride(2),
        d**-0.5 if scale is None else scale,
        GROUP=group,
        GROUP_PAD=_group_pad(group),
        D=d,
        BLOCK=64,
    )
    return out


@_fused_op.register_fake
def _(q, keys, vals, left_pad, pos, scale=None):  # noqa: ANN001, ANN202
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])


def fused_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    vals: torch.Tensor,
    bias: torch.Tensor,
    lower: torch.Tensor,
    pos: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """:func:`grouped_attention` as one Triton kernel (needs :func:`fused_available`);
    the mask is taken from ``lower`` [B] (first visible slot per row) and ``pos`` [1],
    ``bias`` is unused. The keys' and values' last dimension must be contiguous (a cache
    view is)."""
    return _fused_op(q.contiguous(), keys, vals, lower, pos, scale)
