"""Benchmark: the decode step's matrix products at few rows, cuBLAS against the engine's
Triton kernel (``grpo_hpc.train.native.skinny``) over a grid of block sizes (issue 24,
point 3: the decode near its roofline).

Each product is ``x [rows, K] @ W [N, K].T`` for one of a layer's fused weights (q/k/v
with bias, output, gate/up, down) or the LM head. It reads ``W`` once, so its roofline is
``N * K * 2 bytes / HBM bandwidth``. Timed as the engine runs it: one call per layer over
distinct weights (together larger than the L2 cache, so no call finds its weight there)
captured in a CUDA graph and replayed. Prints microseconds per call and TB/s of weight
read for cuBLAS (``F.linear``), the engine's chosen blocks (``block_config``) and the
best of the grid, and checks every kernel's output against an fp32 product.

    python bench/skinny_linear.py --shapes qwen2.5-0.5b qwen2.5-1.5b qwen2.5-3b \
        --rows 64 --out bench/results/h100_skinny_linear.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SHAPES, env_info, write_result  # noqa: E402

Linear = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
GRID_N = (16, 32, 64, 128)
GRID_K = (64, 128, 256)
GRID_STAGES = (3, 4, 6)
L2_BYTES = 256 << 20  # weights per graph: several times any GPU's L2


def products(shape: str) -> dict[str, tuple[int, int, bool]]:
    """name -> (N, K, has bias) of the decode step's matrix products for ``shape``."""
    h, _, heads, kv, inter, vocab = SHAPES[shape]
    d = h // heads
    return {
        "qkv": ((heads + 2 * kv) * d, h, True),
        "o": (h, heads * d, False),
        "gate_up": (2 * inter, h, False),
        "down": (h, inter, False),
        "lm_head": (vocab, h, False),
    }


def time_graph(fn: Linear, x: torch.Tensor, ws: list[torch.Tensor], bias, reps: int) -> float:  # noqa: ANN001
    """Seconds per call: one call per weight captured in a CUDA graph, replayed."""
    for w in ws[:2]:
        fn(x, w, bias)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for w in ws:
            fn(x, w, bias)
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / (reps * len(ws))


def kernel(cfg) -> Linear:  # noqa: ANN001
    from grpo_hpc.train.native.skinny import launch

    return lambda x, w, b: launch(x, w, b, cfg)


def measure(n: int, k: int, has_bias: bool, rows: int, reps: int, grid: bool) -> dict:
    from grpo_hpc.train.native.skinny import BlockConfig, block_config

    dev, dt = torch.device("cuda"), torch.bfloat16
    copies = max(2, min(64, L2_BYTES // (n * k * 2)))
    ws = [torch.randn(n, k, device=dev, dtype=dt) * k**-0.5 for _ in range(copies)]
    x = torch.randn(rows, k, device=dev, dtype=dt)
    bias = torch.randn(n, device=dev, dtype=dt) if has_bias else None
    ref = F.linear(x.float(), ws[0].float(), None if bias is None else bias.float())
    weight_bytes = n * k * 2

    def row(name: str, fn: Linear) -> dict:
        err = (fn(x, ws[0], bias).float() - ref).abs().max().item()
        sec = time_graph(fn, x, ws, bias, reps)
        return {"impl": name, "us": sec * 1e6, "tb_s": weight_bytes / sec / 1e12, "max_err": err}

    out = [row("cublas", F.linear), row("chosen", kernel(block_config(n, k)))]
    if grid:
        for bn, bk, st in itertools.product(GRID_N, GRID_K, GRID_STAGES):
            for warps in (4, 8) if bn >= 64 else (4,):
                cfg = BlockConfig(bn, bk, warps, st)
                try:
                    out.append(row(f"n{bn}-k{bk}-w{warps}-s{st}", kernel(cfg)))
                except Exception as e:  # noqa: BLE001 - e.g. more shared memory than the GPU has
                    print(f"  n{bn}-k{bk}-w{warps}-s{st}: {type(e).__name__}", flush=True)
    return {"n": n, "k": k, "bias": has_bias, "rows": rows, "copies": copies, "impls": out}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shapes", nargs="+", default=["qwen2.5-1.5b", "qwen2.5-3b"], choices=SHAPES)
    ap.add_argument("--rows", type=int, nargs="+", default=[64])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-grid", action="store_true", help="only cuBLAS and the chosen blocks")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    results = []
    for shape, rows in itertools.product(args.shapes, args.rows):
        for name, (n, k, has_bias) in products(shape).items():
            r = measure(n, k, has_bias, rows, args.reps, not args.no_grid)
            r |= {"shape": shape, "product": name}
            results.append(r)
            by = {i["impl"]: i for i in r["impls"]}
            best = min(r["impls"][1:], key=lambda i: i["us"])
            print(
                f"{shape:13} {name:8} rows {rows:3} N {n:6} K {k:5}"
                f"  cublas {by['cublas']['us']:7.1f} us"
                f" {by['cublas']['tb_s']:4.2f} TB/s  chosen {by['chosen']['us']:7.1f} us"
                f" {by['chosen']['tb_s']:4.2f}  best {best['impl']} {best['us']:7.1f} us"
                f" {best['tb_s']:4.2f}  max err {max(i['max_err'] for i in r['impls']):.3g}",
                flush=True,
            )
    write_result({"benchmark": "skinny_linear", "env": env_info(), "results": results}, args.out)


if __name__ == "__main__":
    main()
