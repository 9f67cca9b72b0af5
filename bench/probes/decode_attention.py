"""Benchmark: the attention of one decode step over the KV cache, implementation by
implementation, on the GPU.

A decode step's attention reads each row's cached K and V once: at batch B, span S (the
filled slots, rounded up to the engine's span bucket), KV heads h_kv and head size d it
moves ``2 * B * h_kv * S * d * 2`` bytes (bf16) and does almost no arithmetic, so its
roofline is the memory bandwidth. Each implementation gets the engine's own inputs: the
query [B, heads, d], a layer of the static cache [B, h_kv, capacity, d] viewed to the
span, and the per-row left padding and current slot. Timed as the engine runs it: one
call per layer (each on its own layer of the cache) captured in a CUDA graph and replayed.

- ``bmm``: the engine's formulation before this benchmark: the query heads of each KV
  head's group as the rows of one batched matmul for the scores and one for the values,
  softmax in fp32 between them (compiled, as the engine compiles it);
- ``sdpa``: the same grouped query folded into SDPA's query-length axis (``[B, h_kv,
  group, d]``: the group's heads play the part of query positions, which all may see the
  same keys), with an additive mask for the padding and the unwritten slots; PyTorch
  picks the kernel (``sdpa-efficient`` and ``sdpa-cudnn`` force one);
- ``flex``: FlexAttention with the mask as a score modification over the GQA layout
  (``enable_gqa``), whose decoding kernel splits the keys across thread blocks
  (flash-decoding); ``flex-fold``: the folded layout;
- ``triton``: the engine's own kernel (``grpo_hpc.train.rollout.native.attention``): a program per
  (row, KV head) streams the keys and values once with an online softmax.

    python -m bench.probes.decode_attention --shapes qwen2.5-1.5b qwen2.5-3b --batch 64 256 \
        --out bench/results/archive/h100_decode_attention.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.common import env_info, write_result

SHAPES_DIR = Path(__file__).resolve().parents[1] / "shapes"
Attn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]


def bmm(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lp: torch.Tensor, pos: torch.Tensor):
    b, kv, span, d = k.shape
    slots = torch.arange(span, device=q.device)
    ok = (slots >= lp.unsqueeze(1)) & (slots <= pos)
    bias = torch.zeros(ok.shape, device=q.device).masked_fill(~ok, float("-inf"))
    qg = q.view(b, kv, q.shape[1] // kv, d)
    scores = torch.matmul(qg, k.transpose(-1, -2)).float() * d**-0.5 + bias.view(b, 1, 1, span)
    return torch.matmul(torch.softmax(scores, dim=-1).to(q.dtype), v).reshape(b, -1)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lp: torch.Tensor, pos: torch.Tensor):
    b, kv, span, d = k.shape
    slots = torch.arange(span, device=q.device)
    ok = (slots >= lp.unsqueeze(1)) & (slots <= pos)
    qg = q.view(b, kv, q.shape[1] // kv, d)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=ok.view(b, 1, 1, span))
    return out.reshape(b, -1)


def sdpa_bias(q, k, v, lp, pos):  # noqa: ANN001, ANN201
    b, kv, span, d = k.shape
    slots = torch.arange(span, device=q.device)
    ok = (slots >= lp.unsqueeze(1)) & (slots <= pos)
    bias = torch.zeros(ok.shape, dtype=q.dtype, device=q.device).masked_fill(~ok, float("-inf"))
    qg = q.view(b, kv, q.shape[1] // kv, d)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=bias.view(b, 1, 1, span))
    return out.reshape(b, -1)


def _flex(fold: bool) -> Attn:
    from torch.nn.attention.flex_attention import flex_attention

    def attn(q, k, v, lp, pos):  # noqa: ANN001, ANN202
        b, kv, span, d = k.shape

        def mod(score, bi, h, qi, ki):  # noqa: ANN001, ANN202
            ok = (ki >= lp[bi]) & (ki <= pos[0])
            return torch.where(ok, score, -float("inf"))

        if fold:
            out = flex_attention(q.view(b, kv, q.shape[1] // kv, d), k, v, score_mod=mod)
        else:
            out = flex_attention(q.unsqueeze(2), k, v, score_mod=mod, enable_gqa=True)
        return out.reshape(b, -1)

    return attn


def _triton(q, k, v, lp, pos):  # noqa: ANN001, ANN202
    from grpo_hpc.train.rollout.native.attention import _fused_op

    return _fused_op(q, k, v, lp, pos)


def variants() -> dict[str, Attn]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def forced(backend):  # noqa: ANN001, ANN202
        def attn(q, k, v, lp, pos):  # noqa: ANN001, ANN202
            with sdpa_kernel([backend]):
                return sdpa_bias(q, k, v, lp, pos)

        return attn

    comp = torch.compile
    return {
        "bmm": comp(bmm, dynamic=False, fullgraph=True),
        "sdpa": comp(sdpa, dynamic=False, fullgraph=True),
        "sdpa-bias": comp(sdpa_bias, dynamic=False, fullgraph=True),
        "sdpa-efficient": forced(SDPBackend.EFFICIENT_ATTENTION),
        "sdpa-cudnn": forced(SDPBackend.CUDNN_ATTENTION),
        "flex": comp(_flex(False), dynamic=False, fullgraph=True),
        "flex-fold": comp(_flex(True), dynamic=False, fullgraph=True),
        "triton": _triton,
    }


def reference(q, k, v, lp, pos) -> torch.Tensor:  # noqa: ANN001
    return bmm(q.float(), k.float(), v.float(), lp, pos)


def time_graph(fn: Attn, qs, ks, vs, lp, pos, reps: int) -> float:  # noqa: ANN001
    """Seconds per call: one call per layer captured in a CUDA graph, replayed."""
    for _ in range(2):
        for q, k, v in zip(qs, ks, vs, strict=True):
            fn(q, k, v, lp, pos)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for q, k, v in zip(qs, ks, vs, strict=True):
            fn(q, k, v, lp, pos)
    g.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps / len(qs)


def run_shape(shape: str, batch: int, span: int, prompt: int, names: list[str], reps: int):
    cfg = json.loads((SHAPES_DIR / shape / "config.json").read_text())
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg["hidden_size"] // heads
    layers = cfg["num_hidden_layers"]
    dev, dt = torch.device("cuda"), torch.bfloat16
    cap = span + 128  # a static cache is longer than the span the step reads
    cache_k = torch.randn(layers, batch, kv, cap, d, device=dev, dtype=dt)
    cache_v = torch.randn(layers, batch, kv, cap, d, device=dev, dtype=dt)
    qs = [torch.randn(batch, heads, d, device=dev, dtype=dt) for _ in range(layers)]
    ks = [cache_k[i, :, :, :span] for i in range(layers)]
    vs = [cache_v[i, :, :, :span] for i in range(layers)]
    gen = torch.Generator().manual_seed(0)
    lp = torch.randint(0, prompt // 3, (batch,), generator=gen).to(dev)  # left padding
    pos = torch.tensor([span - 7], device=dev)  # the slot being written, inside the bucket
    ref = reference(qs[0], ks[0], vs[0], lp, pos)
    kv_bytes = 2 * batch * kv * span * d * 2
    rows = []
    for name in names:
        fn = variants()[name]
        try:
            err = (fn(qs[0], ks[0], vs[0], lp, pos).float() - ref).abs().max().item()
            s = time_graph(fn, qs, ks, vs, lp, pos, reps)
        except Exception as e:  # noqa: BLE001 - a kernel that cannot run here is a result
            rows.append({"impl": name, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            print(f"{shape} B={batch} S={span} {name}: {rows[-1]['error']}", flush=True)
            continue
        r = {
            "impl": name,
            "us_per_layer": s * 1e6,
            "us_per_step": s * 1e6 * layers,
            "kv_gb_per_s": kv_bytes / s / 1e9,
            "max_abs_err_vs_fp32": err,
        }
        rows.append(r)
        print(f"{shape} B={batch} S={span} " + json.dumps(r), flush=True)
    return {"shape": shape, "batch": batch, "span": span, "layers": layers, "impls": rows}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shapes", nargs="+", default=["qwen2.5-1.5b", "qwen2.5-3b"])
    p.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    p.add_argument("--spans", type=int, nargs="+", default=[320, 576])
    p.add_argument("--prompt", type=int, default=300, help="most left padding: a third of it")
    p.add_argument("--impls", nargs="+", default=list(variants()), choices=list(variants()))
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("decode_attention.py: needs a CUDA GPU")
    runs = [
        run_shape(shape, b, s, args.prompt, args.impls, args.reps)
        for shape in args.shapes
        for b in args.batch
        for s in args.spans
    ]
    config = dict(vars(args)) | {"out": str(args.out) if args.out else None}
    result = {"benchmark": "decode_attention", "config": config, "runs": runs}
    result["env"] = env_info()
    write_result(result, args.out)


if __name__ == "__main__":
    main()
