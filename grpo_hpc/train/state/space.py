"""Room for a checkpoint: refused up front when the disk cannot hold it, and a save that
fills the disk part-way leaves nothing torn and says so in one line (grpo_hpc.train.state.checkpoint
calls these; the exit code is DiskFullError's, 1: the monitor retries within its budget)."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any, NoReturn

import torch

from grpo_hpc.core.errors import DiskFullError
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.memory.estimate import GIB
from grpo_hpc.train.distributed.dist import DistInfo, all_reduce_max, all_reduce_sum

SPACE_SLACK = 1.05
"""Room asked beyond the tensors' bytes: pickling headers, the RNG and trainer files."""


def state_bytes(obj: Any) -> int:
    """Bytes of the tensors in a nested state dict as this rank writes them (a DTensor's
    local shard)."""
    if isinstance(obj, torch.Tensor):
        local = obj.to_local() if hasattr(obj, "to_local") else obj
        return local.numel() * local.element_size()
    if isinstance(obj, dict):
        return sum(state_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_bytes(v) for v in obj)
    return 0


def space_problem(step: int, need: int, free: int, where: Path) -> str | None:
    """Why a checkpoint of ``need`` bytes will not fit in ``free`` bytes (pure), or None."""
    if free >= need * SPACE_SLACK + 2**20:
        return None
    return (
        f"checkpoint of step {step} needs about {need / GIB:.2f} GiB but the filesystem of "
        f"{where} has {free / GIB:.2f} GiB free: make room there (old runs' checkpoints, "
        f"training.keep_last) or move runs to a larger filesystem (grpo-submit --logs DIR); "
        f"nothing was written and the last complete checkpoint is intact"
    )


def check_space(paths: RunPaths, step: int, need: int, info: DistInfo) -> None:
    """Collective: refuse, on every rank and before writing a byte, a checkpoint that the
    checkpoints' filesystem cannot hold (all ranks' shards together: the run directory is
    shared). It asks the temp directory itself, which rank 0 has made: ``checkpoints/`` is
    often a link to scratch space on another filesystem. A disk that fills mid-write leaves
    a torn temp directory and torch's "unexpected pos" instead of a reason."""
    (total,) = all_reduce_sum([float(need)], info)
    problem = None
    if info.is_main:
        free = shutil.disk_usage(paths.checkpoint_tmp(step)).free
        problem = space_problem(step, int(total), free, paths.checkpoints)
    if all_reduce_max(1.0 if problem else 0.0, info):  # save() removes the temp dir
        raise DiskFullError(problem or f"checkpoint of step {step}: rank 0 found no room")


DISK_FULL_SIGNS = ("No space left on device", "Disk quota exceeded", "unexpected pos")
"""What torch's writers say (as RuntimeError) when the disk fills under them."""


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a write that ran out of space or quota (pure)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc) for s in DISK_FULL_SIGNS)


def abandon(paths: RunPaths, step: int, exc: Exception, info: DistInfo) -> NoReturn:
    """A save failed part-way: remove its temp directory (the space it took, and nothing
    torn left behind), then raise; a disk that filled while writing becomes one line."""
    if info.is_main:
        shutil.rmtree(paths.checkpoint_tmp(step), ignore_errors=True)
    if isinstance(exc, DiskFullError) or not is_disk_full(exc):
        raise exc
    free = shutil.disk_usage(paths.checkpoints).free / GIB
    raise DiskFullError(
        f"checkpoint of step {step}: the filesystem of {paths.checkpoints} filled while it "
        f"was written ({free:.2f} GiB free once the partial checkpoint was removed): make "
        f"room there or move runs to a larger filesystem (grpo-submit --logs DIR); the last "
        f"complete checkpoint is intact"
    ) from exc
