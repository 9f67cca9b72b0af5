"""training.save_every_seconds: the real trainer checkpoints on elapsed time alone (step
saving off), never more often than the interval, and always at the last step."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_hpc.core.progress import TrainState, read_progress
from tests.e2e.helpers import make_run, train


@pytest.mark.slow
def test_time_based_checkpoints(tmp_path: Path) -> None:
    paths = make_run(
        tmp_path,
        "timed",
        "training.max_steps=6",
        "training.save_every_steps=0",
        "training.save_every_seconds=1.0",
        "training.keep_last=20",
        "faults.enabled=true",
        # each step takes over 0.6 s (longer on a loaded machine, never shorter), so a
        # save is due again at most two steps after the last one ended: time-based saves by
        # step 2 and by step 4 at the latest, before the final one at step 6
        "faults.step_sleep=0.6",
    )
    result = train(paths)
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_progress(paths.progress).state == TrainState.FINISHED
    steps = paths.checkpoint_steps()
    # at least two saves before the end, on time alone (step saving is off), and the last
    assert steps[-1] == 6 and len(steps) >= 3 and steps[1] <= 4, steps
    done = [float((paths.checkpoint(s) / "COMPLETE").read_text()) for s in steps[:-1]]
    gaps = [b - a for a, b in zip(done, done[1:], strict=False)]
    assert gaps and all(g >= 1.0 for g in gaps), gaps  # not more often than every second
