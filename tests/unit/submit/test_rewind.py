"""grpo-submit --resume RUN --from-step N: choose the checkpoint the next attempt starts from."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_hpc.core.errors import ConfigError
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.submit.job import rewind
from tests.conftest import make_checkpoint as _ckpt


def test_rewind_sets_newer_checkpoints_aside(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    for step in (2, 4, 6):
        _ckpt(paths, step)
    _ckpt(paths, 8, complete=False)
    assert rewind(paths, 4) == [6, 8]
    assert paths.latest_checkpoint() == 4
    kept = sorted(p.name for p in paths.checkpoints.iterdir() if p.name.startswith(".set-aside"))
    assert len(kept) == 2 and kept[0].endswith("step-6")  # nothing deleted


def test_rewind_to_missing_step_lists_the_complete_ones(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    _ckpt(paths, 2)
    _ckpt(paths, 4, complete=False)
    with pytest.raises(ConfigError, match=r"no complete checkpoint at step 4 \(complete: 2\)"):
        rewind(paths, 4)
    assert paths.checkpoint(4).is_dir()
