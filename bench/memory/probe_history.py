"""The allocator's history over one update (``torch.cuda.memory._snapshot``), replayed into
the blocks alive at its peak, grouped by the code that allocated them."""

from __future__ import annotations

from collections import defaultdict

from bench.memory.probe_core import GIB

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
