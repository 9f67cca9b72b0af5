"""bench/probes/trace_busy.py: the GPU's busy time inside a phase of a profiled step (pure),
and the command over a trace written as ``training.profile_steps`` writes it (gzipped)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

from bench.probes.trace_busy import phase_rows, union_length


def test_overlapping_spans_count_once() -> None:
    assert union_length([]) == 0
    assert union_length([(0, 10), (5, 15), (20, 25)]) == 20
    assert union_length([(0, 10), (2, 3)]) == 10  # one inside another


def _trace() -> list[dict]:
    def x(name: str, cat: str, ts: float, dur: float) -> dict:
        return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur}

    return [
        x("grpo/update", "user_annotation", 1000, 1000),
        x("grpo/update", "gpu_user_annotation", 1000, 1000),  # the device-side copy: not a range
        x("sm90_gemm", "kernel", 900, 200),  # clipped to the range: 100 us inside
        x("triton_fused", "kernel", 1050, 100),  # overlaps the one before on another stream
        x("ncclDevKernel_AllReduce", "kernel", 1500, 300),
        x("Memcpy HtoD", "gpu_memcpy", 1900, 200),  # 100 us inside
        x("late", "kernel", 2500, 10),  # after the range
        x("grpo/generate", "user_annotation", 0, 900),
    ]


def test_a_phase_is_its_wall_and_the_gpu_busy_inside_it() -> None:
    [row] = phase_rows(_trace(), "update")
    assert row == {"wall_ms": 1.0, "gpu_busy_ms": 0.55, "kernels": 4, "nccl_ms": 0.3}
    assert phase_rows(_trace(), "score") == []


def test_the_command_reads_a_gzipped_trace(tmp_path: Path) -> None:
    path = tmp_path / "rank0-steps3-3.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": _trace()}, f)
    cmd = [sys.executable, "-m", "bench.probes.trace_busy", str(path)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert out.strip() == (
        "rank0-steps3-3.json.gz grpo/update #0: 1.0 ms, GPU busy 0.6 ms (55%), 4 kernels, "
        "NCCL 0.3 ms"
    )
