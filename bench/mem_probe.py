"""Issue 38 probe: where the GPU memory and the time of a real GRPO step go, phase by phase.

Runs the real trainer (``grpo_hpc.train``) under torchrun with light instruments hooked in
from outside (nothing in the package changes), and writes per rank a small JSON:

- GPU memory (``torch.cuda.memory_allocated``, ``memory_reserved`` and the allocator's peak
  since the previous record) at phase boundaries: after load + shard + engine build,
  before and after each rollout's weight gather (``native.weights.refill``, timed), after
  the rollout, after the engine is released, before each micro-batch's forward, before
  its backward (the saved activations), after its backward (the peak inside it), before
  and after the optimizer step;
- the bytes of the local parameter shards, of the sharded gradients, of AdamW's state and
  of FSDP2's unsharded gradients kept between micro-batches (``unsharded_accumulated_grad``
  and unsharded ``.grad``, what ``set_requires_gradient_sync(False)`` accumulates);
- per step: generate, weight gather, update and optimizer step seconds (host clock; a
  device sync only around the gather and the optimizer step);
- with ``PROBE_HISTORY_STEP=N`` (1-based): on every rank, the allocator's history over step N's
  update (``torch.cuda.memory._record_memory_history``), replayed on the device into the
  blocks alive at the update's peak (or at the out-of-memory error), grouped by the code
  that allocated them (the innermost library frame and the innermost grpo_hpc frame):
  a small summary, not the pickle;
- with ``PROBE_PROFILE_STEP=N``: rank 0's update of step N under ``torch.profiler``, as GPU
  kernel time by kind (GEMM, attention, NCCL, optimizer, other), the GPU's busy share and
  the top kernels.

Switches that change the run (to measure a fix before it is made):

- ``PROBE_FSDP_SYNC_EACH=1``: under FSDP2, reduce-scatter after every micro-batch instead of
  accumulating unsharded gradients through ``set_requires_gradient_sync(False)`` (since
  b613001 the trainer itself does this, so the switch changes nothing there any more);
- ``PROBE_RESHARD_AFTER_FORWARD=0``: ``fully_shard(..., reshard_after_forward=False)``
  (layers stay gathered from forward to backward: no second all-gather).

Two ways in:

    # the 2-GPU ladder's plan for one shape, budget and mode (as bench/ladder.py runs it)
    python -m bench.mem_probe ladder --shape qwen2.5-7b --nproc 2 --steps 2 --out DIR
    # any run bench/grpo_step.py makes: add --probe (probe files go to $PROBE_OUT)
    PROBE_OUT=DIR python -m bench.grpo_step ... --probe
    # CPU smoke (gloo, fp32, the tiny shape)
    python -m bench.mem_probe ladder --device cpu --shape tiny --nproc 2 --steps 2 --out /tmp/p
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

GIB = 2**30


def _env_int(name: str, default: int = 0) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


# ----------------------------------------------------------------- the instruments


class Probe:
    """Records of one rank; written to ``$PROBE_OUT/probe_rank<R>.json`` after every step."""

    def __init__(self, out: Path) -> None:
        import torch

        self.out = out
        self.rank = int(os.environ.get("RANK", "0"))
        self.cuda = torch.cuda.is_available()
        self.records: list[dict] = []
        self.steps: list[dict] = []
        self.step = 0  # 1-based while a step runs
        self.mb = -1
        self.trainer: Any = None
        self.t_update = 0.0
        self.overall_peak = 0
        self.history: dict | None = None
        self.profile: dict | None = None
        self.cur: dict = {}
        self.history_step = _env_int("PROBE_HISTORY_STEP")
        self.profile_step = _env_int("PROBE_PROFILE_STEP")
        self.switches = {
            k: os.environ[k]
            for k in ("PROBE_FSDP_SYNC_EACH", "PROBE_RESHARD_AFTER_FORWARD")
            if k in os.environ
        }

    # memory -------------------------------------------------------------
    def mem(self) -> dict:
        import torch

        if not self.cuda:
            return {}
        peak = torch.cuda.max_memory_allocated()
        self.overall_peak = max(self.overall_peak, peak)
        out = {
            "alloc_gib": round(torch.cuda.memory_allocated() / GIB, 3),
            "reserved_gib": round(torch.cuda.memory_reserved() / GIB, 3),
            "peak_since_last_gib": round(peak / GIB, 3),
        }
        torch.cuda.reset_peak_memory_stats()
        return out

    def record(self, phase: str, **extra: Any) -> None:
        rec = {"step": self.step, "phase": phase, **self.mem(), **extra}
        if self.mb >= 0:
            rec["mb"] = self.mb
        self.records.append(rec)

    def sizes(self) -> dict:
        """Bytes (GiB) of local parameter shards, gradients, optimizer state and FSDP2's
        unsharded gradients."""
        model = self.trainer.model if self.trainer else None
        if model is None:
            return {}
        out = {"params": 0, "grads": 0, "optim_state": 0, "fsdp_unsharded_grads": 0}
        for p in model.parameters():
            out["params"] += _local_bytes(p)
            if p.grad is not None:
                out["grads"] += _local_bytes(p.grad)
        opt = getattr(getattr(self.trainer, "opt", None), "optim", None)
        if opt is not None:
            for state in opt.state.values():
                for v in state.values():
                    if hasattr(v, "element_size") and v.dim() > 0:
                        out["optim_state"] += _local_bytes(v)
        fsdp = _fsdp_params(model)
        for fp in fsdp:
            acc = getattr(fp, "unsharded_accumulated_grad", None)
            if acc is not None:
                out["fsdp_unsharded_grads"] += _local_bytes(acc)
            unsharded = getattr(fp, "_unsharded_param", None)
            if unsharded is not None and unsharded.grad is not None:
                out["fsdp_unsharded_grads"] += _local_bytes(unsharded.grad)
        sized = {k + "_gib": round(v / GIB, 3) for k, v in out.items()}
        return {
            **sized,
            "fsdp_params": len(fsdp),
            "unsharded_grad_mib": round(out["fsdp_unsharded_grads"] / 2**20, 3),
        }

    def sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        doc = {
            "rank": self.rank,
            "switches": self.switches,
            "overall_peak_gib": round(self.overall_peak / GIB, 3),
            "steps": self.steps,
            "records": self.records,
            "history": self.history,
            "profile": self.profile,
        }
        tmp = self.out / f".probe_rank{self.rank}.tmp"
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.rename(self.out / f"probe_rank{self.rank}.json")


def _local_bytes(t: Any) -> int:
    t = getattr(t, "_local_tensor", t)
    return t.numel() * t.element_size()


def _fsdp_params(model: Any) -> list:
    out = []
    for m in model.modules():
        get = getattr(m, "_get_fsdp_state", None)
        if get is None:
            continue
        with contextlib.suppress(Exception):
            state = get()
            groups = getattr(state, "_fsdp_param_groups", None)
            if groups is None:
                group = getattr(state, "_fsdp_param_group", None)
                groups = [group] if group is not None else []
            for g in groups:
                out.extend(g.fsdp_params)
    return out


def install(probe: Probe) -> None:
    """Hook the instruments into the trainer's classes and modules (before it runs)."""
    import torch

    from grpo_hpc.train import trainer
    from grpo_hpc.train.algo import optimization, update
    from grpo_hpc.train.rollout import collect
    from grpo_hpc.train.rollout.native import weights

    if os.environ.get("PROBE_RESHARD_AFTER_FORWARD") == "0":
        import torch.distributed.fsdp as fsdp_mod

        fsdp_mod.fully_shard = functools.partial(fsdp_mod.fully_shard, reshard_after_forward=False)

    if os.environ.get("PROBE_FSDP_SYNC_EACH") == "1":
        plain = update._no_sync

        def no_sync(model: Any, last: bool) -> Any:
            if update.fsdp_root(model) is not None:
                return contextlib.nullcontext()  # reduce-scatter after every micro-batch
            return plain(model, last)

        update._no_sync = no_sync

    setup = trainer.Trainer.setup

    def setup_probe(self: Any) -> None:
        probe.trainer = self
        setup(self)
        probe.record("after_setup", **probe.sizes())
        probe.write()

    trainer.Trainer.setup = setup_probe

    train_step = trainer.Trainer.train_step

    def train_step_probe(self: Any) -> None:
        probe.step += 1
        probe.mb = -1
        probe.cur = {"step": probe.step, "refill_s": 0.0}
        t0 = time.monotonic()
        profiling = probe.profile_step == probe.step and probe.rank == 0 and probe.cuda
        try:
            train_step(self)
        finally:
            probe.cur["step_s"] = round(time.monotonic() - t0, 3)
            probe.cur["profiled"] = profiling
            probe.steps.append(probe.cur)
            probe.write()

    trainer.Trainer.train_step = train_step_probe

    collect_fn = collect.Collector.collect

    def collect_probe(self: Any) -> Any:
        probe.record("before_rollout")
        got = collect_fn(self)
        probe.cur["generate_s"] = round(got.generate_s, 3)
        probe.record("after_rollout")
        return got

    collect.Collector.collect = collect_probe

    refill = weights.refill

    def refill_probe(packed: Any, model: Any) -> None:
        probe.sync()
        probe.record("before_weight_gather")
        t = time.monotonic()
        refill(packed, model)
        probe.sync()
        probe.cur["refill_s"] = round(probe.cur.get("refill_s", 0.0) + time.monotonic() - t, 4)
        probe.record("after_weight_gather")

    weights.refill = refill_probe

    release_cls = None
    with contextlib.suppress(ImportError):
        from grpo_hpc.train.rollout.native.engine import NativeEngine as release_cls  # noqa: N813
    if release_cls is not None:
        release = release_cls.release

        def release_probe(self: Any) -> None:
            release(self)
            probe.record("after_engine_release")

        release_cls.release = release_probe

    opt_update = optimization.StepOptimizer.update

    def update_probe(self: Any, *a: Any, **k: Any) -> Any:
        probe.record("update_start", **probe.sizes())
        hist = probe.history_step == probe.step and probe.cuda  # every rank: one may OOM first
        prof = probe.profile_step == probe.step and probe.rank == 0 and probe.cuda
        base = torch.cuda.memory_allocated() if hist else 0
        if hist:
            torch.cuda.memory._record_memory_history(
                enabled="all", context="alloc", stacks="python", max_entries=2_000_000
            )
        profiler = _start_profiler() if prof else None
        probe.t_update = time.monotonic()
        oom = None
        try:
            return opt_update(self, *a, **k)
        except torch.cuda.OutOfMemoryError as e:
            oom = str(e).splitlines()[0][:400]
            probe.record("out_of_memory", error=oom)
            raise
        finally:
            probe.cur["update_s"] = round(time.monotonic() - probe.t_update, 3)
            probe.mb = -1
            if profiler is not None:
                probe.profile = _stop_profiler(profiler)
            if hist:
                snap = torch.cuda.memory._snapshot()
                torch.cuda.memory._record_memory_history(enabled=None)
                probe.history = summarize_history(snap, base, torch.cuda.current_device())
                probe.history["oom_error"] = oom
            probe.write()

    optimization.StepOptimizer.update = update_probe

    logp = update.completion_logp

    def completion_logp_probe(*a: Any, **k: Any) -> Any:
        if not torch.is_grad_enabled():
            return logp(*a, **k)
        probe.mb += 1
        probe.record("mb_before_forward")
        out = logp(*a, **k)
        probe.record("mb_after_forward")  # alloc: what the forward keeps for backward
        return out

    update.completion_logp = completion_logp_probe

    backward = torch.Tensor.backward

    def backward_probe(self: Any, *a: Any, **k: Any) -> Any:
        if probe.mb < 0:
            return backward(self, *a, **k)
        probe.record("mb_before_backward")
        out = backward(self, *a, **k)
        probe.record("mb_after_backward", **probe.sizes())  # peak: inside the backward
        return out

    torch.Tensor.backward = backward_probe

    opt_step = optimization.StepOptimizer.optimizer_step

    def optimizer_step_probe(self: Any, step: int, on_nonfinite: Any) -> float:
        probe.mb = -1
        probe.sync()
        probe.record("before_optimizer_step", **probe.sizes())
        t = time.monotonic()
        zero_grad = self.optim.zero_grad

        def zero_grad_probe(*za: Any, **zk: Any) -> None:
            probe.sync()
            probe.record("after_optimizer_step", **probe.sizes())
            zero_grad(*za, **zk)

        self.optim.zero_grad = zero_grad_probe
        try:
            norm = opt_step(self, step, on_nonfinite)
        finally:
            del self.optim.zero_grad  # the bound method again
        probe.sync()
        probe.cur["optimizer_step_s"] = round(time.monotonic() - t, 4)
        probe.cur["backward_s"] = round(t - probe.t_update, 3)  # forwards + backwards
        probe.record("after_zero_grad")
        return norm

    optimization.StepOptimizer.optimizer_step = optimizer_step_probe


# ----------------------------------------------------------------- history summary

_LIBS = ("torch/distributed/", "torch/optim/", "torch/nn/utils/", "torch/utils/checkpoint",
         "transformers/", "torch/_dynamo", "torch/_inductor", "torch/nn/modules/")  # fmt: skip


def _short(frame: dict) -> str:
    name = frame.get("filename", "?")
    for mark in ("grpo_hpc/", "torch/", "transformers/"):
        if mark in name:
            name = mark + name.split(mark, 1)[1]
            break
    return f"{name}:{frame.get('line', '?')} {frame.get('name', '?')}"


def _site(frames: list[dict]) -> str:
    """The innermost library frame and the innermost grpo_hpc frame of an allocation."""
    if not frames:
        return "(no Python frame: autograd backward or a C++ kernel)"
    lib = next((f for f in frames if any(m in f.get("filename", "") for m in _LIBS)), None)
    own = next((f for f in frames if "grpo_hpc/" in f.get("filename", "")), None)
    parts = [_short(f) for f in (lib, own) if f is not None]
    return " <- ".join(parts) or _short(frames[0])


def summarize_history(snapshot: dict, baseline: int, device: int, top: int = 25) -> dict:
    """Replay the allocator's trace of one update: total allocated over time (the bytes
    alive when recording began, plus allocations, minus frees), its peak, and the blocks
    alive at the peak grouped by allocating code. Frees of blocks allocated before the
    recording lower the baseline (reported as ``freed_from_before_gib``)."""
    traces = snapshot.get("device_traces") or []
    events = traces[device] if device < len(traces) else []
    free_kind = "free_requested"
    if not any(e.get("action") == free_kind for e in events):
        free_kind = "free_completed"
    total, peak, peak_i = baseline, baseline, -1
    live: dict[int, int] = {}
    oom = None
    for i, e in enumerate(events):
        act = e.get("action")
        if act == "alloc":
            live[e["addr"]] = e["size"]
            total += e["size"]
        elif act == free_kind:
            total -= live.pop(e["addr"], e["size"])
        elif act == "oom":
            oom = {"index": i, "size_gib": round(e.get("size", 0) / GIB, 3)}
        if total > peak:
            peak, peak_i = total, i
    # second pass: the blocks alive at the peak
    live_site: dict[int, tuple[int, str]] = {}
    stacks: dict[int, list[str]] = {}
    freed_before = 0
    for e in events[: peak_i + 1]:
        act = e.get("action")
        if act == "alloc":
            frames = e.get("frames") or []
            live_site[e["addr"]] = (e["size"], _site(frames))
            if e["size"] >= 2**26:  # 64 MiB and more: keep the first frames as they come
                stacks[e["addr"]] = [_short(f) for f in frames[:6]]
        elif act == free_kind:
            if e["addr"] in live_site:
                live_site.pop(e["addr"])
            else:
                freed_before += e["size"]
    by_site: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for size, site in live_site.values():
        by_site[site][0] += size
        by_site[site][1] += 1
    ranked = sorted(by_site.items(), key=lambda kv: -kv[1][0])
    largest = sorted(live_site.items(), key=lambda kv: -kv[1][0])[:15]
    return {
        "events": len(events),
        "baseline_gib": round(baseline / GIB, 3),
        "freed_from_before_gib": round(freed_before / GIB, 3),
        "peak_gib": round(peak / GIB, 3),
        "peak_event_index": peak_i,
        "oom_event": oom,
        "alive_at_peak_from_update_gib": round(sum(v[0] for v in live_site.values()) / GIB, 3),
        "by_site": [
            {"site": s, "gib": round(v[0] / GIB, 3), "blocks": v[1]} for s, v in ranked[:top]
        ],
        "largest_blocks": [
            {"gib": round(v[0] / GIB, 3), "site": v[1], "frames": stacks.get(a, [])}
            for a, v in largest
        ],
    }


# ----------------------------------------------------------------- profiler summary


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


# ----------------------------------------------------------------- the torchrun child


def child(run_dir: str, cap_gib: float) -> int:
    import torch

    if cap_gib and torch.cuda.is_available():
        device = int(os.environ.get("LOCAL_RANK", "0"))
        total = torch.cuda.get_device_properties(device).total_memory / GIB
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib / total), device)
    out = Path(os.environ.get("PROBE_OUT") or Path(run_dir) / "probe")
    probe = Probe(out)
    install(probe)
    from grpo_hpc.train.__main__ import main as train_main

    code = train_main([run_dir])
    probe.write()
    return code


# ----------------------------------------------------------------- the ladder's plan


def ladder_run(args: argparse.Namespace) -> dict:
    """One ladder row's plan (bench/ladder.py: the estimator's settings for the budget's
    2-GPU profile), run under the probe; the estimator's figures beside the measured ones."""
    from bench import ladder
    from grpo_hpc.config.profiles import profile_from_dict
    from grpo_hpc.core.paths import RunPaths
    from grpo_hpc.memory import estimate as memory
    from grpo_hpc.submit.job import create_run

    largs = argparse.Namespace(
        device=args.device, prompts=args.prompts, G=args.G, max_new=args.max_new,
        micro_tokens=args.micro_tokens, nproc=args.nproc, steps=args.steps,
    )  # fmt: skip
    est = ladder.estimates(largs, args.shape, args.budget, args.mode)
    plan = est[args.nproc]
    if args.cpu_offload:  # the same plan with FSDP2's CPU offload (the profile allows it)
        offload = memory.replace(plan.settings, cpu_offload=True)
        plan = memory.fit(ladder.load_shape(args.shape), offload, None)
    s = plan.settings
    with tempfile.TemporaryDirectory() as work:
        paths = RunPaths(Path(work) / "run")
        prof = {"executor": "local", "precision": s.precision, "strategy": s.strategy}
        profile = profile_from_dict({**prof, "attn_implementation": "sdpa"}, name="probe")
        create_run(paths, profile, "tiny", ladder.row_overrides(largs, args.shape, s), force=True)
        cap = ladder.BUDGETS[args.budget][1] if args.device == "cuda" else 0
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={args.nproc}", "--max-restarts=0", "-m", "bench.mem_probe",
               "child", str(paths.root), "--cap-gib", str(cap)]  # fmt: skip
        os.environ["PROBE_OUT"] = str(args.out)
        t0 = time.monotonic()
        code, tail = ladder._run_group(cmd, args.timeout)
        wall = time.monotonic() - t0
        metrics = (
            [json.loads(x) for x in paths.metrics.read_text().splitlines()]
            if paths.metrics.exists()
            else []
        )
        progress = json.loads(paths.progress.read_text()) if paths.progress.exists() else {}
    ranks = sorted(args.out.glob("probe_rank*.json"))
    probes = [json.loads(p.read_text()) for p in ranks]
    e = plan.estimate
    return {
        "shape": args.shape, "budget": args.budget, "mode": args.mode, "gpus": args.nproc,
        "settings": s.describe(), "run_settings": dataclasses.asdict(s),
        "exit_code": code, "wall_s": round(wall, 1),
        "reason": progress.get("reason"), "stderr_tail": tail[-800:] if code else "",
        "estimate": {"peak_gib": round(e.peak_gib, 3), "total_gib": round(e.total_gib, 3),
                     "phase": e.peak_phase, "breakdown_gib": e.breakdown()},
        "switches": {k: v for k, v in os.environ.items() if k.startswith("PROBE_")},
        "metrics": [{k: m.get(k) for k in ("step", "time/step", "time/generate", "time/train",
                                            "gpu_mem_gb", "gpu_alloc_retries")}
                    for m in metrics if "loss" in m],
        "measured": summarize_probes(probes),
        "records": {f"rank{d['rank']}": d["records"] for d in probes},
    }  # fmt: skip


def summarize_probes(probes: list[dict]) -> dict:
    """Per rank: overall peak, the largest record per phase kind, step timings."""
    out = {}
    for doc in probes:
        by_phase: dict[str, dict] = {}
        for r in doc["records"]:
            key = r["phase"]
            best = by_phase.get(key)
            if best is None or r.get("peak_since_last_gib", 0) > best.get("peak_since_last_gib", 0):
                by_phase[key] = r
        steps = [s for s in doc["steps"] if s.get("step", 0) > 1 and not s.get("profiled")]
        med = {}
        for k in ("step_s", "generate_s", "refill_s", "update_s", "backward_s", "optimizer_step_s"):
            vals = [s[k] for s in steps if k in s]
            if vals:
                med[k] = round(statistics.median(vals), 4)
        out[f"rank{doc['rank']}"] = {
            "overall_peak_gib": doc["overall_peak_gib"],
            "max_record_per_phase": by_phase,
            "median_after_step1": med,
            "steps": doc["steps"],
            "history": doc.get("history"),
            "profile": doc.get("profile"),
        }
    return out


def merge(name: str, step_json: Path, probe_dir: Path, into: Path) -> None:
    """Add one bench/grpo_step.py run (its result and its probe files) to ``into`` under
    ``name``; a run that wrote no result is recorded with what its probe saw."""
    doc = json.loads(into.read_text()) if into.exists() else {"runs": {}}
    step = json.loads(step_json.read_text()) if step_json.exists() else {"failed": True}
    probes = [json.loads(f.read_text()) for f in sorted(probe_dir.glob("probe_rank*.json"))]
    for p in probes:  # keep the file small: the per-record list is summarised
        p["records"] = [r for r in p["records"] if r.get("step", 0) in (0, 2)]
    step.pop("lengths", None)
    doc["runs"][name] = {"grpo_step": step, "probe": summarize_probes(probes)}
    into.write_text(json.dumps(doc, indent=1) + "\n")
    meds = {k: v["median_after_step1"] for k, v in doc["runs"][name]["probe"].items()}
    print(name, json.dumps(meds))


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] == "merge":
        p = argparse.ArgumentParser()
        p.add_argument("cmd")
        p.add_argument("--name", required=True)
        p.add_argument("--step-json", type=Path, required=True, help="bench/grpo_step.py's --out")
        p.add_argument("--probe-dir", type=Path, required=True)
        p.add_argument("--into", type=Path, required=True)
        a = p.parse_args(argv)
        merge(a.name, a.step_json, a.probe_dir, a.into)
        return
    if argv and argv[0] == "child":
        p = argparse.ArgumentParser()
        p.add_argument("cmd")
        p.add_argument("run_dir")
        p.add_argument("--cap-gib", type=float, default=0.0)
        a = p.parse_args(argv)
        sys.exit(child(a.run_dir, a.cap_gib))
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("cmd", choices=["ladder"])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--shape", default="qwen2.5-7b", help="a name in bench/shapes")
    p.add_argument("--budget", default="h100", choices=["h100", "supercloud"])
    p.add_argument("--mode", default="full", choices=["full", "lora"])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-new", type=int, default=512)
    p.add_argument("--micro-tokens", type=int, default=4096)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--cpu-offload", action="store_true", help="the plan with FSDP2 CPU offload")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", type=Path, required=True, help="folder for the probe files")
    p.add_argument("--summary", type=Path, help="write the summary JSON here")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    result = ladder_run(args)
    text = json.dumps(result, indent=1)
    if args.summary:
        args.summary.write_text(text + "\n")
    brief = {k: result[k] for k in ("shape", "settings", "exit_code", "wall_s", "reason")}
    brief["estimate_peak_gib"] = result["estimate"]["peak_gib"]
    for rank, m in result["measured"].items():
        brief[rank] = {"overall_peak_gib": m["overall_peak_gib"], **m["median_after_step1"]}
    print(json.dumps(brief))


if __name__ == "__main__":
    main()
