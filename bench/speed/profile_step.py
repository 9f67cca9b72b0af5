"""Benchmark: where one default GRPO step spends its time.

Runs the real trainer in this process (one rank, no torchrun) on random weights of a real
shape (``bench/shapes/<name>``), takes warm-up steps (compilation, CUDA graph capture),
then one step under ``torch.profiler``. Kernel time is grouped by phase (generate, update)
and by category:

    attention       attention kernels (SDPA/flash/varlen, the engine's decode attention)
    matmul          GEMMs of the decoder (projections, MLP)
    norm            RMSNorm, forward and backward
    rope_attn_glue  non-GEMM work inside attention modules (rotary, reshapes, casts)
    activation      non-GEMM work inside MLPs (SiLU, gate*up)
    elementwise     other pointwise/reduction kernels (residual adds, casts, ...)
    logp_head       the fused log-prob head (its GEMMs included)
    optimizer       gradient clipping, AdamW, zeroing
    memcpy          copies and memsets
    other

A kernel's category comes from the scope that launched it: module scopes are recorded
around RMSNorm / attention / MLP forwards; a backward kernel takes the scope of the
forward op whose autograd node launched it (matched by sequence number). GEMM and
attention kernels are recognised by name wherever they run. The GPU's idle share of a
phase is the part of its wall time no kernel covers: launch gaps and host work.

On a CPU (the tiny smoke test) the same table is built from the CPU time of the leaf ops.

    python -m bench.speed.profile_step --shapes qwen2.5-1.5b qwen2.5-3b --out bench/results/profile

writes ``<out>/profile_<shape>[_<tag>].json`` and ``.md``, and ``<out>/summary.md``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from bench.speed.profile_attribution import (
    ATTENTION_NAMES,
    CATEGORIES,
    FUSED_NAMES,
    MATMUL_NAMES,
    MEMCPY_NAMES,
    MODULE_SCOPES,
    PHASE_PREFIX,
    PHASES,
    SCOPE_PREFIX,
    Attribution,
    Item,
    _ancestors,
    _busy_us,
    _host_ranges,
    _is_range,
    summarize,
    work_items,
)
from bench.speed.profile_run import (
    SHAPES_DIR,
    _last_metrics,
    _ranged,
    _sync,
    build_trainer,
    instrument,
    profile_one,
    run_overrides,
)
from bench.speed.profile_tables import markdown, write

__all__ = [  # every name of the single-file module, for ``from bench.speed.profile_step import X``
    "ATTENTION_NAMES", "Attribution", "CATEGORIES", "FUSED_NAMES", "Item", "MATMUL_NAMES",
    "MEMCPY_NAMES", "MODULE_SCOPES", "PHASES", "PHASE_PREFIX", "SCOPE_PREFIX", "SHAPES_DIR",
    "_ancestors", "_busy_us", "_host_ranges", "_is_range", "_last_metrics", "_passthrough",
    "_ranged", "_sync", "build_trainer", "instrument", "main", "markdown", "parse",
    "profile_one", "run_overrides", "summarize", "work_items", "write",
]  # fmt: skip


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    shapes = sorted(d.name for d in SHAPES_DIR.iterdir() if (d / "config.json").is_file())
    p.add_argument("--shapes", nargs="+", choices=shapes, default=["qwen2.5-1.5b", "qwen2.5-3b"])
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], help="default: bf16 on GPU")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-new", type=int, default=256)
    p.add_argument("--warmup", type=int, default=2, help="steps before the profiled one")
    p.add_argument("--override", nargs="*", default=[], help="extra config key=value")
    p.add_argument("--tag", default="", help="suffix of the output files (e.g. packed)")
    p.add_argument("--trace", action="store_true", help="also write a chrome trace")
    p.add_argument("--top", type=int, default=15, help="kernels listed per phase")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=Path("bench/results/profile"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.child:  # one shape in this process
        (shape,) = args.shapes
        md = write(shape, args, profile_one(shape, args))
        print(md.read_text(), flush=True)
        return
    # One process per shape: each starts with an empty GPU and its own compile caches.
    tables = []
    for shape in args.shapes:
        cmd = [sys.executable, "-m", "bench.speed.profile_step", "--child", "--shapes", shape]
        cmd += _passthrough(args)
        proc = subprocess.run(cmd)
        stem = f"profile_{shape}{'_' + args.tag if args.tag else ''}.md"
        if proc.returncode == 0:
            tables.append((args.out / stem).read_text())
        else:
            tables.append(f"### {shape}: failed (exit {proc.returncode})\n")
    summary = args.out / f"summary{'_' + args.tag if args.tag else ''}.md"
    summary.write_text("\n".join(tables))
    print(f"wrote {summary}")


def _passthrough(args: argparse.Namespace) -> list[str]:
    out = [f"--prompts={args.prompts}", f"--G={args.G}", f"--max-new={args.max_new}",
           f"--warmup={args.warmup}", f"--out={args.out}", f"--tag={args.tag}",
           f"--top={args.top}"]  # fmt: skip
    out += [f"--precision={args.precision}"] if args.precision else []
    out += ["--trace"] if args.trace else []
    return out + (["--override", *args.override] if args.override else [])


if __name__ == "__main__":
    main()
