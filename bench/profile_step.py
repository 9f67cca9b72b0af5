"""Benchmark: where one default GRPO step spends its time (issue 24, point 1).

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

    python -m bench.profile_step --shapes qwen2.5-1.5b qwen2.5-3b --out bench/results/profile

writes ``<out>/profile_<shape>[_<tag>].json`` and ``.md``, and ``<out>/summary.md``.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import env_info, untiny_overrides

SHAPES_DIR = Path(__file__).resolve().parent / "shapes"
PHASES = ("generate", "update")
CATEGORIES = (
    "attention",
    "matmul",
    "norm",
    "rope_attn_glue",
    "activation",
    "elementwise",
    "logp_head",
    "optimizer",
    "memcpy",
    "other",
)
PHASE_PREFIX, SCOPE_PREFIX = "phase:", "scope:"
# Kernel (or CPU op) names, lower-cased substrings; attention is tested before matmul
# (flash kernels are CUTLASS-built).
ATTENTION_NAMES = ("flash", "fmha", "attention", "attn", "varlen", "sdpa", "_decode_kernel")
# (_decode_kernel: the native engine's Triton decode attention,
# grpo_hpc/train/rollout/native/attention.py)
MATMUL_NAMES = ("gemm", "cutlass", "nvjet", "xmma", "cublas", "aten::mm", "aten::addmm",
                "aten::bmm", "aten::baddbmm", "matmul", "triton_tem")  # fmt: skip
# Kernels that torch.compile fused (the engine's decode layers) carry their ops in the name.
FUSED_NAMES = (("rsqrt", "norm"), ("silu", "activation"), ("cos", "rope_attn_glue"),
               ("sin", "rope_attn_glue"))  # fmt: skip
MEMCPY_NAMES = ("memcpy", "memset")
MODULE_SCOPES = {"RMSNorm": "norm", "Attention": "attn", "MLP": "mlp"}
"""Module class-name suffix -> scope recorded around its forward."""


def run_overrides(shape: str, args: argparse.Namespace) -> list[str]:
    """The config grpo_step.py / trl_baseline.py run (project defaults for memory settings,
    not the ``tiny`` preset's), on random weights of ``shape``, plus ``--override``."""
    return [
        *untiny_overrides(),
        f"model.name_or_path=random:{SHAPES_DIR / shape}",
        f"rollout.prompts_per_step={args.prompts}",
        f"rollout.num_generations={args.G}",
        f"rollout.max_new_tokens={args.max_new}",
        f"training.max_steps={args.warmup + 1}",
        "training.save_every_steps=0",
        "training.save_final=false",
        "data.num_eval=0",
        "wandb.mode=disabled",
        "reward.correctness=1.0",
        "reward.custom={grpo_hpc.train.rewards.toy:digit_fraction: 1.0}",
        *args.override,
    ]


def build_trainer(work: Path, shape: str, args: argparse.Namespace) -> Any:
    """A set-up Trainer of the run ``create_run`` writes (as grpo-submit would)."""
    import torch

    from grpo_hpc.config.load import load_resolved
    from grpo_hpc.config.profiles import profile_from_dict
    from grpo_hpc.core.paths import RunPaths
    from grpo_hpc.submit.job import create_run
    from grpo_hpc.train import dist
    from grpo_hpc.train.trainer import Trainer

    cuda = torch.cuda.is_available()
    precision = args.precision or ("bf16" if cuda else "fp32")
    profile = profile_from_dict(
        {"executor": "local", "precision": precision, "attn_implementation": "sdpa"},
        name="profile",
    )
    paths = RunPaths(work / "run")
    overrides = run_overrides(shape, args)
    if not cuda:  # the CPU smoke test: one thread, no recompute (as configs/tiny.yaml)
        overrides += ["training.num_threads=1", "model.gradient_checkpointing=false"]
    create_run(paths, profile, "tiny", overrides, force=True)
    cfg = load_resolved(paths.config)
    trainer = Trainer(cfg, paths, dist.init(cfg.dist))
    trainer.setup()
    return trainer


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _ranged(fn: Callable, name: str, sync: bool) -> Callable:
    """``fn`` inside a profiler range ``name``; with ``sync``, the device is idle at both
    ends, so the range's wall time holds exactly the phase's kernels."""
    from torch.profiler import record_function

    @functools.wraps(fn)
    def wrapper(*a: Any, **k: Any) -> Any:
        if sync:
            _sync()
        with record_function(name):
            out = fn(*a, **k)
            if sync:
                _sync()
        return out

    return wrapper


def instrument(trainer: Any) -> None:
    """Phase ranges around generation and the update; scopes around the optimizer step and,
    in an eager model, the forwards of norms, attention modules and MLPs (instance
    attributes: the classes and other models are untouched). Compiled decoder layers
    (``dist.compile``) get no module scopes: a patched ``forward`` fails the compiled
    layer's guards, so the profiled step would recompile and run another graph than the
    unprofiled one (it did, 2026-11-25), and a compiled layer's fused kernels cross the
    norm / attention / MLP boundaries anyway; its kernels are categorised by name."""
    from grpo_hpc.train import dist

    engine, opt = trainer.engine, trainer.opt
    engine.generate = _ranged(engine.generate, PHASE_PREFIX + "generate", sync=True)
    opt.update = _ranged(opt.update, PHASE_PREFIX + "update", sync=True)
    opt.optimizer_step = _ranged(opt.optimizer_step, SCOPE_PREFIX + "optimizer", sync=False)
    if trainer.cfg.dist.compile:
        return
    for module in dist.unwrap(trainer.model).modules():
        cls = type(module).__name__
        scope = next((s for suffix, s in MODULE_SCOPES.items() if cls.endswith(suffix)), None)
        if scope:
            module.forward = _ranged(module.forward, SCOPE_PREFIX + scope, sync=False)


@dataclass
class Item:
    """One unit of measured work: a GPU kernel, or a CPU leaf op's self time."""

    name: str
    start_us: float
    dur_us: float
    launcher: Any
    """The CPU event that launched the kernel (the op itself on a CPU)."""


def _ancestors(ev: Any) -> Iterator[Any]:
    while ev is not None:
        yield ev
        ev = ev.cpu_parent


@dataclass
class Attribution:
    """Phase and category of profiler events (memoised over the event tree)."""

    fwd_scope: dict[int, str] = field(default_factory=dict)
    """Autograd sequence number -> scope of the forward op that created the node."""

    def learn_forward(self, events: list[Any]) -> None:
        for ev in events:
            seq = getattr(ev, "sequence_nr", -1)
            if seq is None or seq < 0 or ev.name.startswith("autograd::"):
                continue
            scope = self._scope(ev)
            if scope:
                self.fwd_scope.setdefault(seq, scope)

    @staticmethod
    def _scope(ev: Any) -> str | None:
        for a in _ancestors(ev):
            if a.name.startswith(SCOPE_PREFIX):
                return a.name[len(SCOPE_PREFIX) :]
            if "_LinearLogp" in a.name:
                return "logp_head"
            if a.name.startswith("Optimizer.") or "clip_grad" in a.name:
                return "optimizer"
        return None

    windows: list[tuple[float, float, str]] = field(default_factory=list)
    """(start, end, phase) of the phase ranges (the device is idle at both ends)."""

    def learn_phases(self, events: list[Any]) -> None:
        for e in _host_ranges(events, PHASE_PREFIX):
            tr = e.time_range
            self.windows.append((tr.start, tr.end, e.name[len(PHASE_PREFIX) :]))

    def phase(self, start_us: float) -> str:
        """By time, not by launcher: kernels replayed from a CUDA graph have no launching
        op, and every kernel of a phase runs inside its synchronised range."""
        return next((p for s, e, p in self.windows if s <= start_us <= e), "outside")

    def scope(self, launcher: Any) -> str | None:
        """The launcher's own scope, else (backward) that of its autograd node's forward."""
        own = self._scope(launcher)
        if own in ("logp_head", "optimizer"):
            return own
        for a in _ancestors(launcher):
            if a.name.startswith("autograd::engine::evaluate_function"):
                seq = getattr(a, "sequence_nr", -1)
                node = self.fwd_scope.get(seq) if seq is not None else None
                return node or own
        return own

    def category(self, item: Item) -> str:
        name = item.name.lower()
        scope = self.scope(item.launcher) if item.launcher is not None else None
        if scope in ("logp_head", "optimizer"):
            return scope
        if any(s in name for s in MEMCPY_NAMES):
            return "memcpy"
        if any(s in name for s in ATTENTION_NAMES):
            return "attention"
        if any(s in name for s in MATMUL_NAMES):
            return "matmul"
        if scope == "norm":
            return "norm"
        if scope == "mlp":
            return "activation"
        if scope == "attn":
            return "rope_attn_glue"
        fused = next((c for s, c in FUSED_NAMES if "triton" in name and s in name), None)
        if fused:
            return fused
        if any(s in name for s in ("elementwise", "reduce", "aten::", "triton")):
            return "elementwise"
        return "other"


def work_items(events: list[Any], on_gpu: bool) -> list[Item]:
    """GPU kernels with their launching CPU op, or (CPU) leaf ops' self time."""
    from torch.autograd import DeviceType

    if not on_gpu:
        return [
            Item(e.name, e.time_range.start, e.self_cpu_time_total, e)
            for e in events
            if e.device_type == DeviceType.CPU
            and e.name.startswith("aten::")
            and e.self_cpu_time_total > 0
        ]
    # Ops (not runtime calls such as cudaLaunchKernel) are the events without a link of
    # their own; a kernel's link names the op that launched it.
    by_corr = {
        e.id: e
        for e in events
        if e.device_type == DeviceType.CPU and not getattr(e, "linked_correlation_id", 0)
    }
    items = []
    for e in events:
        # The profiler mirrors each record_function range on the device as a user
        # annotation spanning its kernels: a range, not work of its own.
        if e.device_type != DeviceType.CUDA or _is_range(e.name):
            continue
        launcher = by_corr.get(getattr(e, "linked_correlation_id", 0))
        items.append(Item(e.name, e.time_range.start, e.time_range.elapsed_us(), launcher))
    return items


def _is_range(name: str) -> bool:
    return name.startswith((PHASE_PREFIX, SCOPE_PREFIX))


def _host_ranges(events: list[Any], prefix: str) -> Iterator[Any]:
    """The host-side events of the ``prefix`` ranges (not their device-side mirrors)."""
    from torch.autograd import DeviceType

    return (e for e in events if e.device_type == DeviceType.CPU and e.name.startswith(prefix))


def _busy_us(spans: list[tuple[float, float]]) -> float:
    """Length of the union of intervals (kernels of several streams may overlap)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def summarize(events: list[Any], on_gpu: bool, top_n: int = 15) -> dict:
    """Per phase: wall time, kernel time by category, busy/idle share, top kernels."""
    attr = Attribution()
    attr.learn_forward(events)
    attr.learn_phases(events)
    walls: dict[str, float] = defaultdict(float)
    for e in _host_ranges(events, PHASE_PREFIX):
        walls[e.name[len(PHASE_PREFIX) :]] += e.time_range.elapsed_us()
    cats: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(CATEGORIES, 0.0))
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    top: dict[str, dict[tuple[str, str], list[float]]] = defaultdict(dict)
    for it in work_items(events, on_gpu):
        phase = attr.phase(it.start_us)
        cat = attr.category(it)
        cats[phase][cat] += it.dur_us
        spans[phase].append((it.start_us, it.start_us + it.dur_us))
        slot = top[phase].setdefault((it.name[:90], cat), [0.0, 0])
        slot[0] += it.dur_us
        slot[1] += 1
    out = {}
    for phase in [*PHASES, "outside"]:
        if phase not in cats and phase not in walls:
            continue
        kernel_us = sum(cats[phase].values())
        busy = _busy_us(spans[phase]) if on_gpu else kernel_us
        wall = walls.get(phase, 0.0)
        ranked = sorted(top[phase].items(), key=lambda kv: -kv[1][0])[:top_n]
        out[phase] = {
            "wall_ms": wall / 1e3,
            "kernel_ms": kernel_us / 1e3,
            "busy_ms": busy / 1e3,
            "idle_share": (1 - busy / wall) if wall else None,
            "by_category_ms": {k: v / 1e3 for k, v in cats[phase].items()},
            "top": [
                {"name": n, "category": c, "ms": ms / 1e3, "calls": int(k)}
                for (n, c), (ms, k) in ranked
            ],
        }
    return out


def markdown(shape: str, tag: str, result: dict) -> str:
    """The short table for bench/results: ms and share of each phase's kernel time."""
    phases = [p for p in PHASES if p in result["phases"]]
    unit = "kernel" if result["on_gpu"] else "CPU op"
    head = f"### {shape}{' (' + tag + ')' if tag else ''}: one step, {result['env']['device']}"
    lines = [head, "", "| category | " + " | ".join(f"{p} ms (%)" for p in phases) + " |"]
    lines.append("|---|" + "---|" * len(phases))
    for cat in CATEGORIES:
        cells = []
        for p in phases:
            ph = result["phases"][p]
            ms = ph["by_category_ms"][cat]
            share = 100 * ms / ph["kernel_ms"] if ph["kernel_ms"] else 0.0
            cells.append(f"{ms:.1f} ({share:.0f})")
        lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    for key, label in (("kernel_ms", f"{unit} time"), ("wall_ms", "wall time")):
        cells = [f"{result['phases'][p][key]:.1f}" for p in phases]
        lines.append(f"| **{label}** | " + " | ".join(cells) + " |")
    plain = result.get("unprofiled_metrics", {})
    cells = [f"{1e3 * plain[f'time/{key}']:.1f}" if f"time/{key}" in plain else "-"
             for key in ("generate" if p == "generate" else "train" for p in phases)]  # fmt: skip
    lines.append("| **wall time, unprofiled step** | " + " | ".join(cells) + " |")
    idle = [result["phases"][p]["idle_share"] for p in phases]
    cells = [f"{100 * x:.0f} %" if x is not None else "-" for x in idle]
    lines.append(f"| **{'GPU idle' if result['on_gpu'] else 'host overhead'}** | "
                 + " | ".join(cells) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def profile_one(shape: str, args: argparse.Namespace) -> dict:
    """Warm-up steps, then one profiled step of the real trainer."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    on_gpu = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as d:
        trainer = build_trainer(Path(d), shape, args)
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            trainer.train_step()
        warm_s = time.perf_counter() - t0
        # The profiler slows the host (every op is recorded): the last warm-up step's
        # times are the step as it runs unobserved.
        unprofiled = _last_metrics(trainer.paths.metrics)
        instrument(trainer)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        _sync()
        t0 = time.perf_counter()
        with profile(activities=acts) as prof:
            trainer.train_step()
            _sync()
        step_s = time.perf_counter() - t0
        trace = args.out / f"trace_{shape}{'_' + args.tag if args.tag else ''}.json"
        if args.trace:
            prof.export_chrome_trace(str(trace))
        events = list(prof.events())
        result = {
            "benchmark": "profile_step",
            "shape": shape,
            "tag": args.tag,
            "overrides": args.override,
            "on_gpu": on_gpu,
            "warmup_steps": args.warmup,
            "warmup_s": warm_s,
            "profiled_step_s": step_s,
            "metrics": _last_metrics(trainer.paths.metrics),
            "unprofiled_metrics": unprofiled,
            "phases": summarize(events, on_gpu, args.top),
            "env": env_info(),
        }
        trainer.tracker.finish()
    return result


def _last_metrics(path: Path) -> dict:
    lines = path.read_text().splitlines() if path.exists() else []
    steps = [json.loads(x) for x in lines if '"loss"' in x]
    keep = ("time/step", "time/generate", "time/score", "time/train", "gpu_mem_gb")
    return {k: v for k, v in (steps[-1] if steps else {}).items() if k in keep}


def write(shape: str, args: argparse.Namespace, result: dict) -> Path:
    stem = f"profile_{shape}{'_' + args.tag if args.tag else ''}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    md = args.out / f"{stem}.md"
    md.write_text(markdown(shape, args.tag, result))
    return md


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
        cmd = [sys.executable, "-m", "bench.profile_step", "--child", "--shapes", shape]
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
