"""Matrix products of a decode step: few rows (the batch, <= 64) against a whole weight.

At 64 rows a decode step's ``x @ W.T`` is bound by reading ``W`` once: a 3B model's
output projection moves 8.4 MB for 0.5 GFLOP. cuBLAS picks tiles made for large
products, so the small projections of a layer (q/k/v, output) ran at ~1.3 TB/s and the
larger ones at up to ~2.5 TB/s of the H100's ~3 TB/s (bench/results, "Issue 24, second
pass"). :func:`skinny_linear` is one Triton kernel whose programs each own a narrow strip
of ``W``'s rows (``BLOCK_N`` output columns) and stream it over the whole ``K`` once,
while every program reads the same small ``x`` (a few hundred KB, from L2). Narrow
strips give even a 2,048-column weight enough programs to fill every SM. The bias is
added to the fp32 accumulator and the sum rounded once, as cuBLAS's bias epilogue does.

Block sizes per weight shape come from ``bench/skinny_linear.py`` on an H100
(:func:`block_config`); the kernel is used where :func:`available` says so (CUDA,
bf16/fp16, compute capability 8.0+, at most :data:`MAX_ROWS` rows) and ``F.linear``
everywhere else, so the fp32 and CPU token streams are untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

try:  # Triton ships with CUDA builds of PyTorch; CPU builds have none
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installed torch
    triton = None

MAX_ROWS = 64
"""Most rows the kernel takes (one 64-row tile): beyond that cuBLAS's tiles are the ones
that fit, and the product stops being bound by reading the weight alone."""


@dataclass(frozen=True)
class BlockConfig:
    """Launch shape of the kernel for one weight shape."""

    block_n: int
    """Output columns (weight rows) per program: small enough for ``N / block_n`` programs
    to cover the GPU's SMs, large enough to keep each program's loads wide."""
    block_k: int
    """Reduction elements per loop iteration (the width of each load)."""
    warps: int
    """Warps per program."""
    stages: int
    """Software-pipelined loads in flight per program (Triton's ``num_stages``)."""


def block_config(n: int, k: int) -> BlockConfig:
    """Block sizes for a weight of ``n`` rows by ``k`` columns (bench/skinny_linear.py)."""
    if n <= 4096:
        return BlockConfig(16, 256, 4, 4)
    return BlockConfig(64, 128, 4, 4)


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the decode uses :func:`skinny_linear`: Triton present, bf16/fp16 on a GPU of
    compute capability 8.0+ (where it was measured; elsewhere ``F.linear``)."""
    if triton is None or device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


if triton is not None:

    @triton.jit
    def _skinny_kernel(
        x_ptr,
        w_ptr,
        b_ptr,
        out_ptr,
        M,
        N,
        K,
        stride_xm,
        stride_wn,
        stride_om,
        HAS_BIAS: tl.constexpr,
        EVEN_K: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        STAGES: tl.constexpr,
    ):
        rm = tl.arange(0, BLOCK_M)
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        m_ok = rm < M
        n_ok = rn < N
        x_ptrs = x_ptr + rm[:, None] * stride_xm + rk[None, :]
        w_ptrs = w_ptr + rn[:, None] * stride_wn + rk[None, :]
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            if EVEN_K:
                x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
                w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
            else:
                k_ok = (k0 + rk) < K
                x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
                w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            acc += tl.dot(x, tl.trans(w))
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        out_ptrs = out_ptr + rm[:, None] * stride_om + rn[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def launch(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, cfg: BlockConfig
) -> torch.Tensor:
    """``x @ w.T + bias`` by the kernel with block sizes ``cfg`` (x [M, K] with M <=
    :data:`MAX_ROWS`, w [N, K]; both with a contiguous last dimension)."""
    m, k = x.shape
    n = w.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _skinny_kernel[(triton.cdiv(n, cfg.block_n),)](
        x,
        w,
        bias if bias is not None else w,  # never read without HAS_BIAS
        out,
        m,
        n,
        k,
        x.stride(0),
        w.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None,
        EVEN_K=k % cfg.block_k == 0,
        BLOCK_M=max(16, triton.next_power_of_2(m)),
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        STAGES=cfg.stages,
        num_warps=cfg.warps,
    )
    return out


@torch.library.custom_op("grpo_hpc::skinny_linear", mutates_args=())
def _skinny_op(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return launch(x, w, bias, block_config(w.shape[0], w.shape[1]))


@_skinny_op.register_fake
def _(x, w, bias):  # noqa: ANN001, ANN202
    return x.new_empty(x.shape[0], w.shape[0])


def skinny_linear(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, w, bias)`` for a decode step's rows: the Triton kernel when ``x`` is
    2-D bf16/fp16 with at most :data:`MAX_ROWS` rows (the caller checked
    :func:`available`), ``F.linear`` otherwise (an fp32 LM head among them: ``tl.dot``
    would round fp32 inputs to TF32)."""
    low = x.dtype in (torch.bfloat16, torch.float16) and w.dtype == x.dtype
    if x.dim() != 2 or x.shape[0] > MAX_ROWS or not low:
        return F.linear(x, w, bias)
    return _skinny_op(x.contiguous(), w, bias)
