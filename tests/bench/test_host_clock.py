"""bench/probes/host_clock.py: the busy share from /proc/stat readings (pure), and the probe
run for real beside nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from bench.probes.host_clock import busy_share, cpu_times

from ..slowdown import guard

STAT = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\n"
LATER = "cpu  160 0 70 900 70 0 0 0 0 0\ncpu0 80 0 35 450 35 0 0 0 0 0\n"


def test_busy_share_counts_idle_and_iowait_as_not_busy() -> None:
    assert cpu_times(STAT) == (150, 1000)
    # 80 busy jiffies of 200 since: user 60 + system 20; idle 100 and iowait 20 are not
    assert busy_share(cpu_times(STAT), cpu_times(LATER)) == 80 / 200
    assert busy_share(cpu_times(STAT), cpu_times(STAT)) == 0.0


def test_the_probe_samples_until_its_time_is_up(tmp_path: Path) -> None:
    out = tmp_path / "clock.jsonl"
    cmd = [sys.executable, "-m", "bench.probes.host_clock", "--out", str(out)]
    t0 = time.time()
    subprocess.run([*cmd, "--every", "0.05", "--seconds", "0.5"], check=True, timeout=guard(60))
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    # at most one sample per 0.05 s of sleep, and samples until the 0.5 s are up (a loaded
    # machine gives fewer samples, never an earlier end)
    assert 1 <= len(rows) <= 11 and rows[-1]["time"] >= t0 + 0.5
    assert all(r["work_ms"] > 0 and 0 <= r["busy"] <= 1 for r in rows)
    assert [r["time"] for r in rows] == sorted(r["time"] for r in rows)
