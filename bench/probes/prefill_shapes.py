"""Does the native engine's prefill stall the first time it meets a new prompt length?

The question behind the slow generations of a real run: in the real 2-GPU GSM8K run, a step now
and then had one rank generating 1.3 s against 0.45 s, and the stall sampler
(``training.stall_sample_ms``) found that rank inside the prefill's
``F.scaled_dot_product_attention`` call (``native/forward.py``) for 0.36 s and more. The
prefill runs eagerly at the batch's longest prompt, so every step can bring a length not
seen before; a backend that builds a plan per shape (cuDNN's attention does) pays for it
on the host at that call.

This probe makes the prefill's attention call as the engine makes it (``[P, heads, L, d]``
queries, keys and values repeated to the query heads, a boolean ``[P, 1, L, L]`` mask),
at SmolLM2-135M's shape by default, for every length in ``--lengths``: it times the first
call at each length (synchronised) and a second one, for the default backend choice and
for each backend forced with ``sdpa_kernel``. It prints, per backend, the median and worst
first call and the median repeat, and writes every time to ``--out``.

    python -m bench.probes.prefill_shapes --out prefill_shapes.json
    python -m bench.probes.prefill_shapes --lengths 100:400:1 --prompts 16
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS: dict[str, list[SDPBackend] | None] = {
    "default": None,
    "cudnn": [SDPBackend.CUDNN_ATTENTION],
    "efficient": [SDPBackend.EFFICIENT_ATTENTION],
    "math": [SDPBackend.MATH],
}


def attention_call(p: int, length: int, heads: int, kv_heads: int, dim: int) -> tuple:
    """Inputs shaped as the engine's prefill makes them (left padding of up to 40 tokens)."""
    dev, dt = torch.device("cuda"), torch.bfloat16
    q = torch.randn(p, heads, length, dim, device=dev, dtype=dt)
    k = torch.randn(p, kv_heads, length, dim, device=dev, dtype=dt)
    v = torch.randn(p, kv_heads, length, dim, device=dev, dtype=dt)
    left_pad = torch.randint(0, min(40, length - 1), (p,), device=dev)
    pos = torch.arange(length, device=dev)
    key_ok = pos.unsqueeze(0) >= left_pad.unsqueeze(1)
    allowed = (pos.unsqueeze(1) >= pos.unsqueeze(0)) & key_ok.unsqueeze(1)
    allowed |= torch.eye(length, dtype=torch.bool, device=dev)
    group = heads // kv_heads
    return q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), allowed.unsqueeze(1)


def timed(args: tuple) -> float:
    """Seconds for one call, the device synchronised before and after."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    F.scaled_dot_product_attention(args[0], args[1], args[2], attn_mask=args[3])
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def sweep(name: str, lengths: list[int], a: argparse.Namespace) -> dict:
    """First and repeat call at each length under one backend choice."""
    first, again = [], []
    backends = BACKENDS[name]
    ctx = sdpa_kernel(backends) if backends else contextlib.nullcontext()
    try:
        with ctx:
            for n in lengths:
                call = attention_call(a.prompts, n, a.heads, a.kv_heads, a.dim)
                first.append(timed(call))
                again.append(timed(call))
    except RuntimeError as e:  # a backend that cannot take this call (mask, dtype, arch)
        return {"backend": name, "error": str(e).splitlines()[0][:200]}
    return {
        "backend": name,
        "lengths": lengths,
        "first_s": first,
        "again_s": again,
        "first_median_ms": 1e3 * statistics.median(first),
        "first_worst_ms": 1e3 * max(first),
        "worst_length": lengths[first.index(max(first))],
        "over_50ms": sum(t > 0.05 for t in first),
        "again_median_ms": 1e3 * statistics.median(again),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="120:420:3", help="start:stop:step prompt lengths")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per prefill (P)")
    ap.add_argument("--heads", type=int, default=9, help="query heads (SmolLM2-135M: 9)")
    ap.add_argument("--kv-heads", type=int, default=3, help="key/value heads (SmolLM2: 3)")
    ap.add_argument("--dim", type=int, default=64, help="head dimension (SmolLM2: 64)")
    ap.add_argument("--backends", default="default,cudnn,efficient,math")
    ap.add_argument("--out", type=Path, default=None, help="write every time here (JSON)")
    a = ap.parse_args(argv)
    start, stop, step = (int(x) for x in a.lengths.split(":"))
    rows = []
    for i, name in enumerate(a.backends.split(",")):
        # each backend meets lengths it has not met: offset the sweep by one token per run
        lengths = list(range(start + i, stop + i, step))
        row = sweep(name, lengths, a)
        rows.append(row)
        if "error" in row:
            print(f"{name:>10}: cannot run: {row['error']}")
            continue
        print(
            f"{name:>10}: first call median {row['first_median_ms']:.2f} ms, worst "
            f"{row['first_worst_ms']:.1f} ms (length {row['worst_length']}), "
            f"{row['over_50ms']} of {len(lengths)} over 50 ms; repeat median "
            f"{row['again_median_ms']:.2f} ms"
        )
    if a.out:
        info = {
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name(),
            "cudnn": torch.backends.cudnn.version(),
            "args": vars(a) | {"out": str(a.out)},
        }
        a.out.write_text(json.dumps(info | {"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
