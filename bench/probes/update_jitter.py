"""Is an unsteady update the host's core or the update's own work? The same update, over
and over in one process, each one timed with a fixed piece of pure-Python work on the same
thread just before it.

Why it asks: a 135M model's update is bound by the host (the GPU was busy 75 of 380 ms in a
profiled real step), and the same ~27k tokens took 0.15-0.36 s in real 2-GPU runs. On one
H100, ``bench.speed.update_speed`` repeating one fixed update gave 0.087-0.189 s. Here the work
cannot change between repetitions (same batch, same shapes, garbage collection off, as the
trainer has it), so what varies is how fast the host ran it. The fixed work (``--work``
iterations of a Python loop, a few milliseconds) samples the speed of the core this thread
is on right then; if slow updates come with slow fixed work, the host's core speed varies
(a shared VM host, clocks), not the trainer.

    python -m bench.probes.update_jitter --shape smollm2-135m --reps 40 --out jitter.json

One JSON file: per repetition the update's wall seconds, its host CPU seconds by thread
(:func:`grpo_hpc.train.measure.profiling.thread_clock`), the seconds its threads waited for a core,
and the fixed work's milliseconds before and after; with the correlation of update time
and fixed-work time. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from bench.common import SHAPES, build_model, env_info, write_result
from bench.probes.host_clock import work
from bench.speed.update_speed import fake_batch, run_update
from grpo_hpc.config.schema import AlgoConfig
from grpo_hpc.train.algo import logp_head, update
from grpo_hpc.train.algo.packing import use_packed_attention
from grpo_hpc.train.measure.profiling import thread_clock
from grpo_hpc.train.setup.models import compile_layers, decoder_layers, load_model_and_tokenizer


def load_compiled(path: Path, graphs: bool) -> torch.nn.Module:
    """The model at ``path`` on the GPU, packed attention on, in training mode; its layers
    compiled as the trainer does (``graphs`` False) or each in Inductor's
    ``reduce-overhead`` mode at fixed shapes (CUDA graphs)."""
    model, _ = load_model_and_tokenizer(path, "sdpa", torch.device("cuda"))
    use_packed_attention(model)
    if graphs:
        for layer in decoder_layers(model):
            layer.compile(mode="reduce-overhead", dynamic=False)
    else:
        compile_layers(model)
    return model.train()


FAST_CORE_MS = 8.0
"""A fixed-work sample under this many milliseconds caught the core at its fast speed
(the samples of the H100 VM clustered at 6 and 11-12 ms)."""


def summary(reps: list[dict]) -> dict:
    """The figures of a run (pure): the update's min, median, max, max/min and p90/p10;
    the fixed work's min, median, max over every sample; the update's median after a
    fast-core sample (the one before it, under :data:`FAST_CORE_MS`) and after a slow
    one, with their counts; the correlation of the update with its two samples' mean."""
    ups = sorted(r["update_s"] for r in reps)
    works = [w for r in reps for w in (r["work_before_ms"], r["work_after_ms"])]
    fast = [r["update_s"] for r in reps if r["work_before_ms"] < FAST_CORE_MS]
    slow = [r["update_s"] for r in reps if r["work_before_ms"] >= FAST_CORE_MS]
    n = len(ups)
    return {
        "update_ms": (ups[0] * 1e3, statistics.median(ups) * 1e3, ups[-1] * 1e3),
        "max_over_min": ups[-1] / ups[0],
        "p90_over_p10": ups[int(0.9 * n)] / ups[int(0.1 * n)],
        "work_ms": (min(works), statistics.median(works), max(works)),
        "after_fast_ms": (statistics.median(fast) * 1e3 if fast else None, len(fast)),
        "after_slow_ms": (statistics.median(slow) * 1e3 if slow else None, len(slow)),
        "r": statistics.correlation(
            [r["update_s"] for r in reps],
            [(r["work_before_ms"] + r["work_after_ms"]) / 2 for r in reps],
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--micro-tokens", type=int, default=18432)
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--work", type=int, default=100_000, help="fixed-work loop iterations")
    p.add_argument(
        "--graphs",
        action="store_true",
        help="compile each layer in Inductor's reduce-overhead mode (CUDA graphs, this "
        "probe's fixed shapes) instead of the trainer's dynamic-shape compilation",
    )
    p.add_argument("--out", type=Path)
    p.add_argument("--from", dest="src", type=Path, help="print the summary of a result file")
    args = p.parse_args()
    if args.src:
        print(json.dumps(summary(json.loads(args.src.read_text())["reps"]), indent=1))
        return
    with tempfile.TemporaryDirectory() as d:
        build_model(Path(d) / "m", args.shape)
        model = load_compiled(Path(d) / "m", args.graphs)
    logp_head.compile_chunks()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    batch = fake_batch(args.rows, 30, 256, model.config.vocab_size, "cuda", ragged=True)
    adv = torch.randn(args.rows)
    algo = AlgoConfig(micro_batch_size=args.rows, micro_batch_tokens=args.micro_tokens)
    mbs = update.split(batch, list(range(args.rows)), adv, args.rows, args.micro_tokens, True)

    def one() -> None:
        if args.graphs:  # a new iteration: the graphs' outputs of the last one are dead
            torch.compiler.cudagraph_mark_step_begin()
        run_update(model, opt, mbs, algo, 256)

    for _ in range(3):  # compile, autotune, allocator (and capture)
        one()
    gc.collect()
    gc.disable()  # as the trainer runs (grpo_hpc/train/supervision/gc_schedule.py)
    reps = []
    for i in range(args.reps):
        before = work(args.work)
        with thread_clock() as host:
            one()
        after = work(args.work)
        row = {"rep": i, "update_s": host.wall_s, "work_before_ms": before}
        row |= {"work_after_ms": after, "cpu_s": host.by_group, "waited_s": host.waited_s}
        reps.append(row)
        print(
            f"{i:3d} update {host.wall_s * 1e3:7.1f} ms  work {before:6.2f} {after:6.2f} ms  "
            + " ".join(f"{g} {v * 1e3:5.1f}" for g, v in host.by_group.items()),
            flush=True,
        )
        time.sleep(0.05)  # a gap, as a real step has its rollout between updates
    ups = [r["update_s"] for r in reps]
    works = [(r["work_before_ms"] + r["work_after_ms"]) / 2 for r in reps]
    result = {
        "benchmark": "update_jitter",
        "config": vars(args) | {"out": str(args.out) if args.out else None},
        "micro_batches": len(mbs),
        "update_s": {"min": min(ups), "median": statistics.median(ups), "max": max(ups)},
        "work_ms": {"min": min(works), "median": statistics.median(works), "max": max(works)},
        "correlation_update_work": statistics.correlation(ups, works),
        "summary": summary(reps),
        "inductor_counters": dict(counters["inductor"]),  # cudagraph_skips among them
        "reps": reps,
        "env": env_info(),
    }
    print({k: v for k, v in result.items() if k not in ("reps", "env")})
    write_result(result, args.out)


if __name__ == "__main__":
    main()
