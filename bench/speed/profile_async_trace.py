"""The profiler's events of an asynchronous step as plain records (:class:`Ev`), sorted into
what ``profile_async_analysis`` computes on: each CUDA stream's kernels with the end of the
call that launched each one and the thread that made it, and each host thread's CPU ops,
CUDA runtime calls and synchronisations (:func:`classify`, pure); :func:`analyze` turns them
into a profiled step's numbers (pure). :func:`from_kineto` reads the records out of a
finished ``torch.profiler.profile``.

Why the runtime calls: a kernel names the stream it ran on, not the thread that launched it;
CUPTI gives each kernel the correlation id of its launch call (``cudaLaunchKernel``,
``cudaGraphLaunch``: every kernel of a replayed graph shares it), and that call names its
thread. The call's end is also when the kernel was handed to the GPU, so the time from it to
the kernel's start is time the GPU held submitted work back.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from bench.speed import profile_async_analysis as pa
from bench.speed.profile_async_analysis import Span

KERNEL_TYPES = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_TYPES = ("cuda_runtime", "cuda_driver")
SYNC_CALLS = (
    "cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy",
    "cuStreamSynchronize", "cuEventSynchronize", "cuCtxSynchronize", "cuMemcpyDtoH",
)  # fmt: skip
"""Runtime calls that block the calling thread until the GPU is done (exact names, and
their ``_v2``-style variants: a ``cudaMemcpyAsync`` does not block)."""
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero")
"""CPU ops that read a GPU value on the host: they wait for it."""
RANGE_PREFIX = "profile_async:"
CUT_TOLERANCE_US = 1000.0
"""GPU records ending this much before the update's range (which ends after its stream's
last kernel) were cut short."""


@dataclass(frozen=True)
class Ev:
    """One profiler event, times in µs on the profiler's clock."""

    name: str
    kind: str
    """``kernel`` (GPU work: kernels, copies, sets), ``runtime`` (a CUDA runtime or driver
    call), ``op`` (a CPU op) or ``range`` (a ``record_function`` range on the host)."""
    start: float
    end: float
    where: int
    """The stream of a kernel, the host thread (OS id) of anything else."""
    corr: int = 0
    """A kernel's or runtime call's CUPTI correlation id (they match); an op's own id."""
    linked: int = 0
    """A kernel's launching op (its id; 0: none recorded): the thread when no call is."""


def is_sync(ev: Ev) -> bool:
    """A call or op that blocks its thread until the GPU is done."""
    if ev.kind == "runtime":
        return any(ev.name == s or ev.name.startswith(s + "_v") for s in SYNC_CALLS)
    return ev.kind == "op" and ev.name in SYNC_OPS


@dataclass
class Thread:
    """What one host thread did: spans of CPU ops, CUDA runtime calls and syncs."""

    ops: list[Span] = field(default_factory=list)
    cuda: list[Span] = field(default_factory=list)
    sync: list[Span] = field(default_factory=list)


@dataclass
class Stream:
    """One CUDA stream's kernels (by start), when each was handed to the GPU (its launch
    call's end; None: no call recorded) and which thread launched how many."""

    kernels: list[Span] = field(default_factory=list)
    launched: list[float | None] = field(default_factory=list)
    by_thread: Counter = field(default_factory=Counter)


@dataclass
class Classified:
    streams: dict[int, Stream]
    threads: dict[int, Thread]
    ranges: dict[str, list[Ev]]
    """The ``profile_async:`` ranges by name (without the prefix)."""


def classify(events: list[Ev]) -> Classified:
    """Sort the events by stream and thread (pure). A kernel's thread is its launching op's
    where one was recorded (CPU ops are recorded per thread, as it is), else its launch
    call's (a replayed graph is launched outside any op)."""
    calls = {e.corr: e for e in events if e.kind == "runtime" and e.corr}
    ops = {e.corr: e for e in events if e.kind == "op" and e.corr}
    threads: dict[int, Thread] = defaultdict(Thread)
    ranges: dict[str, list[Ev]] = defaultdict(list)
    for e in events:
        if e.kind == "range" and e.name.startswith(RANGE_PREFIX):
            ranges[e.name[len(RANGE_PREFIX) :]].append(e)
        elif e.kind in ("op", "runtime"):
            t = threads[e.where]
            (t.cuda if e.kind == "runtime" else t.ops).append((e.start, e.end))
            if is_sync(e):
                t.sync.append((e.start, e.end))
    streams: dict[int, Stream] = defaultdict(Stream)
    for e in sorted((e for e in events if e.kind == "kernel"), key=lambda e: e.start):
        s, call, op = streams[e.where], calls.get(e.corr), ops.get(e.linked)
        s.kernels.append((e.start, e.end))
        s.launched.append(call.end if call else None)
        s.by_thread[op.where if op else call.where if call else -1] += 1
    return Classified(dict(streams), dict(threads), dict(ranges))


def pick_streams(c: Classified, main_tid: int, decode_tid: int | None) -> dict:
    """The update's stream (the one with most kernels launched from the main thread) and the
    decode's (most launched from the decode thread; when no launch call names that thread,
    the busiest other stream, ``found_by`` says so) (pure)."""

    def most(tid: int | None, skip: int | None = None) -> int | None:
        counts = {sid: s.by_thread[tid] for sid, s in c.streams.items() if sid != skip}
        best = max(counts, key=lambda sid: counts[sid], default=None)
        return best if best is not None and counts[best] > 0 else None

    main = most(main_tid)
    decode = most(decode_tid, skip=main) if decode_tid is not None else None
    found_by = "launch calls of each thread"
    if decode is None:
        others = {sid: len(s.kernels) for sid, s in c.streams.items() if sid != main}
        decode = max(others, key=lambda sid: others[sid], default=None)
        found_by = "elimination: the busiest stream that is not the update's"
    if not c.streams:
        found_by = "no CUDA stream ran a kernel"
    return {"main": main, "decode": decode, "found_by": found_by}


# ------------------------------------------------------------------ the step's numbers
def analyze(
    events: list[Ev], main_tid: int, decode_tid: int | None, tail_us: float,
    cut_tolerance_us: float = CUT_TOLERANCE_US,
) -> dict:  # fmt: skip
    """The step's numbers from its events (pure). The window is the update's range (it ends
    after the main stream's last kernel), cut where the decode thread's range ended (after
    that the decode stream idles for want of work, not for a wait); the tail, ``tail_us``
    after the update, holds the decode alone."""
    c = classify(events)
    upd = c.ranges.get("update", [])
    dec = [e for e in c.ranges.get("decode_thread", []) if decode_tid in (None, e.where)]
    out: dict[str, Any] = {"main_tid": main_tid, "decode_tid": decode_tid}
    if not upd:
        return out | {"error": "no update range recorded"}
    u = upd[-1]
    d_end = max((e.end for e in dec), default=u.end)
    gpu_end = max((k[1] for s in c.streams.values() for k in s.kernels), default=u.end)
    # The update's range ends after its stream's last kernel: GPU records that stop well
    # before it were cut short (CUPTI's buffers filled), and the window stops with them.
    cut = gpu_end < u.end - cut_tolerance_us
    end = min(u.end, d_end if dec else u.end, gpu_end if cut else u.end)
    window = (u.start, end)
    tail = (u.end, min(u.end + tail_us, d_end, gpu_end))
    out["window"] = {
        "update_ms": (u.end - u.start) / 1e3,
        "analyzed_ms": (window[1] - window[0]) / 1e3,
        "decode_thread_recorded": bool(dec),
        "decode_ended_before_update": bool(dec) and d_end < u.end,
        "gpu_records_end_early_ms": (u.end - gpu_end) / 1e3 if cut else None,
        "tail_ms": max(0.0, tail[1] - tail[0]) / 1e3,
    }
    picked = pick_streams(c, main_tid, decode_tid)
    out["streams_found_by"] = picked["found_by"]
    main_t, dec_t = c.threads.get(main_tid), c.threads.get(decode_tid) if decode_tid else None
    out["threads"] = {
        name: pa.thread_stats(t.ops, t.cuda, t.sync, window) | {"cuda_calls": len(t.cuda)}
        if t else None
        for name, t in (("main", main_t), ("decode", dec_t))
    }  # fmt: skip
    out["streams"] = {
        str(sid): {
            "role": "update" if sid == picked["main"] else "decode" if sid == picked["decode"]
            else "other",
            "launched_by": {_who(t, main_tid, decode_tid): n for t, n in s.by_thread.items()},
            **pa.stream_stats(s.kernels, window),
        }
        for sid, s in c.streams.items()
    }  # fmt: skip
    if picked["main"] is None or picked["decode"] is None:
        out["note"] = (
            "no CUDA streams (a CPU run): the threads' split only" if not c.streams
            else "fewer than two streams ran kernels: no overlap to measure"
        )  # fmt: skip
        return out
    if dec_t is None or not dec_t.cuda:
        out["warning"] = (
            "no CUDA runtime call was recorded on the decode thread: its syncs and launches "
            "are missing from the split (they count as CPU op or other time)"
        )
    ms, ds = c.streams[picked["main"]], c.streams[picked["decode"]]
    out["decode_alone_median_kernel_us"] = pa.stream_stats(ds.kernels, tail)["median_kernel_us"]
    out["overlap"] = pa.overlap(ds.kernels, ms.kernels, window)
    out["idle"] = {
        role: pa.idle_split(s.kernels, window, pa.pending(s.kernels, s.launched),
                            t.sync if t else [], t.cuda if t else [], t.ops if t else [])
        for role, s, t in (("decode", ds, dec_t), ("update", ms, main_t))
    }  # fmt: skip
    if main_t is not None:  # the decode's host wait while the main thread ran Python
        host_idle = _host_idle(ds, dec_t, window)
        covered = [*main_t.ops, *main_t.cuda]
        out["decode_host_wait_while_main_between_ops_us"] = pa.while_other_between(
            host_idle, covered, window
        )
    busy = out["streams"][str(picked["decode"])]["busy_us"]
    out["verdict"] = pa.verdict(out["idle"]["decode"], busy, window[1] - window[0])
    return out


def _host_idle(s: Stream, t: Thread | None, window: Span) -> list[Span]:
    """A stream's idle spans in which nothing of it was queued and its thread was not in a
    sync: its wait for the host."""
    idle = pa.subtract(pa.subtract([window], s.kernels), pa.pending(s.kernels, s.launched))
    return pa.subtract(idle, t.sync) if t else idle


def _who(tid: int, main_tid: int, decode_tid: int | None) -> str:
    return {main_tid: "main", decode_tid: "decode", -1: "unknown"}.get(tid, f"thread {tid}")


# ------------------------------------------------------------------ torch.profiler's side
def from_kineto(prof: Any) -> list[Ev]:
    """The events of a stopped ``torch.profiler.profile`` read straight from its Kineto
    results (no ``FunctionEvent`` tree: a 4,096-token decode makes ~10^5-10^6 kernels).
    ``device_resource_id`` is the stream of GPU work and the OS thread id of host events;
    ``correlation_id`` a kernel's and a runtime call's CUPTI id (an op's own id);
    ``linked_correlation_id`` the op a kernel or call ran under (as torch's own parser
    links them)."""
    out = []
    for k in prof.profiler.kineto_results.events():
        name = k.name()
        kind = _kind(_activity(k), name)
        if kind is None:
            continue
        start = k.start_ns() / 1e3
        end = start + k.duration_ns() / 1e3
        where, corr, linked = k.device_resource_id(), k.correlation_id(), k.linked_correlation_id()
        out.append(Ev(name, kind, start, end, int(where), int(corr), int(linked)))
    return out


def _activity(k: Any) -> str:
    """Kineto's activity type of an event; a torch without ``activity_type`` (it came after
    2.7) gets it from the device, the annotation flag and the name (:func:`activity_of`)."""
    if hasattr(k, "activity_type"):
        return k.activity_type()
    cuda = "CUDA" in str(k.device_type())
    annotation = bool(getattr(k, "is_user_annotation", lambda: False)())
    return activity_of(cuda, annotation, k.name())


def activity_of(on_device: bool, annotation: bool, name: str) -> str:
    """Kineto's activity type from what every torch reports (pure): device work is a kernel
    (copies and sets by name), host events named like CUDA's runtime or driver calls
    (``cudaLaunchKernel``, ``cuLaunchKernel``) are those calls, the rest ops."""
    if annotation:
        return "gpu_user_annotation" if on_device else "user_annotation"
    if on_device:
        low = name.lower()
        return "gpu_memcpy" if "memcpy" in low else "gpu_memset" if "memset" in low else "kernel"
    if name.startswith("cuda") or (name.startswith("cu") and name[2:3].isupper()):
        return "cuda_runtime"
    return "cpu_op"


def _kind(activity: str, name: str) -> str | None:
    if activity in KERNEL_TYPES:
        return "kernel"
    if activity in RUNTIME_TYPES:
        return "runtime"
    if activity == "cpu_op":
        return "op"
    if activity == "user_annotation" and name.startswith(RANGE_PREFIX):
        return "range"
    return None
