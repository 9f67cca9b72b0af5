"""A decode thread alive but stuck (``rollout.placement=thread``): the thread that generates
ahead stops making progress (``faults.stuck_generation_at_step``: it sleeps for ever as it
starts a batch) while the main thread waits for its batches. Nothing in the process beat a
heartbeat then and nothing ended the wait (only a monitor's heartbeat limit would, unnamed,
by cancelling the job); now the main thread judges the thread's progress
(``rollout.progress_timeout_s``) and the run ends as STALLED, naming the thread, its rank
and host; the resume from the last checkpoint ends equal, bit for bit, to an uninterrupted
run. A split run's stuck generator is tests/e2e/test_async_split.py's."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState, read_progress
from grpo_hpc.train.supervision.liveness import HOST

from ..slowdown import guard
from .helpers import assert_same, make_run, train, training
from .test_resume_exact import _final_state

pytestmark = pytest.mark.slow
MAX_STEPS = 8
STEPS = [
    f"training.max_steps={MAX_STEPS}",
    "training.save_every_steps=2",
    "training.keep_last=1",
    "algo.max_staleness=1",
]
STUCK_AT = 5
"""The batch (0-based step, as ``faults.*`` count) that is never made: step 6's, generated
while step 5 trains, after the checkpoint of step 4. progress.json stays at step 4: a step
is reported only once the batches generated beside it were received."""
PROGRESS_LIMIT_S = 10
"""The test's ``rollout.progress_timeout_s`` (the least allowed)."""
STUCK = [
    "faults.enabled=true",
    f"faults.stuck_generation_at_step={STUCK_AT}",
    f"rollout.progress_timeout_s={PROGRESS_LIMIT_S}",
]
"""The overrides of a run whose generation gets stuck at batch ``STUCK_AT``."""
STUCK_ENDS_S = 120
"""How long the stuck run may take to end once step 4 was recorded: step 5's update, the
limit, a look or two (every 2 s) and the exit (torchrun's teardown under the split),
measured at 10.3 s (thread) and 13.4 s (split); the detection off
(``rollout.progress_timeout_s=0``) both were still waiting at 90 s."""


def until_stalled(run: RunPaths, result: Callable[[], subprocess.CompletedProcess]) -> tuple:
    """Inside ``training(run)``: wait for the step before the stuck batch to be recorded,
    then for the run's end; (its result, seconds from that step to the end)."""
    deadline = time.monotonic() + guard(180)
    while (rec := read_progress(run.progress)) is None or rec.step < STUCK_AT - 1:
        assert time.monotonic() < deadline, f"the run never reached step {STUCK_AT - 1}"
        time.sleep(0.05)
    reached = time.monotonic()
    done = result()
    return done, time.monotonic() - reached


def check_stalled_then_resume(
    run: RunPaths, done: subprocess.CompletedProcess, ended: float, said: str, waited: str,
    nproc: int,
) -> None:  # fmt: skip
    """The run ended STALLED in time, at the last step before the stuck batch, its reason
    ``said`` (who), how long, and ``waited`` (what for); resumed from the step-4 checkpoint
    with the fault off, it trains to the end."""
    print(f"the stuck run ended {ended:.1f} s after step {STUCK_AT - 1} was recorded")
    assert done.returncode == ExitCode.STALLED, done.stderr[-3000:]
    assert ended < guard(STUCK_ENDS_S)
    rec = read_progress(run.progress)
    assert rec.state == TrainState.FAILED and rec.step == STUCK_AT - 1, rec
    assert rec.reason.startswith(said), rec.reason
    idle_s = float(rec.reason[len(said) :].split()[0])
    assert PROGRESS_LIMIT_S <= idle_s < PROGRESS_LIMIT_S + 10, rec.reason
    assert waited in rec.reason, rec.reason
    assert run.latest_checkpoint() == 4
    # the resume, the fault off (the generation would hang at the same batch again)
    text = run.config.read_text()
    assert f"stuck_generation_at_step: {STUCK_AT}" in text
    off = text.replace(f"stuck_generation_at_step: {STUCK_AT}", "stuck_generation_at_step: -1")
    run.config.write_text(off)
    resumed = train(run, nproc)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert read_progress(run.progress).step == MAX_STEPS


def test_a_stuck_decode_thread_is_caught_and_resumes_bit_exact(tmp_path: Path) -> None:
    reference = make_run(tmp_path, "reference", *STEPS)
    run = make_run(tmp_path, "stuck", *STEPS, *STUCK)
    with training(reference) as reference_result:  # beside it: nothing shared
        with training(run, timeout=240) as result:
            done, ended = until_stalled(run, result)
        assert reference_result().returncode == 0
    said = f"the decode thread (rank 0 on {HOST}) made no progress for "
    check_stalled_then_resume(
        run, done, ended, said, f"waited for step {STUCK_AT + 1}'s rollouts", 1
    )
    assert_same(_final_state(reference, MAX_STEPS), _final_state(run, MAX_STEPS))
