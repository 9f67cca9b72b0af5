"""The real trainer of one shape (random weights, the project's default settings), its
phases and module forwards wrapped in profiler ranges, and one step profiled after the
warm-up steps."""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import env_info, untiny_overrides
from bench.speed.profile_attribution import (
    MODULE_SCOPES,
    PHASE_PREFIX,
    SCOPE_PREFIX,
    summarize,
)

SHAPES_DIR = Path(__file__).resolve().parents[1] / "shapes"  # bench/shapes


def run_overrides(shape: str, args: argparse.Namespace) -> list[str]:
    """The config speed/grpo_step.py / trl/baseline.py run (project defaults for memory settings,
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
    from grpo_hpc.train.distributed import dist
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
    from grpo_hpc.train.distributed import dist

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
        trainer.tracker.flush()  # a thread of the tracker's writes metrics.jsonl
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
        trainer.tracker.flush()
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
