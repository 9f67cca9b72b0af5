"""Phases and categories of a profiled step, and the profiler's events read into them: each
kernel (or, on a CPU, leaf op) by the phase range it ran in and the scope that launched it,
summed per phase with the device's busy share and the top kernels."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

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
