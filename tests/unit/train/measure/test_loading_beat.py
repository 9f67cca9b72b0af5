"""The tracker's loading beat: progress.json's heartbeat advances while the state is
LOADING, and never once the trainer has moved on (the loop's own beats judge it then)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from grpo_hpc.config.schema import Config
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState, read_progress
from grpo_hpc.train.measure.tracking import Tracker

EVERY_S = 0.05


def tracker(tmp_path: Path, is_main: bool = True) -> Tracker:
    paths = RunPaths(tmp_path / "run")
    paths.root.mkdir()
    return Tracker(paths, Config(), is_main)


def heartbeat_after(t: Tracker, seconds: float) -> float:
    time.sleep(seconds)
    t.flush()
    record = read_progress(t.paths.progress)
    assert record is not None
    return record.heartbeat


def beat_threads() -> list[threading.Thread]:
    return [th for th in threading.enumerate() if th.name == "grpo-loading-beat"]


def test_heartbeat_advances_while_loading(tmp_path: Path) -> None:
    t = tracker(tmp_path)
    t.update(TrainState.LOADING)
    t.beat_while_loading(EVERY_S)
    try:
        first = heartbeat_after(t, 4 * EVERY_S)
        later = heartbeat_after(t, 4 * EVERY_S)
        assert later > first
        assert read_progress(t.paths.progress).state is TrainState.LOADING
    finally:
        t.finish()
    assert not beat_threads()


def test_the_beat_ends_when_the_trainer_leaves_loading(tmp_path: Path) -> None:
    t = tracker(tmp_path)
    t.update(TrainState.LOADING)
    t.beat_while_loading(EVERY_S)
    t.update(TrainState.GENERATING)  # a hang from here on must show as an old heartbeat
    assert not beat_threads()
    stopped = heartbeat_after(t, 0)
    assert heartbeat_after(t, 6 * EVERY_S) == stopped
    t.finish()


def test_the_beat_ends_when_setup_fails(tmp_path: Path) -> None:
    t = tracker(tmp_path)
    t.update(TrainState.LOADING)
    t.beat_while_loading(EVERY_S)
    t.stop_loading_beat()  # what Trainer.setup does when loading raises
    assert not beat_threads()
    stopped = heartbeat_after(t, 0)
    assert heartbeat_after(t, 6 * EVERY_S) == stopped
    t.finish()


def test_only_rank0_beats(tmp_path: Path) -> None:
    t = tracker(tmp_path, is_main=False)
    t.update(TrainState.LOADING)
    t.beat_while_loading(EVERY_S)
    assert not beat_threads()
    assert read_progress(t.paths.progress) is None


def test_a_write_that_failed_in_the_beat_is_raised_by_the_next_update(tmp_path: Path) -> None:
    """A full or broken disk is the trainer's error, not a thread's silent end."""
    t = tracker(tmp_path)
    t.paths.progress.mkdir()  # every write of progress.json fails
    t.update(TrainState.LOADING)  # queued; its write fails in the writer's thread
    t.beat_while_loading(EVERY_S)
    deadline = time.monotonic() + 30
    while beat_threads() and time.monotonic() < deadline:  # the beat takes the error, ends
        time.sleep(EVERY_S)
    assert not beat_threads()
    with pytest.raises(OSError):
        t.update(TrainState.GENERATING)
