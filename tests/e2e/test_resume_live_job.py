"""``grpo-submit --resume RUN`` while RUN's job is still live refuses (local executor, real
process): two trainers on one run directory logged every step twice and overwrote each
other's checkpoints. The Slurm version is in tests/integration/test_resume_intent_slurm.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.fsutil import append_jsonl, read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import ProgressRecord, TrainState, read_progress, write_progress
from grpo_hpc.monitor.attempts import Effects, LiveJobError, live_job, refuse_if_live
from tests.conftest import REPO, run_cli

from ..slowdown import guard
from .helpers import env, launch, make_run, signal_job, torchrun_cmd

LONG_RUN = ["training.max_steps=1000", "faults.enabled=true", "faults.step_sleep=1"]


def _snapshot(paths: RunPaths) -> dict[str, object]:
    """What a resubmission writes: job history, events, lock, submitit job folders."""
    return {
        "jobs": paths.jobs.read_text(),
        "events": paths.events.read_text() if paths.events.exists() else None,
        "lock": paths.monitor_lock.exists(),
        # a submission adds a folder named after its job id (the running job's own
        # controller writes under a literal "%j")
        "submitit": sorted(p.name for p in paths.submitit_dir.iterdir() if p.name.isdigit()),
    }


def _submit_no_wait(logs: Path, *args: str) -> None:
    """grpo-submit with its output in a file: the local job inherits the submitter's
    stdout, so captured pipes would stay open (and the call blocked) until the job ends."""
    log = logs.parent / "submit.log"
    code = "import sys; from grpo_hpc.cli.submit import main; sys.exit(main(sys.argv[1:]))"
    with open(log, "w") as out:
        cmd = [sys.executable, "-c", code, *args]
        proc = subprocess.run(
            cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, timeout=guard(120)
        )
    assert proc.returncode == 0, log.read_text()


@pytest.mark.slow
def test_resume_refuses_while_job_live(logs_dir: Path) -> None:
    args = ["--profile", "local", "--config", "tiny", "--name", "r", "--no-wait"]
    _submit_no_wait(logs_dir, *args, "training.num_threads=1", *LONG_RUN)
    paths = RunPaths(logs_dir / "r")
    pid = str(read_jsonl(paths.jobs)[0]["job_id"])
    try:
        before = _snapshot(paths)
        result = run_cli("grpo_hpc.cli.submit:main", "--resume", "r")
        assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout + result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("grpo-submit: error:"), result.stderr
        assert f"live job {pid}" in lines[0] and f"kill {pid}" in lines[0]
        assert _snapshot(paths) == before, "a refused --resume wrote to the run directory"
    finally:
        signal_job(int(pid), signal.SIGKILL)
    deadline = time.time() + 120  # a poll with a deadline only a stuck job misses
    while live_job(paths) is not None and time.time() < deadline:
        time.sleep(0.2)
    assert live_job(paths) is None, "the killed job still counts as live"


def test_unrelated_process_with_a_recorded_pid_is_not_live(tmp_path: Path) -> None:
    """A local job's pid reused by another process (days later) does not block a resume."""
    paths = RunPaths(tmp_path / "r")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        append_jsonl(paths.jobs, {"job_id": str(other.pid), "executor": "local"})
        assert live_job(paths) is None
        assert other.poll() is None  # the pid was alive all along: the case under test
    finally:
        other.kill()
        other.wait()


def _slurm_run(tmp_path: Path, state: str) -> RunPaths:
    paths = RunPaths(tmp_path / "r")
    append_jsonl(paths.jobs, {"job_id": "7", "executor": "slurm"})
    write_progress(paths.progress, ProgressRecord(run="r", state=TrainState(state), job_id="7"))
    return paths


def test_resume_waits_for_a_job_that_is_only_ending(tmp_path: Path) -> None:
    """``--wait`` returns when the trainer recorded its outcome; squeue still lists the job
    (COMPLETING) for a moment: a resume then waits for it to leave instead of refusing."""
    paths = _slurm_run(tmp_path, "finished")
    polls = iter([{"7"}, {"7"}, set()])
    slept: list[float] = []
    fx = Effects(queued_job_ids=lambda: next(polls), sleep=slept.append)
    refuse_if_live(paths, fx)
    assert len(slept) == 2


def test_resume_refuses_a_running_trainer_at_once(tmp_path: Path) -> None:
    paths = _slurm_run(tmp_path, "training")
    slept: list[float] = []
    fx = Effects(queued_job_ids=lambda: {"7"}, sleep=slept.append)
    with pytest.raises(LiveJobError, match="live job 7 .*scancel 7"):
        refuse_if_live(paths, fx)
    assert slept == []


@pytest.mark.slow
def test_second_trainer_on_one_run_dir_exits_untouched(tmp_path: Path) -> None:
    """Whatever started it (a person's torchrun, a duplicate job): a second trainer on a run
    directory another trainer holds exits 2 at once and leaves the first one's progress.
    The first is forked from the test's trainer server (tests/e2e/trainer_fork.py: a
    trainer holding the directory, ~7 s of CPU less than under torchrun); the second goes
    through the real torchrun."""
    paths = make_run(tmp_path, "r", *LONG_RUN)
    with open(os.devnull, "w") as null:
        first = launch(paths, 1, null, null)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            rec = read_progress(paths.progress)
            if rec is not None and rec.step >= 1:
                break
            assert first.poll() is None, "the first trainer exited"
            time.sleep(0.2)
        before = read_progress(paths.progress)
        second = subprocess.run(
            torchrun_cmd(paths, 1), capture_output=True, text=True, env=env(), timeout=guard(120)
        )
        assert second.returncode != 0 and "another trainer (pid" in second.stderr
        after = read_progress(paths.progress)
        assert after.attempt == before.attempt and not after.state.terminal, after
        assert first.poll() is None, "the first trainer was disturbed"
    finally:
        signal_job(first.pid, signal.SIGKILL)
        first.wait()
