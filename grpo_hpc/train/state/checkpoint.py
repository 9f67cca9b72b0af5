"""Checkpoints that count only when complete, and hold everything for an exact resume.

Layout of ``checkpoints/step-N/``: the weights and optimizer state in one of two formats,
``trainer.pt`` (step, scheduler, data position, counters, world size), ``rng-rank{R}.pt``
(each rank's RNG states and, in an asynchronous run, the batches it generated ahead:
``train/rollout/pipeline.py``), ``manifest.json`` (format, world size, size and sha256 of every
file), and ``COMPLETE``. All of it is written into ``.tmp-step-N/``, renamed, and only then
marked COMPLETE (by rank 0, after every rank's files are on disk, and only when the
manifest lists the model and optimizer files and they are all there): a job killed at any
moment leaves either no checkpoint or a partial one that resume ignores, and a checkpoint
whose files vanished under its writer is never marked COMPLETE (grpo_hpc.core.manifest).

* **gathered** (DDP, one process): ``model.pt`` and ``optim.pt``, full state dicts written
  by rank 0. Simple, and loads at any world size.
* **sharded** (FSDP2 on more than one process): ``dcp/``, a ``torch.distributed.checkpoint``
  directory in which every rank writes its own shard (``__R_0.distcp``, fsynced) and rank 0
  the ``.metadata``; no rank ever holds the whole model. DCP reshards on load, so it resumes
  on the same world size, on a different one, and in a single process.

Resume reads whichever format the checkpoint has, whatever the run uses now.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from grpo_hpc.core.best import read_best
from grpo_hpc.core.errors import RunDirBusyError
from grpo_hpc.core.fsutil import fsync_dir, fsync_file
from grpo_hpc.core.manifest import is_complete, mark_complete, verify_checkpoint, write_manifest
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.train.distributed.dist import DistInfo, barrier
from grpo_hpc.train.state.space import abandon, check_space, state_bytes

GATHERED, SHARDED = "gathered", "sharded"
DCP_DIR = "dcp"


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def seed_all(seed: int) -> None:
    """Seed every generator a checkpoint restores (Python, NumPy, torch CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds every CUDA device too


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _options(trainable_only: bool, full: bool = True) -> StateDictOptions:
    return StateDictOptions(
        full_state_dict=full, cpu_offload=full, ignore_frozen_params=trainable_only
    )


def choose_format(params_sharded: bool, world_size: int) -> str:
    """Sharded (DCP) when the parameters are FSDP2 shards across processes, else gathered."""
    return SHARDED if params_sharded and world_size > 1 else GATHERED


def has_sharded_params(model: torch.nn.Module) -> bool:
    """Whether FSDP2 (``fully_shard``) turned the parameters into DTensor shards."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def format_of(ckpt: Path) -> str:
    """The format a checkpoint directory was written in."""
    return SHARDED if (ckpt / DCP_DIR / ".metadata").is_file() else GATHERED


def model_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint as one CPU state dict, in either format (DCP
    shards are gathered in this process through a temporary file next to ``ckpt``)."""
    if format_of(ckpt) == GATHERED:
        return torch.load(ckpt / "model.pt", map_location="cpu")
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = ckpt.parent / f".full-{ckpt.name}.pt"
    dcp_to_torch_save(ckpt / DCP_DIR, out)
    try:
        return torch.load(out, map_location="cpu", weights_only=False)["model"]
    finally:
        out.unlink()


def save(
    paths: RunPaths,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict[str, Any],
    rng: dict[str, Any],
    info: DistInfo,
    *,
    trainable_only: bool = False,
    keep_last: int = 2,
    slow_save_s: float = 0.0,
    seconds: dict[str, float] | None = None,
) -> Path:
    """Collective: every rank calls it. ``rng`` is this rank's RNG state to store.
    ``seconds``, when given, receives where this rank's time went (:class:`SaveClock`)."""
    clock = SaveClock(seconds if seconds is not None else {})
    if not optimizer.state:
        # No optimizer step yet (every step so far skipped its zero gradient:
        # optim.skip_empty_steps). get_state_dict would make the state with a zero-gradient
        # step that counts, leaving the saved and the live optimizer one step ahead.
        fresh_optimizer_state(optimizer)
    tmp, final = paths.checkpoint_tmp(step), paths.checkpoint(step)
    fmt = choose_format(has_sharded_params(model), info.world_size)
    if info.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(info)
    try:
        _write(paths, step, fmt, model, optimizer, trainer_state, rng, info, trainable_only, clock)
        if info.is_main and slow_save_s:
            time.sleep(slow_save_s)  # fault injection: a save that outlives the signal lead
        with clock("wait"):
            barrier(info)  # every rank's files are written before rank 0 completes it
        if info.is_main:
            # Refuses (CheckpointIncompleteError) when the weights are not all there: a
            # directory with COMPLETE but no model must never exist.
            with clock("manifest"):
                write_manifest(tmp, extra={"format": fmt, "world_size": info.world_size})
    except Exception as exc:
        abandon(paths, step, exc, info)
    if info.is_main:
        with clock("complete"):
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            fsync_dir(final.parent)  # the rename is durable before COMPLETE can be
            mark_complete(final, f"{time.time()}\n")
        with clock("prune"):
            prune(paths, keep_last)
    with clock("wait"):
        barrier(info)
    return final


def fresh_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Give an optimizer that never stepped the state its first step starts from: AdamW's
    moments zero and its step count 0, as its own lazy initialisation makes them, so the
    next real step computes exactly what it would have without this (pinned by
    tests/unit/train/state/test_fresh_optimizer_state.py). Made by one step on zero
    gradients at learning rate 0 (the weights do not move, decoupled weight decay
    included), whose count is then set back to 0. Collective under FSDP2: every rank has
    the same (empty) state at the same save."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    lrs = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = torch.tensor(0.0) if isinstance(group["lr"], torch.Tensor) else 0.0
    try:
        optimizer.step()
    finally:
        for group, lr in zip(optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
    for state in optimizer.state.values():
        if isinstance(state.get("step"), torch.Tensor):
            state["step"].zero_()
        elif "step" in state:
            state["step"] = 0


class SaveClock:
    """Seconds per part of a save, added into a dict: ``state`` (the state dicts gathered
    to CPU), ``write`` (serialised and written; a sharded save's fsyncs too), ``fsync``
    (the written files' data waited onto the disk), ``manifest`` (every file's sha256
    read back), ``complete`` (rename, COMPLETE), ``prune`` (older checkpoints deleted),
    ``wait`` (this rank in the save's barriers, waiting for the others)."""

    def __init__(self, into: dict[str, float]) -> None:
        self.into = into

    @contextlib.contextmanager
    def __call__(self, part: str) -> Iterator[None]:
        t = time.monotonic()
        try:
            yield
        finally:
            self.into[part] = self.into.get(part, 0.0) + time.monotonic() - t


def _write(
    paths: RunPaths,
    step: int,
    fmt: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict[str, Any],
    rng: dict[str, Any],
    info: DistInfo,
    trainable_only: bool,
    clock: SaveClock,
) -> None:
    """Every file of the checkpoint into its temp directory (collective)."""
    tmp = paths.checkpoint_tmp(step)
    if fmt == SHARDED:
        with clock("state"):
            model_sd, optim_sd = get_state_dict(
                model, optimizer, options=_options(trainable_only, False)
            )
        check_space(paths, step, state_bytes(model_sd) + state_bytes(optim_sd), info)
        # Each rank writes (and fsyncs) its own shard; rank 0 writes .metadata once all have.
        with clock("write"):
            writer = dcp.FileSystemWriter(tmp / DCP_DIR, sync_files=True)
            dcp.save(
                {"model": model_sd, "optim": optim_sd},
                storage_writer=writer,
                process_group=info.group,  # a split run's trainers alone
            )
    else:
        with clock("state"):
            model_sd, optim_sd = get_state_dict(model, optimizer, options=_options(trainable_only))
        need = state_bytes(model_sd) + state_bytes(optim_sd) if info.is_main else 0
        check_space(paths, step, need, info)
        if info.is_main:
            _save_synced(model_sd, tmp / "model.pt", clock)
            _save_synced(optim_sd, tmp / "optim.pt", clock)
    _save_synced(rng, tmp / f"rng-rank{info.rank}.pt", clock)
    if info.is_main:
        state = {**trainer_state, "world_size": info.world_size}
        _save_synced(state, tmp / "trainer.pt", clock)


def _save_synced(obj: Any, path: Path, clock: SaveClock) -> None:
    """``torch.save``, then wait for the data to reach the disk. A checkpoint is marked
    COMPLETE only after all its files are durable: without the sync, a node that loses
    power can come back with COMPLETE on disk and weights that never were, and the
    gigabytes the page cache still held were written back during the next steps, where an
    fsync of progress.json on the same filesystem could wait behind them."""
    with clock("write"):
        torch.save(obj, path)
    with clock("fsync"):
        fsync_file(path)


def lock_run_dir(paths: RunPaths) -> int:
    """Hold the run directory for this trainer (rank 0) until the process exits; raise
    RunDirBusyError if another trainer holds it. Two trainers on one run directory log every
    step twice, and one's checkpoint rotation deletes the files the other is writing.

    A POSIX record lock (``lockf``), not ``flock``: it belongs to this process alone, so a
    child forked after it (the math-verify worker) does not hold it too. Under ``flock`` a
    child forked while its trainer was being killed kept the lock after the trainer died,
    and the resubmitted trainer refused the run directory (seen in
    tests/e2e/test_resume_exact.py, 2026-11-28). Nothing else in this process opens the
    lock file (closing any descriptor of it would drop a POSIX lock)."""
    fd = os.open(paths.trainer_lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):  # EAGAIN or EACCES, by platform
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RunDirBusyError(
            f"another trainer ({holder}) is training run directory {paths.root}: not starting "
            "a second one (cancel one of the two jobs)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename}".encode(), 0)
    return fd  # kept open: the lock lasts as long as this process


def final_weights_problems(paths: RunPaths, step: int) -> list[str]:
    """Why the run may not report success at ``step``: no complete checkpoint there, or
    one that fails full verification (every file's sha256 against the manifest)."""
    ckpt = paths.checkpoint(step)
    if not is_complete(ckpt):
        return [f"no complete checkpoint at step {step} ({ckpt})"]
    return verify_checkpoint(ckpt)


def pruned(complete: list[int], keep_last: int, protected: set[int]) -> list[int]:
    """The complete checkpoints retention deletes (pure): all but the newest ``keep_last``
    (0 keeps all), never a ``protected`` one (the best evaluation's: keep-best)."""
    old = complete[:-keep_last] if keep_last > 0 else []
    return [s for s in old if s not in protected]


def protected_steps(paths: RunPaths) -> set[int]:
    """Checkpoints retention must keep whatever their age: the model to hand over's and
    the peak's (a collapse rolls back to the peak)."""
    best = read_best(paths.root)
    if best is None:
        return set()
    return {s for s in (best.step, best.peak[1]) if s > 0}


def prune(paths: RunPaths, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` complete checkpoints (but the best one),
    and stale partials."""
    complete = paths.checkpoint_steps()
    for step in pruned(complete, keep_last, protected_steps(paths)):
        shutil.rmtree(paths.checkpoint(step), ignore_errors=True)
    newest = complete[-1] if complete else -1
    for step in paths.checkpoint_steps(complete_only=False):
        if step < newest and step not in complete:
            shutil.rmtree(paths.checkpoint(step), ignore_errors=True)
    for p in paths.checkpoints.glob(".tmp-step-*"):
        shutil.rmtree(p, ignore_errors=True)


def load(
    ckpt: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    info: DistInfo,
    *,
    trainable_only: bool = False,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Restore model and optimizer in place; return (trainer_state, this rank's RNG or None).

    RNG is None when the world size changed: the run continues, but no longer
    bit-identical to an uninterrupted one.
    """
    if format_of(ckpt) == SHARDED:
        _load_sharded(ckpt / DCP_DIR, model, optimizer, trainable_only, info.group)
    else:
        model_sd = torch.load(ckpt / "model.pt", map_location="cpu", weights_only=False)
        optim_sd = torch.load(ckpt / "optim.pt", map_location="cpu", weights_only=False)
        set_state_dict(
            model,
            optimizer,
            model_state_dict=model_sd,
            optim_state_dict=optim_sd,
            options=_options(trainable_only),
        )
    state = torch.load(ckpt / "trainer.pt", map_location="cpu", weights_only=False)
    rng_file = ckpt / f"rng-rank{info.rank}.pt"
    rng = None
    if state.get("world_size") == info.world_size and rng_file.is_file():
        rng = torch.load(rng_file, map_location="cpu", weights_only=False)
    return state, rng


def _load_sharded(
    dcp_dir: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainable_only: bool,
    group: Any = None,
) -> None:
    """Load a DCP checkpoint into this process's model and optimizer, in whatever layout
    they have now (FSDP2 shards of any world size, DDP, or one process): DCP reads each
    tensor's slice that this rank holds from whichever shard files contain it."""
    opts = _options(trainable_only, full=False)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=opts)  # the templates
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, storage_reader=dcp.FileSystemReader(dcp_dir), process_group=group)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=opts,
    )
