"""A profiled asynchronous step as markdown (a table of the two streams, one of the two
threads, and a generated paragraph of what it says), and the result written under ``--out``
as ``profile_async_<tag>.{json,md}``."""

from __future__ import annotations

from pathlib import Path

from bench.common import write_result
from bench.speed.profile_async_analysis import IDLE_PARTS

THREAD_KEYS = ("cpu_op_us", "cuda_call_us", "sync_us", "outside_us")


def markdown(result: dict) -> str:
    """A small table per profiled step and what it says (generated from the numbers)."""
    head = f"### profile_async {result['tag'] or ''}: {result['shape']}, {result['env']['device']}"
    lines = [head, "", f"`{result['command']}`", "", _setting(result), ""]
    for i, s in enumerate(result["steps"]):
        took = f", the step {s['step_s']:.1f} s under the profiler" if "step_s" in s else ""
        lines += [f"Step {i + 1} profiled ({s.get('events', 0)} events{took}):", ""]
        lines += _stream_table(s) + [""] + _thread_table(s) + [""]
        lines.append("What it says: " + says(s, result["on_gpu"]))
        lines.append("")
    return "\n".join(lines)


def _setting(result: dict) -> str:
    """What ran: the decode stream's priority (CUDA's number), the lengths, the step as it
    ran unprofiled (the last warm-up step's logged times)."""
    plain = result.get("unprofiled_metrics", {})
    times = ", ".join(f"{k.removeprefix('time/')} {plain[k]:.2f} s"
                      for k in ("time/step", "time/generate", "time/train", "time/wait_rollouts")
                      if k in plain)  # fmt: skip
    priority = result.get("decode_stream_priority")
    return (f"Decode stream priority {priority} (lower is higher; None: no CUDA); "
            f"{result.get('lengths')}; unprofiled step: {times or 'not logged'}.")  # fmt: skip


def _stream_table(s: dict) -> list[str]:
    if not s.get("idle"):
        return [f"No stream table: {s.get('note') or s.get('error') or 'nothing recorded'}."]
    w = s["window"]["analyzed_ms"]
    rows = ["| stream | busy ms (% of window) | kernels | median kernel us | idle ms | "
            "queued on GPU | thread in sync | in CUDA call | in CPU op | other (Python/GIL) |",
            "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for role in ("decode", "update"):
        sid, st = next((k, v) for k, v in s["streams"].items() if v["role"] == role)
        idle = s["idle"][role]
        parts = " | ".join(f"{idle[p + '_us'] / 1e3:.1f}" for p in IDLE_PARTS)
        med = st["median_kernel_us"]
        busy = st["busy_us"] / 1e3
        rows.append(f"| {role} ({sid}) | {busy:.1f} ({100 * busy / w:.0f} %) | {st['kernels']} | "
                    f"{'-' if med is None else round(med, 1)} | {idle['idle_us'] / 1e3:.1f} | "
                    f"{parts} |")  # fmt: skip
    return rows


def _thread_table(s: dict) -> list[str]:
    rows = ["| thread | CPU ops ms | CUDA calls ms | syncs ms | outside all ms |"]
    rows.append("|---|---|---|---|---|")
    for name, t in s.get("threads", {}).items():
        cells = " | ".join(f"{t[k] / 1e3:.1f}" for k in THREAD_KEYS) if t else "not recorded"
        rows.append(f"| {name} | {cells} |")
    return rows


def says(s: dict, on_gpu: bool) -> str:
    """The paragraph under the tables (generated)."""
    if "error" in s:
        return s["error"]
    w = s["window"]
    lead = f"the update's window was {w['update_ms']:.0f} ms ({w['analyzed_ms']:.0f} analyzed"
    lead += ", the decode thread ended first)" if w["decode_ended_before_update"] else ")"
    if w.get("gpu_records_end_early_ms"):
        early = w["gpu_records_end_early_ms"]
        lead += (f"; the GPU's records stop {early:.0f} ms before its end (the profiler's "
                 "buffers filled: the part before is analyzed)")  # fmt: skip
    if "verdict" not in s:
        thr = s["threads"]
        cpu = ", ".join(f"{n} thread {t['cpu_op_us'] / 1e3:.0f} ms in CPU ops"
                        for n, t in thr.items() if t)  # fmt: skip
        why = s.get("note", "")
        where = "a CPU run, no GPU number here" if not on_gpu else "no overlap measured"
        return f"{lead}; {why} ({where}); {cpu or 'no thread recorded'}."
    ov = s["overlap"]["share_of_update_busy"]
    alone, dec = (
        s.get("decode_alone_median_kernel_us"),
        next(v for v in s["streams"].values() if v["role"] == "decode"),
    )
    kern = (
        f"; a decode kernel took {dec['median_kernel_us']:.1f} us (median) beside the update"
        f" and {alone:.1f} us alone after it"
        if alone and dec["median_kernel_us"]
        else ""
    )
    gil = s.get("decode_host_wait_while_main_between_ops_us")
    gil_s = (
        f"; {gil / 1e3:.0f} ms of the decode's host wait fell while the main thread ran "
        "Python between ops (holding the GIL)"
        if gil is not None
        else ""
    )
    both = "no update kernel" if ov is None else (
        f"both streams ran kernels at once {100 * ov:.0f} % of the update's busy time")  # fmt: skip
    warn = f" Warning: {s['warning']}." if "warning" in s else ""
    return f"{lead}; {both}; {s['verdict']}{kern}{gil_s}.{warn}"


def write(result: dict, out: Path, tag: str) -> Path:
    stem = f"profile_async{'_' + tag if tag else ''}"
    write_result(result, out / f"{stem}.json")
    md = out / f"{stem}.md"
    md.write_text(markdown(result))
    return md
