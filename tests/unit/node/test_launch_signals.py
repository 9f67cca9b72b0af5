"""NodeLauncher's preemption hook, with a stand-in for torchrun (no Slurm, no torch).

submitit calls ``checkpoint()`` from its SIGUSR2 handler while ``__call__`` waits for
torchrun; the handler runs in the main thread, inside that wait.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import submitit

from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import ProgressRecord, TrainState, write_progress
from grpo_hpc.node import launch
from grpo_hpc.node.launch import NodeLauncher

FAKE_TRAINER = """
import os, sys, time
from grpo_hpc.core.progress import ProgressRecord, TrainState, write_progress
deadline = time.monotonic() + 120
while not os.path.exists(sys.argv[4]):  # busy until the signal has reached the launcher
    if time.monotonic() > deadline:
        sys.exit(99)
    time.sleep(0.01)
state, code = TrainState(sys.argv[2]), int(sys.argv[3])
write_progress(sys.argv[1], ProgressRecord(run="r", state=state, exit_code=code, step=3))
sys.exit(0 if code == 0 else 1)
"""


@pytest.fixture
def restore_signals() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in launch.PREEMPT_SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _launch_with_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str, code: int
) -> tuple[object, list[object]]:
    """Run the launcher on a fake trainer; SIGUSR2 comes while the launcher waits on the
    trainer, handled like submitit. The trainer stays busy until the signal's handler has
    begun (it writes a file the trainer waits for), so the hook always meets a trainer
    that is still running, however loaded the machine."""
    paths = RunPaths(tmp_path / "r")
    paths.root.mkdir()
    write_progress(paths.progress, ProgressRecord(run="r", state=TrainState.INTERRUPTED))
    signalled = tmp_path / "signalled"
    cmd = [
        sys.executable,
        "-c",
        FAKE_TRAINER,
        str(paths.progress),
        state,
        str(code),
        str(signalled),
    ]
    monkeypatch.setattr(launch, "torchrun_command", lambda *a, **k: cmd)
    launcher = NodeLauncher(str(paths.root))
    hooks: list[object] = []

    def submitit_like(signum: int, frame: object) -> None:
        hooks.append("signal")
        assert launcher._proc is not None and launcher._proc.poll() is None  # still busy
        signalled.touch()  # the trainer may now finish
        hooks.append(launcher.checkpoint())
        if hooks[-1] is None:
            raise submitit.core.utils.UncompletedJobError("checkpoint function returned None")

    def signal_while_waiting() -> None:
        # Once the launcher waits on its trainer (a fixed delay from the start raced the
        # launcher's own start-up on a loaded machine: the hook then saw no trainer yet)
        deadline = time.monotonic() + 60
        while not launcher._waiting and time.monotonic() < deadline:
            time.sleep(0.01)
        # (the main thread goes from setting _waiting into the wait within a few bytecodes;
        # this gives it that, it is no hand-over: the trainer waits for the signal)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGUSR2)

    signal.signal(signal.SIGUSR2, submitit_like)
    threading.Thread(target=signal_while_waiting, daemon=True).start()
    try:
        result: object = launcher()
    except launch.TrainingExit as e:
        result = e
    return result, hooks


def test_signal_during_a_finishing_attempt_completes_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_signals: None
) -> None:
    result, hooks = _launch_with_signal(tmp_path, monkeypatch, "finished", 0)
    assert result == 0 and hooks == ["signal"]  # the hook unwound into the wait: no requeue
    assert "exit code:  0 (OK)" in (tmp_path / "r" / "job_summary.txt").read_text()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN  # attempt over: no more hooks


def test_signal_during_a_failing_attempt_fails_with_the_trainers_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_signals: None
) -> None:
    result, hooks = _launch_with_signal(tmp_path, monkeypatch, "failed", 3)
    assert isinstance(result, launch.TrainingExit) and result.code == 3
    assert hooks == ["signal"]


def test_signal_during_an_interrupted_attempt_asks_for_a_requeue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_signals: None
) -> None:
    result, hooks = _launch_with_signal(tmp_path, monkeypatch, "interrupted", 5)
    # The hook waited for the trainer to exit (its record is this attempt's), then asked
    # to be requeued with a fresh launcher; submitit would now requeue and exit.
    _, delayed = hooks
    assert isinstance(delayed, submitit.helpers.DelayedSubmission)
    assert delayed.function == NodeLauncher(str(tmp_path / "r"))
    assert isinstance(result, launch.TrainingExit) and result.code == 5


def test_the_trainer_gets_the_flight_recorder_and_the_profiles_env_wins(tmp_path: Path) -> None:
    """NCCL's flight recorder is on in every job, dumping into the run directory; a value
    the profile's env: set (the job's environment) is not overridden."""
    from grpo_hpc.node.launch import trainer_env

    paths = RunPaths(tmp_path / "r")
    env = trainer_env({"PATH": "/bin", "TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}, paths, "77")
    assert env["GRPO_HPC_JOB_ID"] == "77" and env["PATH"] == "/bin"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "50"
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000"  # the newer torch's name, set as well
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "r" / "nccl_trace" / "rank_")
