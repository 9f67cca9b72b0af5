"""One update under ``torch.profiler``: GPU kernel time by kind, the GPU's busy share and
the top kernels."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any


def _start_profiler() -> Any:
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    prof.__enter__()
    return (prof, time.monotonic())


def _kind(name: str) -> str:
    n = name.lower()
    if "nccl" in n:
        return "nccl"
    if any(k in n for k in ("gemm", "cutlass", "xmma", "nvjet", "cublas", "wgmma")):
        return "gemm"
    if any(k in n for k in ("flash", "fmha", "attention", "sdpa", "efficient")):
        return "attention"
    if any(k in n for k in ("adam", "multi_tensor", "foreach", "norm_")):
        return "optimizer_or_norm"
    if any(k in n for k in ("memcpy", "memset", "copy")):
        return "copy"
    if "triton" in n:
        return "triton_fused"
    return "other"


def _stop_profiler(handle: Any) -> dict:
    import torch

    prof, t0 = handle
    torch.cuda.synchronize()
    wall = time.monotonic() - t0
    prof.__exit__(None, None, None)
    kinds: dict[str, float] = defaultdict(float)
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    spans: list[tuple[float, float]] = []
    launches = 0
    for ev in prof.events():
        dev_type = str(getattr(ev, "device_type", ""))
        if "CUDA" in dev_type and ev.time_range.elapsed_us() > 0:
            us = ev.time_range.elapsed_us()
            kinds[_kind(ev.name)] += us
            kernels[ev.name][0] += us
            kernels[ev.name][1] += 1
            spans.append((ev.time_range.start, ev.time_range.end))
        elif ev.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"):
            launches += 1
    busy, end = 0.0, -1.0
    nccl_us = kinds.get("nccl", 0.0)
    for a, b in sorted(spans):
        if b <= end:
            continue
        busy += b - max(a, end)
        end = b
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:15]
    return {
        "wall_s": round(wall, 3),
        "gpu_busy_s": round(busy / 1e6, 3),
        "kernel_s_by_kind": {k: round(v / 1e6, 3) for k, v in sorted(kinds.items())},
        "nccl_s": round(nccl_us / 1e6, 3),
        "kernel_launches": launches,
        "top_kernels": [
            {"name": n[:120], "s": round(v[0] / 1e6, 4), "calls": v[1]} for n, v in top
        ],
    }
