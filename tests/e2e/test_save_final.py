"""training.save_final=false (benchmarks that only time steps): the real trainer finishes
with exit 0 and writes no checkpoint at all; by default the last step is always saved."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_hpc.progress import TrainState, read_progress
from tests.e2e.helpers import make_run, train


@pytest.mark.parametrize(("save_final", "steps"), [("false", []), ("true", [2])])
def test_final_checkpoint_follows_save_final(
    tmp_path: Path, save_final: str, steps: list[int]
) -> None:
    paths = make_run(
        tmp_path,
        f"final-{save_final}",
        "training.max_steps=2",
        "training.save_every_steps=0",
        f"training.save_final={save_final}",
    )
    result = train(paths)
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_progress(paths.progress).state == TrainState.FINISHED
    assert paths.checkpoint_steps() == steps
