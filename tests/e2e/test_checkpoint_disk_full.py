"""A checkpoint that the run directory's filesystem cannot hold is refused before a byte is
written, with one line saying how much it needs: before, a full disk surfaced as torch's
"unexpected pos" mid-write and left a torn temp directory (seen on a GPU machine whose
64 GiB disk could not take a 3B model's 36 GB checkpoint)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.progress import TrainState, read_progress
from grpo_hpc.train.state.space import is_disk_full, space_problem, state_bytes

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


def test_is_disk_full_knows_what_the_writers_raise() -> None:
    import errno

    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    # torch.save's zip writer (seen on a GPU machine and on a tmpfs out of inodes)
    assert is_disk_full(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos"))
    assert is_disk_full(RuntimeError("open file failed with strerror: No space left on device"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(RuntimeError("CUDA error: an illegal memory access"))


def _mount_tmpfs(where: Path, options: str) -> None:
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")
def test_disk_filling_during_the_write_removes_the_partial_checkpoint(tmp_path: Path) -> None:
    """Room for the bytes but not for the files: ``checkpoints/`` on a tmpfs with four
    inodes (its root, ``ckpts``, the temp directory, ``model.pt``), so writing
    ``optim.pt`` fails after the up-front check passed, as when another job fills the disk."""
    fs = tmp_path / "fs"
    _mount_tmpfs(fs, "size=64m,nr_inodes=4")
    try:
        paths = make_run(tmp_path, "torn", "training.max_steps=2", "training.save_every_steps=1")
        (fs / "ckpts").mkdir()
        paths.checkpoints.symlink_to(fs / "ckpts")
        result = train(paths)
        rec = read_progress(paths.progress)
        leftovers = sorted(p.name for p in paths.checkpoints.iterdir())
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)
    assert result.returncode == ExitCode.CRASH, result.stderr[-2000:]
    assert rec.state == TrainState.FAILED and rec.step == 1
    assert "filled while it was written" in rec.reason, rec.reason
    assert leftovers == []  # the partial .tmp-step-1 is gone


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")
@pytest.mark.parametrize("small", ["run_dir", "checkpoints_link"])
def test_checkpoint_too_big_for_the_disk_is_refused_with_its_size(
    tmp_path: Path, small: str
) -> None:
    """The whole run directory on a 1 MiB filesystem, or only ``checkpoints/`` (a link to
    scratch space, as clusters often set it up): the check asks the filesystem the
    checkpoint would be written to."""
    fs = tmp_path / "fs"
    _mount_tmpfs(fs, "size=1m")
    try:
        root = fs if small == "run_dir" else tmp_path
        paths = make_run(root, "full", "training.max_steps=2", "training.save_every_steps=1")
        if small == "checkpoints_link":
            (fs / "ckpts").mkdir()
            paths.checkpoints.symlink_to(fs / "ckpts")
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
