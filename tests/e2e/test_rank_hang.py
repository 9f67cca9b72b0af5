"""A rank that stops answering ends the job within dist.peer_timeout_s, on the real
trainer's two ranks (forked as torchrun starts them: trainer_fork.py): rank 1 is SIGSTOPped
mid-run, as a hung GPU process would be; rank 0 is then waiting in a collective that would
otherwise block for the process group's 30 minutes. The job must end by itself, recording
who stopped and exit 4 (resubmit)."""

from __future__ import annotations

import os
import pickle
import signal
import time
from pathlib import Path

import pytest

from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.progress import TrainState, read_progress
from grpo_hpc.train.supervision.liveness import PULSE_S
from tests.e2e.helpers import make_run, training

pytestmark = pytest.mark.slow
TIMEOUT_S = 10


def _pid_of(paths, rank: int, deadline_s: float = 120) -> int:
    """The rank's pid from its pulse file (``alive/<launch>/rank<R>``: ``<pid> <counter>``)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for f in paths.alive_dir.glob(f"*/rank{rank}"):
            return int(f.read_text().split()[0])
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} never pulsed")


def _wait_step(paths, step: int, deadline_s: float = 180) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        rec = read_progress(paths.progress)
        if rec is not None and rec.step >= step:
            return
        time.sleep(0.2)
    raise AssertionError(f"the run never reached step {step}")


def test_a_stopped_rank_ends_the_job_within_the_peer_timeout(tmp_path: Path) -> None:
    paths = make_run(
        tmp_path,
        "hang",
        "training.max_steps=40",
        "faults.enabled=true",
        "faults.step_sleep=1",
        f"dist.peer_timeout_s={TIMEOUT_S}",
        nproc=2,
    )
    with training(paths, nproc=2, timeout=240) as result:
        victim = _pid_of(paths, 1)
        _wait_step(paths, 2)
        os.kill(victim, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            done = result()
        finally:
            try:
                os.kill(victim, signal.SIGKILL)  # the launcher should have; never leave it
            except ProcessLookupError:
                pass
        ended_after = time.monotonic() - t0
        print(f"the job ended {ended_after:.1f} s after rank 1 was stopped")
    assert done.returncode == ExitCode.STALLED, done.stderr[-2000:]
    rec = read_progress(paths.progress)
    assert rec.state == TrainState.FAILED and rec.exit_code == ExitCode.STALLED
    assert rec.reason.startswith(f"rank 1 stopped answering (no pulse for {TIMEOUT_S} s)")
    # where rank 0 was blocked, from its flight recorder (gloo here, NCCL on GPUs)
    assert "; the others waited in gloo:" in rec.reason and ".py:" in rec.reason, rec.reason
    assert rec.step < 40
    # the pulse's timeout (counted from the last pulse seen, up to a pulse or two before the
    # stop), then the watcher kills the stopped rank (same host): no 30 s SIGTERM grace. The
    # upper bound leaves a loaded machine a minute for the launcher's teardown: the hang it
    # guards against is the process group's 30 minutes
    assert TIMEOUT_S - 2 * PULSE_S <= ended_after < TIMEOUT_S + 60, ended_after
    assert "rank 0: rank 1 stopped answering" in done.stderr
    # the watcher dumped the flight recorder: which collectives rank 0 was waiting in
    trace = paths.nccl_trace / "rank_0"
    assert trace.is_file(), sorted(paths.root.iterdir())
    entries = pickle.loads(trace.read_bytes()).get("entries", [])
    print(f"flight recorder: {len(entries)} entries, last {entries[-1] if entries else None}")
    assert f"(flight recorder: {trace})" in done.stderr
