"""Do decoder layers replayed as CUDA graphs give the same gradients as the trainer's
compiled layers when an update accumulates over several micro-batches?

One way was left to take a small model's update off the host: each layer compiled in
Inductor's ``reduce-overhead`` mode (cudagraph trees), 1.6x faster at one micro-batch
(``update_jitter --graphs``). A captured backward writes its outputs into memory the next
replay reuses, so gradients accumulated over two or more micro-batches could be
overwritten. This runs the same micro-batches through two copies of one model, the
trainer's compilation and the graphed one, for a few iterations (the graphed copy warms
up, captures, then replays), and compares the accumulated gradients.

    python -m bench.probes.graph_grads --micro-tokens 9216 --out graph_grads.json

Per iteration: the relative difference of all gradients (the norm of the difference over
the norm of the reference), the largest per parameter, and each copy's update time. The
trainer's copy against itself (a second pass over the same batch) gives the noise floor.
Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from bench.common import SHAPES, build_model, env_info, write_result
from bench.probes.update_jitter import load_compiled
from bench.speed.update_speed import fake_batch
from grpo_hpc.config.schema import AlgoConfig
from grpo_hpc.train.algo import logp_head, update
from grpo_hpc.train.algo.optimization import autocast_factory
from grpo_hpc.train.distributed.dist import DistInfo


def grads_of(model: torch.nn.Module, mbs: list, algo: AlgoConfig, graphs: bool) -> tuple:
    """One update's accumulated gradients (fp32 copies, by name) and its seconds."""
    model.zero_grad(set_to_none=True)
    if graphs:
        torch.compiler.cudagraph_mark_step_begin()
    torch.cuda.synchronize()
    t = time.perf_counter()
    autocast = autocast_factory("cuda", torch.bfloat16, cache=False)
    info = DistInfo(device=torch.device("cuda"))
    update.accumulate(model, mbs, algo, info, 256, None, autocast)
    torch.cuda.synchronize()
    took = time.perf_counter() - t
    grads = {
        n: p.grad.detach().float().clone()
        for n, p in model.named_parameters()
        if p.grad is not None
    }
    return grads, took


def compare(ref: dict, got: dict) -> dict:
    """Relative difference of all gradients together, and the largest of one parameter
    (pure); a gradient missing from ``got`` counts as zeros."""
    got = {n: got.get(n, torch.zeros_like(g)) for n, g in ref.items()}
    num = sum(float((ref[n] - got[n]).pow(2).sum()) for n in ref) ** 0.5
    den = sum(float(ref[n].pow(2).sum()) for n in ref) ** 0.5
    worst = max((float((ref[n] - got[n]).norm() / ref[n].norm().clamp_min(1e-30)), n) for n in ref)
    return {"relative": num / den, "worst_param": worst[1], "worst_relative": worst[0]}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--micro-tokens", type=int, default=9216)
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        build_model(Path(d) / "m", args.shape)
        plain, graphed = load_compiled(Path(d) / "m", False), load_compiled(Path(d) / "m", True)
    logp_head.compile_chunks()
    batch = fake_batch(args.rows, 30, 256, plain.config.vocab_size, "cuda", ragged=True)
    adv = torch.randn(args.rows)
    algo = AlgoConfig(micro_batch_size=args.rows, micro_batch_tokens=args.micro_tokens)
    mbs = update.split(batch, list(range(args.rows)), adv, args.rows, args.micro_tokens, True)
    ref, _ = grads_of(plain, mbs, algo, False)  # compiles
    iters = []
    for i in range(args.iters):
        again, t_plain = grads_of(plain, mbs, algo, False)
        got, t_graphs = grads_of(graphed, mbs, algo, True)
        row = {"iter": i, "plain_s": t_plain, "graphs_s": t_graphs}
        row |= {"noise": compare(ref, again)["relative"], **compare(ref, got)}
        iters.append(row)
        print(row, flush=True)
    result = {
        "benchmark": "graph_grads",
        "config": vars(args) | {"out": str(args.out) if args.out else None},
        "micro_batches": len(mbs),
        "iters": iters,
        "env": env_info(),
    }
    write_result(result, args.out)


if __name__ == "__main__":
    main()
