"""Interval arithmetic of an asynchronous step's profile (pure: lists of ``(start, end)`` in,
numbers out), for ``profile_async.py``.

The question it answers: while the update runs, does the decode (its own CUDA stream, its own
host thread) wait for the GPU or for the host? Inside a window (the update's), a stream's idle
time is split into disjoint parts, first match wins:

    gpu_queued   work of this stream was submitted (its launch call had returned) and had not
                 started: the GPU held it back (the other stream's blocks fill the device, or
                 the stream waits on an event)
    thread_sync  nothing queued; the launching thread sat in a CUDA synchronisation
                 (cudaStreamSynchronize, an ``.item()``, ...)
    thread_cuda  in another CUDA runtime call (a launch, an asynchronous copy): submitting
    thread_ops   inside a recorded CPU op (dispatch, the op's host work)
    thread_other none of these: Python between ops, a wait for the GIL, or host work no
                 profiler saw

``gpu_queued + thread_sync`` is the wait for the GPU, the rest the wait for the host.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

Span = tuple[float, float]
IDLE_PARTS = ("gpu_queued", "thread_sync", "thread_cuda", "thread_ops", "thread_other")
GPU_WAIT = ("gpu_queued", "thread_sync")
"""The idle parts in which the stream waited for the GPU; the others wait for the host."""


def union(spans: Iterable[Span]) -> list[Span]:
    """Sorted, disjoint spans covering exactly what ``spans`` cover (empty ones dropped)."""
    out: list[Span] = []
    for s, e in sorted([x for x in spans if x[1] > x[0]]):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def length(spans: Iterable[Span]) -> float:
    """Time covered by ``spans`` (overlaps counted once): a stream's busy time."""
    return sum(e - s for s, e in union(spans))


def intersect(a: Iterable[Span], b: Iterable[Span]) -> list[Span]:
    """Where both ``a`` and ``b`` cover, as disjoint spans."""
    ua, ub, out, i, j = union(a), union(b), [], 0, 0
    while i < len(ua) and j < len(ub):
        s, e = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        if e > s:
            out.append((s, e))
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Iterable[Span], b: Iterable[Span]) -> list[Span]:
    """Where ``a`` covers and ``b`` does not (one sweep over both: a profile holds ~10^5
    kernels a stream)."""
    ua, ub, out, j = union(a), union(b), [], 0
    for s, e in ua:
        while j < len(ub) and ub[j][1] <= s:  # ends before this span: before every later one
            j += 1
        cur, k = s, j
        while k < len(ub) and ub[k][0] < e:
            if ub[k][0] > cur:
                out.append((cur, ub[k][0]))
            cur = max(cur, ub[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def clip(spans: Iterable[Span], window: Span) -> list[Span]:
    """``spans`` cut to ``window``, as disjoint spans."""
    lo, hi = window
    return union((max(s, lo), min(e, hi)) for s, e in spans if e > lo and s < hi)


def median_us(spans: list[Span]) -> float | None:
    """Median length of the spans themselves (one per kernel), None for none."""
    return statistics.median(e - s for s, e in spans) if spans else None


def stream_stats(kernels: list[Span], window: Span) -> dict:
    """One stream inside ``window``: busy time (union of its kernels, cut to the window), the
    kernels that started in it and their median duration."""
    inside = [k for k in kernels if window[0] <= k[0] < window[1]]
    return {
        "busy_us": length(clip(kernels, window)),
        "kernels": len(inside),
        "median_kernel_us": median_us(inside),
    }


def overlap(decode: list[Span], update: list[Span], window: Span) -> dict:
    """Time in ``window`` when both streams ran a kernel, and its share of the update
    stream's busy time there (1.0: every update kernel ran beside a decode kernel)."""
    both = length(intersect(clip(decode, window), clip(update, window)))
    upd = length(clip(update, window))
    return {"both_busy_us": both, "share_of_update_busy": both / upd if upd else None}


def pending(kernels: list[Span], launched_at: list[float | None]) -> list[Span]:
    """Spans in which a kernel was submitted and not yet running: from the end of its launch
    call (``launched_at``, None: unknown, counted as none) to its start."""
    return union((t, k[0]) for k, t in zip(kernels, launched_at, strict=True) if t is not None)


def idle_split(
    kernels: list[Span],
    window: Span,
    queued: list[Span],
    sync: list[Span],
    cuda: list[Span],
    ops: list[Span],
) -> dict:
    """A stream's idle time in ``window`` split into :data:`IDLE_PARTS` (disjoint, first
    match wins): ``queued`` is :func:`pending` of its kernels, ``sync`` / ``cuda`` / ``ops``
    what its launching thread was doing (CUDA syncs, other CUDA runtime calls, CPU ops)."""
    idle = subtract([window], kernels)
    out, rest = {"idle_us": length(idle)}, idle
    for name, cover in zip(IDLE_PARTS[:4], (queued, sync, cuda, ops), strict=True):
        part = intersect(rest, cover)
        out[name + "_us"] = length(part)
        rest = subtract(rest, part)
    out["thread_other_us"] = length(rest)
    out["gpu_wait_us"] = sum(out[p + "_us"] for p in GPU_WAIT)
    out["host_wait_us"] = out["idle_us"] - out["gpu_wait_us"]
    return out


def thread_stats(ops: list[Span], cuda: list[Span], sync: list[Span], window: Span) -> dict:
    """A host thread inside ``window``: time inside CPU ops, CUDA runtime calls, syncs (each
    a union; a sync is also a runtime call or an op), and outside all of them."""
    busy = clip([*ops, *cuda, *sync], window)
    return {
        "cpu_op_us": length(clip(ops, window)),
        "cuda_call_us": length(clip(cuda, window)),
        "sync_us": length(clip(sync, window)),
        "outside_us": (window[1] - window[0]) - length(busy),
    }


def while_other_between(idle_host: list[Span], other_covered: list[Span], window: Span) -> float:
    """Of the spans in which one stream waited for its host (``idle_host``), the time the
    other thread was outside every recorded op and call (``other_covered`` is what it was
    inside): running Python, which holds the GIL. Much of it points at the GIL."""
    other_between = subtract([window], other_covered)
    return length(intersect(idle_host, other_between))


def verdict(decode_idle: dict, decode_busy_us: float, window_us: float) -> str:
    """One sentence from the decode stream's idle split in the update's window (pure)."""
    if window_us <= 0:
        return "no update window was recorded: nothing to say"
    idle = decode_idle["idle_us"]
    gpu, host = decode_idle["gpu_wait_us"], decode_idle["host_wait_us"]
    head = (
        f"the decode stream ran kernels {100 * decode_busy_us / window_us:.0f} % of the update's "
        f"window and was idle {100 * idle / window_us:.0f} %"
    )
    if idle <= 0.05 * window_us:
        return head + ": it hardly waited; its slowdown is in the kernels themselves"
    if gpu >= 2 * host:
        return head + (
            f"; {100 * gpu / idle:.0f} % of that idle time its work was queued on the GPU or "
            "its thread waited in a sync: the decode waits for the GPU"
        )
    if host >= 2 * gpu:
        return head + (
            f"; {100 * host / idle:.0f} % of that idle time nothing of it was queued and its "
            "thread was not waiting on the GPU: the decode waits for its host thread"
        )
    return head + (
        f"; the idle time is split between the GPU ({100 * gpu / idle:.0f} %) and the host "
        f"({100 * host / idle:.0f} %): neither alone"
    )
