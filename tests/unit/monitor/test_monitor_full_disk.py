"""Found by the fault campaign (bench/faults.py, disk_full): grpo-monitor died on a full
disk. Its events.jsonl append raised ENOSPC (so did its own log, kept in the run
directory), the run went unwatched and never finished. The monitor must keep going and act
once the disk has room again."""

from __future__ import annotations

import os
import subprocess
import sys
import time
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
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(root)], check=True)
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


def test_monitor_survives_full_disk(small_fs: Path) -> None:
    paths = RunPaths.for_run("r", small_fs)
    create_run(paths, load_profile("local"), "tiny", [])
    dead = subprocess.Popen(["true"])
    dead.wait()  # a local-executor job that has ended: the monitor must act on it
    append_jsonl(paths.jobs, {"job_id": str(dead.pid), "attempt": 0, "executor": "local"})
    filler = _fill(small_fs)
    log = open(paths.root / "monitor.log", "ab")  # noqa: SIM115 - where --watch puts it
    cmd = [sys.executable, "-m", "grpo_hpc.cli.monitor", "r", "--logs", str(small_fs)]
    cmd += ["--interval", "0.2", "--max-retries", "0"]  # budget 0: it STOPs, no resubmission
    mon = subprocess.Popen(cmd, stdout=log, stderr=log, cwd=REPO)
    try:
        time.sleep(4)
        assert mon.poll() is None, f"grpo-monitor died on a full disk (exit {mon.returncode})"
        assert not read_jsonl(paths.events), "nothing can have been written"
        filler.unlink()
        assert mon.wait(timeout=30) == 1  # the run is STOPPED: exit 1 by the documented rule
    finally:
        if mon.poll() is None:
            mon.kill()
    stops = [e for e in read_jsonl(paths.events) if e.get("action") == "STOP"]
    assert stops and stops[-1]["class"] == "budget_exhausted", read_jsonl(paths.events)
