"""A checkpoint with no model is never COMPLETE, never resumed from, and `grpo-ckpt verify`
calls it BAD; a run never reports success without its final weights.

The fault guarded against: two trainers on one run directory; one's checkpoint rotation
(prune) deleted the ``.tmp-step-N`` directory the other was still writing; the other then wrote a
manifest of nothing into a re-created directory, renamed it over the good ``step-N`` and
marked it COMPLETE. The tests replay that with the real save and prune functions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grpo_hpc.cli.ckpt import main as ckpt_main
from grpo_hpc.core.manifest import COMPLETE_MARKER, MANIFEST, CheckpointIncompleteError, is_complete
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.train.distributed.dist import DistInfo
from grpo_hpc.train.state import checkpoint


def _save(paths: RunPaths, step: int, slow_save_s: float = 0.0) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    optim = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    optim.step()
    state = {"step": step}
    rng = checkpoint.rng_state()
    return checkpoint.save(
        paths, step, model, optim, state, rng, DistInfo(), keep_last=2, slow_save_s=slow_save_s
    )


@pytest.fixture
def paths(tmp_path: Path) -> RunPaths:
    p = RunPaths(tmp_path / "r")
    p.root.mkdir()
    return p


def test_checkpoint_without_model_never_complete(
    paths: RunPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second trainer's prune deletes the directory a save of step 8 is writing: the save
    fails, no COMPLETE step-8 without a model appears, and the good step-8 is kept."""
    good = _save(paths, 8)
    errors: list[BaseException] = []
    inside, pruned = threading.Event(), threading.Event()

    def held(seconds: float) -> None:  # the save's slow part: held until the prune is done
        inside.set()
        assert pruned.wait(60), "the prune never came"

    # the writer's time.sleep is the fault's slow part (checkpoint's only use of it)
    slow = SimpleNamespace(sleep=held, time=time.time, monotonic=time.monotonic)
    monkeypatch.setattr(checkpoint, "time", slow)

    def slow_writer() -> None:
        try:
            _save(paths, 8, slow_save_s=1.0)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            errors.append(e)

    writer = threading.Thread(target=slow_writer)
    writer.start()
    assert inside.wait(60), "the save never reached its slow part"
    assert (paths.checkpoint_tmp(8) / "trainer.pt").exists()  # mid-save, as in the fault
    checkpoint.prune(paths, keep_last=2)  # what the other trainer's rotation does
    pruned.set()
    writer.join()
    assert len(errors) == 1 and isinstance(errors[0], CheckpointIncompleteError), errors
    assert (good / "model.pt").is_file(), "the good step-8 was replaced by an empty one"
    assert paths.latest_checkpoint() == 8 and is_complete(good)


def test_checkpoint_without_model_is_not_resumed_from(
    paths: RunPaths, capsys: pytest.CaptureFixture
) -> None:
    """What the overlapping attempts left behind: COMPLETE + a manifest listing no files."""
    _save(paths, 6)
    model_gone = _save(paths, 10)
    for step in (7, 8):
        d = paths.checkpoint(step)
        d.mkdir(parents=True)
        (d / MANIFEST).write_text(f'{{"step": {step}, "files": {{}}}}')
        (d / COMPLETE_MARKER).write_text("1\n")
    (model_gone / "model.pt").unlink()
    assert paths.checkpoint_steps() == [6] and paths.latest_checkpoint() == 6
    assert ckpt_main(["verify", str(paths.root)]) == 1
    out = capsys.readouterr().out
    assert "step-7: BAD" in out and "step-8: BAD" in out and "step-10: BAD" in out
    assert "step-6: ok" in out


def test_run_never_succeeds_without_final_weights(paths: RunPaths) -> None:
    assert checkpoint.final_weights_problems(paths, 3) == [
        f"no complete checkpoint at step 3 ({paths.checkpoint(3)})"
    ]
    d = _save(paths, 3)
    assert checkpoint.final_weights_problems(paths, 3) == []
    blob = bytearray((d / "model.pt").read_bytes())
    blob[-1] ^= 1  # same size, other bytes: only the full (sha256) check sees it
    (d / "model.pt").write_bytes(bytes(blob))
    assert is_complete(d)
    assert checkpoint.final_weights_problems(paths, 3) == [
        "model.pt: sha256 differs from the manifest"
    ]


def test_second_trainer_on_one_run_dir_refuses(paths: RunPaths) -> None:
    held = checkpoint.lock_run_dir(paths)
    try:
        code = (
            "import sys; from grpo_hpc.core.paths import RunPaths; "
            "from grpo_hpc.train.state.checkpoint import lock_run_dir; "
            "lock_run_dir(RunPaths(__import__('pathlib').Path(sys.argv[1])))"
        )
        other = subprocess.run(
            [sys.executable, "-c", code, str(paths.root)], capture_output=True, text=True
        )
        assert other.returncode != 0 and "RunDirBusyError" in other.stderr
        assert "another trainer (pid" in other.stderr
    finally:
        os.close(held)


def test_a_child_of_a_dead_trainer_does_not_hold_its_run_dir(paths: RunPaths) -> None:
    """A trainer killed while it forked (its math-verify worker) leaves the child alive for
    a while (here it closes its output, so that this test does not wait for it); the
    resubmitted trainer must get the run directory all the same: the lock is the trainer
    process's own, not shared with what it forked."""
    code = (
        "import os, sys, time; from pathlib import Path; from grpo_hpc.core.paths import "
        "RunPaths; from grpo_hpc.train.state.checkpoint import lock_run_dir\n"
        "lock_run_dir(RunPaths(Path(sys.argv[1])))\n"
        "child = os.fork()\n"
        "if child == 0:\n    os.close(1)\n    os.close(2)\n    time.sleep(60)\n    os._exit(0)\n"
        "print(child, flush=True)\n"
        "os._exit(0)\n"
    )
    trainer = subprocess.run(
        [sys.executable, "-c", code, str(paths.root)], capture_output=True, text=True
    )
    child = int(trainer.stdout.split()[0])
    try:
        os.kill(child, 0)  # the forked child outlives the trainer (the precondition)
        fd = checkpoint.lock_run_dir(paths)  # a flock would still be held by the child
        os.close(fd)
    finally:
        os.kill(child, signal.SIGKILL)


def test_every_file_is_on_disk_before_the_checkpoint_is_marked_complete(
    paths: RunPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A power cut must not leave COMPLETE beside weights the page cache never wrote: the
    real save, with os.fsync recorded (what it syncs is invisible without a power cut)."""
    order: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        order.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    ckpt = _save(paths, 3)
    files = {"model.pt", "optim.pt", "trainer.pt", "rng-rank0.pt"}
    assert files <= set(order), order
    manifest_at = next(i for i, name in enumerate(order) if MANIFEST in name)
    assert all(order.index(f) < manifest_at for f in files), order
    # then the rename into checkpoints/, the marker, and the directory holding the marker
    assert order[-3:] == ["checkpoints", COMPLETE_MARKER, ckpt.name], order


def test_a_filesystem_that_refuses_to_sync_a_directory_does_not_fail_the_save(
    paths: RunPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FUSE mounts and some network filesystems answer EINVAL to fsync on a directory."""
    import errno

    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.EINVAL, "Invalid argument")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert is_complete(_save(paths, 4))


def test_a_checkpoint_pruned_while_it_is_read_is_incomplete_not_an_error(
    paths: RunPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A monitor, grpo-status or a test reads checkpoints while the trainer prunes them
    (training.keep_last). A listed file seen present and gone a moment later made the
    size check raise FileNotFoundError (a split run's test hit it in a fresh clone,
    2026-12-06): now the checkpoint is one with a missing file."""
    ckpt = _save(paths, 2)
    assert is_complete(ckpt) and paths.latest_checkpoint() == 2
    gone = ckpt / "rng-rank0.pt"
    gone.unlink()  # pruned between the look and the size check: the look saw it
    real = Path.is_file
    monkeypatch.setattr(Path, "is_file", lambda p: p == gone or real(p))
    assert not is_complete(ckpt)
    assert paths.latest_checkpoint() is None


def test_checkpoints_read_while_the_trainer_saves_and_prunes(paths: RunPaths) -> None:
    """The real save and prune (keep_last 2) in one thread, the reader's
    ``latest_checkpoint`` in another, side by side: no read raises, and every step it
    returns was saved."""
    done, seen, errors = threading.Event(), set(), []

    def read() -> None:
        while not done.is_set():
            try:
                step = paths.latest_checkpoint()
            except Exception as e:  # noqa: BLE001 (the failure under test)
                errors.append(e)
                return
            if step is not None:
                seen.add(step)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for step in range(1, 31):
            _save(paths, step)
    finally:
        done.set()
        reader.join()
    assert errors == [] and seen and seen <= set(range(1, 31))
    assert paths.checkpoint_steps() == [29, 30]
