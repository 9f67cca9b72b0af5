"""training.save_final=false (benchmarks that only time steps): the real trainer finishes
with exit 0 and writes no checkpoint at all (the default, saving the last step, is what
every other end-to-end test checks)."""

from __future__ import annotations

from pathlib import Path

from grpo_hpc.core.progress import TrainState, read_progress
from tests.e2e.helpers import make_run, train


def test_no_final_checkpoint_when_save_final_is_false(tmp_path: Path) -> None:
    paths = make_run(
        tmp_path,
        "no-final",
        "training.max_steps=2",
        "training.save_every_steps=0",
        "training.save_final=false",
    )
    result = train(paths)
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_progress(paths.progress).state == TrainState.FINISHED
    assert paths.checkpoint_steps() == []
