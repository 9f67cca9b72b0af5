"""Found by the fault campaign (bench/faults/run.py, disk_full): grpo-monitor died on a full
disk. Its events.jsonl append raised ENOSPC (so did its own log, kept in the run
directory), the run went unwatched and never finished. The monitor must keep going and act
once the disk has room again.

The test proves that the monitor met the full disk: the tmpfs is mounted ``strictatime``, so
each pass's read of jobs.jsonl (nothing else reads it) moves its access time; the disk is
freed only after several passes were seen, each of which decided to STOP the run and could
not write it down."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_hpc.config.profiles import load_profile
from grpo_hpc.core.fsutil import append_jsonl, read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.submit.job import create_run
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")


@pytest.fixture
def small_fs(tmp_path: Path):
    root = tmp_path / "fs"
    root.mkdir()
    # strictatime: every read moves a file's access time (the passes are counted by it)
    opts = "size=2m,strictatime"
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(root)], check=True)
    yield root
    subprocess.run(["umount", "-l", str(root)], check=False)


def _fill(root: Path) -> Path:
    filler = root / ".filler"
    try:
        with open(filler, "wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
    except OSError:
        pass
    return filler


PASSES_ON_FULL_DISK = 3
"""Monitor passes seen on the full disk before it is freed."""
INTERVAL_S = 0.2
"""The monitor's --interval."""


def _passes(path: Path) -> Iterator[int]:
    """A lower bound of the monitor's passes so far: moves of the file's access time at
    least half an interval apart (one pass reads it more than once, within milliseconds;
    passes are an interval apart)."""
    seen, last, count = path.stat().st_atime_ns, 0.0, 0
    while True:
        now = path.stat().st_atime_ns
        if now != seen:
            seen = now
            if time.monotonic() - last >= INTERVAL_S / 2:
                last, count = time.monotonic(), count + 1
        yield count


def test_monitor_survives_full_disk(small_fs: Path) -> None:
    paths = RunPaths.for_run("r", small_fs)
    create_run(paths, load_profile("local"), "tiny", [])
    dead = subprocess.Popen(["true"])
    dead.wait()  # a local-executor job that has ended: the monitor must act on it
    append_jsonl(paths.jobs, {"job_id": str(dead.pid), "attempt": 0, "executor": "local"})
    filler = _fill(small_fs)
    log = open(paths.root / "monitor.log", "ab")  # noqa: SIM115 - where --watch puts it
    cmd = [sys.executable, "-m", "grpo_hpc.cli.monitor", "r", "--logs", str(small_fs)]
    # budget 0: it STOPs, no resubmission
    cmd += ["--interval", str(INTERVAL_S), "--max-retries", "0"]
    passes_seen = _passes(paths.jobs)
    mon = subprocess.Popen(cmd, stdout=log, stderr=log, cwd=REPO)
    try:
        passes = next(passes_seen)
        deadline = time.monotonic() + 60
        while passes < PASSES_ON_FULL_DISK and time.monotonic() < deadline:
            assert mon.poll() is None, f"grpo-monitor died on a full disk (exit {mon.returncode})"
            time.sleep(0.02)
            passes = next(passes_seen)
        assert passes >= PASSES_ON_FULL_DISK, f"the monitor made {passes} passes in 60 s"
        assert mon.poll() is None, f"grpo-monitor died on a full disk (exit {mon.returncode})"
        assert not read_jsonl(paths.events), "nothing can have been written"
        assert (paths.root / "monitor.log").stat().st_size == 0, "its log is on the full disk"
        filler.unlink()
        assert mon.wait(timeout=30) == 1  # the run is STOPPED: exit 1 by the documented rule
    finally:
        if mon.poll() is None:
            mon.kill()
    stops = [e for e in read_jsonl(paths.events) if e.get("action") == "STOP"]
    assert stops and stops[-1]["class"] == "budget_exhausted", read_jsonl(paths.events)
