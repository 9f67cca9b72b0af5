"""The progress file: a heartbeat written atomically, synced to the disk only when terminal.

An fsync of a small file waits for the filesystem's journal commit, which also writes out
whatever the kernel's flusher allocated meanwhile; rewritten twice a step and on every
generation heartbeat, it stalled a real run's steps. The atomic rename alone
keeps readers from seeing half a record; that is checked here on the real filesystem.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grpo_hpc.core import fsutil
from grpo_hpc.core.progress import ProgressRecord, TrainState, read_progress, write_progress


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The file descriptors os.fsync was called with (the call still goes through)."""
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(fsutil.os, "fsync", counting)
    return calls


@pytest.mark.parametrize("state", [s for s in TrainState if not s.terminal])
def test_a_running_state_is_written_without_fsync(
    tmp_path: Path, fsyncs: list[int], state: TrainState
) -> None:
    path = tmp_path / "progress.json"
    record = ProgressRecord(run="r", state=state, step=7, heartbeat=1.5)
    write_progress(path, record)
    assert fsyncs == []
    assert read_progress(path) == record


@pytest.mark.parametrize("state", [s for s in TrainState if s.terminal])
def test_a_terminal_state_is_synced(tmp_path: Path, fsyncs: list[int], state: TrainState) -> None:
    write_progress(tmp_path / "progress.json", ProgressRecord(run="r", state=state))
    assert len(fsyncs) == 1


def test_unsynced_writes_still_replace_atomically(tmp_path: Path) -> None:
    """Many unsynced rewrites leave one whole record and no temp file behind."""
    path = tmp_path / "progress.json"
    for step in range(50):
        write_progress(path, ProgressRecord(run="r", state=TrainState.TRAINING, step=step))
    assert read_progress(path).step == 49
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress.json"]


def test_the_writer_never_makes_the_caller_wait_for_a_slow_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write held up (as a rename behind a journal commit is) does not hold up ``put`` of
    running states; the newest record replaces any that waited; a terminal record is
    written, after the others, before its ``put`` returns."""
    import threading

    from grpo_hpc.core import progress

    path = tmp_path / "progress.json"
    gate, inside, written = threading.Event(), threading.Event(), []
    real = progress.write_progress

    def slow(p: Path, record: ProgressRecord) -> None:
        inside.set()
        gate.wait(10)
        real(p, record)
        written.append(record.step)

    monkeypatch.setattr(progress, "write_progress", slow)
    writer = progress.ProgressWriter(path)
    writer.put(ProgressRecord(run="r", state=TrainState.GENERATING, step=1))
    assert inside.wait(10)  # the first write is under way, and held
    for step in range(2, 6):  # each put returns while that write is still held
        writer.put(ProgressRecord(run="r", state=TrainState.GENERATING, step=step))
    assert read_progress(path) is None  # nothing on disk yet: the caller did not wait
    gate.set()
    writer.put(ProgressRecord(run="r", state=TrainState.FINISHED, step=6))
    assert written[0] == 1 and written[-1] == 6 and len(written) <= 3  # 2-4 replaced
    assert read_progress(path).state is TrainState.FINISHED


def test_a_failed_background_write_is_raised_in_the_callers_thread(tmp_path: Path) -> None:
    """A write that fails (here: the run directory is a file) is not lost in the thread:
    the next ``put`` raises it, as a synchronous write did."""
    from grpo_hpc.core.progress import ProgressWriter

    blocker = tmp_path / "run"
    blocker.write_text("not a directory")
    writer = ProgressWriter(blocker / "progress.json")
    writer.put(ProgressRecord(run="r", state=TrainState.TRAINING, step=1))
    with pytest.raises(OSError):
        writer.flush()
    with pytest.raises(OSError):
        writer.put(ProgressRecord(run="r", state=TrainState.FAILED, step=1))


def test_lines_wait_neither_and_land_in_order_before_a_terminal_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Metrics lines queued while a write is held do not hold up the caller either; they
    land in the order queued, each file in one append, all of them before a terminal
    record's ``put`` returns (the last step's row is on disk when the run says FINISHED)."""
    import threading

    from grpo_hpc.core import progress

    gate, inside = threading.Event(), threading.Event()
    real = progress.append_text

    def slow(p: Path, text: str) -> None:
        inside.set()
        gate.wait(10)
        real(p, text)

    monkeypatch.setattr(progress, "append_text", slow)
    metrics, samples = tmp_path / "metrics.jsonl", tmp_path / "samples.jsonl"
    writer = progress.ProgressWriter(tmp_path / "progress.json")
    writer.append(metrics, '{"step": 1}\n')
    assert inside.wait(10)  # the first append is under way, and held
    for step in range(2, 5):
        writer.append(metrics, f'{{"step": {step}}}\n')
        writer.append(samples, f'{{"sample": {step}}}\n')
    assert not metrics.exists()  # nothing written yet: the caller did not wait
    gate.set()
    writer.put(ProgressRecord(run="r", state=TrainState.FINISHED, step=4))
    assert metrics.read_text().splitlines() == [f'{{"step": {s}}}' for s in range(1, 5)]
    assert samples.read_text().splitlines() == [f'{{"sample": {s}}}' for s in range(2, 5)]
    assert read_progress(tmp_path / "progress.json").state is TrainState.FINISHED


def test_the_tracker_writes_its_rows_and_console_lines_through_the_thread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rank 0's tracker: a step's metrics row and console line are written by the time
    ``flush`` returns; another rank writes nothing."""
    from grpo_hpc.config.schema import Config
    from grpo_hpc.core.paths import RunPaths
    from grpo_hpc.train.measure.tracking import Tracker, step_metrics

    paths = RunPaths(tmp_path / "run")
    m = step_metrics(1, Config(), [2.0, 4.0, 100.0, 1.0, 2.0], [], 1) | {"loss": 0.5}
    rank1 = Tracker(paths, Config(), is_main=False)
    rank1.log_step(m)
    rank1.flush()
    assert not paths.metrics.exists()
    tracker = Tracker(paths, Config(), is_main=True)
    tracker.log_step(m)
    tracker.log_eval(1, 0.25, 1, 4, 0.25, 3.0)
    tracker.flush()
    rows = fsutil.read_jsonl(paths.metrics)
    assert [r["step"] for r in rows] == [1, 1] and rows[0]["loss"] == 0.5
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[Step 1") and out[1].startswith("[Eval] step 1: greedy accuracy")
