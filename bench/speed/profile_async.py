"""Benchmark: while an asynchronous step's update runs, does the decode wait for the GPU or
for its host thread?

An asynchronous run (``algo.max_staleness=1``, thread placement) decodes the next step's
rollouts in a thread of the training process, on a CUDA stream of its own, while the main
thread runs the update. On one H200 the decode slowed by about the update's length while
both ran (bench/results/LOG-speed.md, issue 67): either its small kernels queue behind the
update's large ones (the GPU), or its thread is held back on the host (the GIL, Python).
The step's metrics cannot tell the two apart; a profile can.

This runs the real trainer in this process (``profile_run.build_trainer``: random weights of
a bench/shapes config, the project's defaults) asynchronously, warm-up steps, then profiles
``--profiled`` steps with torch.profiler (CPU ops of every thread, CUDA kernels and runtime
calls). In each, inside the update's window (from its start to its last kernel, cut where
the decode thread ended, or where the GPU's records stop if the profiler's buffers filled):

- per stream (the update's: most kernels launched from the main thread; the decode's: most
  launched from the decode thread): busy time, kernels, median kernel duration, and the
  decode's median kernel again in ``--tail-s`` after the update (the decode alone);
- the time both streams ran a kernel at once, as a share of the update stream's busy time;
- each stream's idle time split (``profile_async_analysis.idle_split``) into work queued on
  the GPU, its thread in a sync, in another CUDA call, in a CPU op, or none of these
  (Python, the GIL); and how much of the decode's host wait fell while the main thread ran
  Python between ops (holding the GIL);
- each thread's CPU op, CUDA call and sync time in the window.

On a CPU there are no streams: the report says so and gives the threads' split only.

    python -m bench.speed.profile_async --model-dir random:bench/shapes/qwen2.5-1.5b \\
        --max-new 4096 --prompts 8 --G 8 --length-dist bench/speed/lengths/F.json \\
        [--override rollout.decode_priority=high] --tag high --out DIR

writes ``DIR/profile_async_<tag>.json`` and ``.md`` (``--trace``: also the chrome trace).
"""

from __future__ import annotations

import argparse
import functools
import json
import shlex
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import env_info
from bench.speed.profile_async_tables import write
from bench.speed.profile_async_trace import RANGE_PREFIX, analyze, from_kineto
from bench.speed.profile_run import SHAPES_DIR, build_trainer

METRIC_KEYS = ("time/step", "time/generate", "time/train", "time/wait_rollouts", "gpu_mem_gb")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    shapes = sorted(d.name for d in SHAPES_DIR.iterdir() if (d / "config.json").is_file())
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--shape", choices=shapes, help="random weights of bench/shapes/SHAPE")
    src.add_argument("--model-dir", help="random:bench/shapes/SHAPE, as grpo_step.py takes it")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], help="default: bf16 on GPU")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-new", type=int, default=256)
    p.add_argument("--warmup", type=int, default=2, help="steps before the profiled ones")
    p.add_argument("--profiled", type=int, default=1, help="steps profiled, each on its own")
    p.add_argument("--tail-s", type=float, default=0.5,
                   help="s of the decode alone profiled after the update")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="training.seed (and the drawn lengths)")
    p.add_argument(
        "--length-dist",
        type=Path,
        metavar="FILE",
        help="impose each row's length, drawn from FILE (imposed_lengths.py)",
    )
    p.add_argument("--override", action="extend", nargs="+", default=[],
                   help="config key=value, after algo.max_staleness=1")  # fmt: skip
    p.add_argument("--tag", default="", help="suffix of the output files (e.g. high)")
    p.add_argument("--trace", action="store_true", help="also write the chrome trace")
    p.add_argument("--out", type=Path, default=Path("bench/results/profile_async"))
    args = p.parse_args(argv)
    args.shape_name = args.shape or shape_of(args.model_dir, p)
    return args


def shape_of(model_dir: str, p: argparse.ArgumentParser) -> str:
    """The bench/shapes name in ``random:bench/shapes/NAME`` (the only models this builds)."""
    name = Path(model_dir.removeprefix("random:")).name
    if not model_dir.startswith("random:") or not (SHAPES_DIR / name / "config.json").is_file():
        p.error(f"--model-dir {model_dir}: random:bench/shapes/NAME with NAME in {SHAPES_DIR}")
    return name


def overrides(args: argparse.Namespace) -> list[str]:
    """The config on top of ``profile_run.run_overrides``: asynchronous, the native engine
    when lengths are imposed, the seed, the caller's overrides, and one step after the
    profiled ones (the last step generates nothing ahead: no overlap to profile)."""
    native = ["rollout.engine=native"] if args.length_dist else []
    return [
        "algo.max_staleness=1", *native, f"training.seed={args.seed}", *args.override,
        f"training.max_steps={args.warmup + args.profiled + 1}",
    ]  # fmt: skip


class Hooks:
    """Instance-level wrappers on the trainer: a profiler range around the update (its end
    after the main stream's last kernel) and around the decode thread's work, and a call
    after the update (``after_update``: stops the profiler) at the first ``settle``."""

    def __init__(self, trainer: Any) -> None:
        import torch

        self.cuda = torch.cuda.is_available()
        self.main_tid = threading.get_native_id()
        self.decode_tid: int | None = None
        self.after_update: Callable[[], None] | None = None
        self._updated = False
        opt, pipe = trainer.opt, trainer.rollouts
        opt.update = self._update(opt.update)
        pipe._run_ahead = self._decode(pipe._run_ahead)
        pipe.settle = self._settle(pipe.settle)
        self.side = getattr(pipe, "side", None)

    def _update(self, fn: Callable) -> Callable:
        import torch
        from torch.profiler import record_function

        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            with record_function(RANGE_PREFIX + "update"):
                out = fn(*a, **k)
                if self.cuda:  # this stream only: a device-wide sync would wait for the decode
                    torch.cuda.current_stream().synchronize()
            self._updated = True
            return out

        return wrapper

    def _decode(self, fn: Callable) -> Callable:
        from torch.profiler import record_function

        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            self.decode_tid = threading.get_native_id()
            with record_function(RANGE_PREFIX + "decode_thread"):
                return fn(*a, **k)

        return wrapper

    def _settle(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            if self._updated and self.after_update is not None:
                hook, self.after_update = self.after_update, None
                hook()
            return fn(*a, **k)

        return wrapper

    def arm(self, after_update: Callable[[], None]) -> None:
        self._updated, self.after_update = False, after_update


def profiler(cuda: bool) -> Any:
    """torch.profiler over every thread (``profile_all_threads``, torch >= 2.7: without it
    only the thread that started it records CPU ops, and the decode thread's are lost)."""
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    try:
        config = _ExperimentalConfig(profile_all_threads=True)
    except TypeError:  # an older torch: the decode thread's CPU ops are not recorded
        config = _ExperimentalConfig()
    return profile(activities=acts, experimental_config=config)


def profile_step(
    trainer: Any, hooks: Hooks, args: argparse.Namespace, out_trace: Path | None
) -> dict:
    """One asynchronous step under the profiler, stopped ``--tail-s`` after the update."""
    prof = profiler(hooks.cuda)
    stopped: list[float] = []

    def stop() -> None:
        time.sleep(args.tail_s)  # the decode alone (the main thread would wait in join)
        prof.stop()
        stopped.append(time.perf_counter())

    hooks.arm(stop)
    t0 = time.perf_counter()
    prof.start()
    trainer.train_step()
    if not stopped:  # no settle after an update (nothing was generated ahead)
        prof.stop()
        stopped.append(time.perf_counter())
    t1 = time.perf_counter()
    if out_trace is not None:
        prof.export_chrome_trace(str(out_trace))
    events = from_kineto(prof)
    result = analyze(events, hooks.main_tid, hooks.decode_tid, args.tail_s * 1e6)
    t2 = time.perf_counter()
    result["profiled_s"] = stopped[0] - t0
    result["step_s"] = t1 - t0
    result["analysis_s"] = t2 - t1
    result["events"] = len(events)
    return result


def run(args: argparse.Namespace) -> dict:
    """Build the trainer, take the warm-up steps, profile the next ones."""
    import torch

    from bench.speed.imposed_lengths import install

    lengths = args.length_dist
    runner = argparse.Namespace(precision=args.precision, prompts=args.prompts, G=args.G,
                                max_new=args.max_new, warmup=args.warmup,
                                override=overrides(args))  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        if lengths:
            install(lengths, args.max_new, args.seed, Path(d) / "generations")
        trainer = build_trainer(Path(d), args.shape_name, runner)
        hooks = Hooks(trainer)
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            trainer.train_step()
        warm_s = time.perf_counter() - t0
        trainer.tracker.flush()  # the metrics are written by a thread of the tracker's
        unprofiled = last_metrics(trainer.paths.metrics)
        steps = []
        for i in range(args.profiled):
            trace = args.out / f"trace_async_{args.tag or 'run'}_{i}.json" if args.trace else None
            steps.append(profile_step(trainer, hooks, args, trace))
            trainer.tracker.flush()
            steps[-1]["profiled_metrics"] = last_metrics(trainer.paths.metrics)
        priority = getattr(getattr(hooks.side, "stream", None), "priority", None)
        trainer.tracker.finish()
    return {
        "benchmark": "profile_async",
        "shape": args.shape_name,
        "tag": args.tag,
        "on_gpu": torch.cuda.is_available(),
        "overrides": overrides(args),
        "lengths": f"lengths imposed from {lengths}" if lengths else "the model's own",
        "decode_stream_priority": priority,
        "warmup_steps": args.warmup,
        "warmup_s": warm_s,
        "unprofiled_metrics": unprofiled,
        "steps": steps,
    }


def last_metrics(path: Path) -> dict:
    """The last trained step's times as logged (the step as it runs unobserved)."""
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    rows = [r for r in rows if "loss" in r]
    return {k: v for k, v in (rows[-1] if rows else {}).items() if k in METRIC_KEYS}


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    result = run(args)
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    argv_used = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "-m", "bench.speed.profile_async", *argv_used])
    result |= {"config": config, "env": env_info(), "command": command}
    md = write(result, args.out, args.tag)
    print(md.read_text(), flush=True)


if __name__ == "__main__":
    main()
