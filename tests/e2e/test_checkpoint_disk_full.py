"""A checkpoint that the run directory's filesystem cannot hold is refused before a byte is
written, with one line saying how much it needs: before, a full disk surfaced as torch's
"unexpected pos" mid-write and left a torn temp directory (seen on a GPU machine whose
64 GiB disk could not take a 3B model's 36 GB checkpoint)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from grpo_hpc.errors import ExitCode
from grpo_hpc.progress import TrainState, read_progress
from grpo_hpc.train.checkpoint import space_problem, state_bytes

from .helpers import make_run, train


def test_state_bytes_counts_every_tensor_once_in_nested_state() -> None:
    import torch

    moment = torch.zeros(5, dtype=torch.bfloat16)
    state = {"a": torch.zeros(3, 4), "opt": {"state": {0: {"m": moment}}}}
    state["list"] = [torch.zeros(2, dtype=torch.int64), "not a tensor", 7]
    assert state_bytes(state) == 3 * 4 * 4 + 5 * 2 + 2 * 8


def test_space_problem_needs_the_bytes_and_some_slack() -> None:
    gib = 2**30
    assert space_problem(3, need=gib, free=2 * gib, where=Path("/x")) is None
    why = space_problem(3, need=10 * gib, free=gib, where=Path("/scratch/run"))
    assert why is not None and "step 3 needs about 10.00 GiB" in why
    assert "/scratch/run has 1.00 GiB free" in why and "--logs" in why
    assert space_problem(3, need=gib, free=gib, where=Path("/x")) is not None  # no slack left


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")
def test_checkpoint_too_big_for_the_disk_is_refused_with_its_size(tmp_path: Path) -> None:
    fs = tmp_path / "fs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(fs)], check=True)
    try:
        paths = make_run(fs, "full", "training.max_steps=2", "training.save_every_steps=1")
        result = train(paths)
        rec = read_progress(paths.progress)
        ckpts = paths.checkpoints
        leftovers = sorted(p.name for p in ckpts.iterdir()) if ckpts.exists() else []
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)
    assert result.returncode == ExitCode.CRASH, result.stderr[-2000:]
    assert rec.state == TrainState.FAILED and rec.step == 1
    assert "checkpoint of step 1 needs about" in rec.reason and "GiB free" in rec.reason
    assert leftovers == []  # no torn .tmp-step-1, no step-1
