"""``optim.state=int8`` (torchao's AdamW8bit) through the real trainer: two FSDP2 processes
train with int8 moments, save sharded checkpoints, and a run resumed from one continues
exactly: every rank's state after the load equals its digest at the save, and the final
weights equal an uninterrupted run's, bit for bit (CPU, deterministic). A model that does
not shard evenly is refused with one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.common import build_model
from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import read_progress
from grpo_hpc.train import state_digest

from .helpers import make_run, train

pytest.importorskip("torchao.optim")  # the lowmem extra; CI installs it with the test extra

STEPS = [
    "dist.strategy=fsdp",
    "optim.state=int8",
    "training.max_steps=4",
    "training.save_every_steps=2",
    "faults.enabled=true",
    "faults.state_digest=true",
]


def _final(paths: RunPaths) -> dict:
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = paths.root / "final-state.pt"
    dcp_to_torch_save(paths.checkpoint(4) / "dcp", out)
    return torch.load(out, weights_only=False)


@pytest.mark.slow
def test_int8_moments_train_save_and_resume_exactly(tmp_path: Path) -> None:
    import torch

    model = tmp_path / "model"  # a Llama whose every dimension splits over two ranks
    build_model(model, "tiny")
    steps = [*STEPS, f"model.name_or_path={model}"]
    whole = make_run(tmp_path, "whole", *steps, nproc=2)
    resumed = make_run(tmp_path, "resumed", *steps, nproc=2)
    for paths in (whole, resumed):
        result = train(paths, nproc=2, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "[Optim] optim.state=int8: torchao.optim" in result.stdout  # AdamW8bit ran
    from grpo_hpc.submit.job import rewind

    rewind(resumed, 2)  # drop step 4, resume from the sharded step-2 checkpoint
    again = train(resumed, nproc=2, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    n, bad = state_digest.compare_folder(resumed.root / "state_digest")
    assert n == 2 and bad == [], bad  # both ranks loaded exactly what they saved
    # DCP writes the int8 moments dequantized (fp32: a checkpoint as large as fp32 moments');
    # the load quantizes them again, exactly (the digests above)
    a, b = _final(whole), _final(resumed)
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def test_uneven_shards_are_refused_in_one_line(tmp_path: Path) -> None:
    """The tiny preset's character vocabulary (103 rows) does not split over two ranks."""
    paths = make_run(tmp_path, "uneven", *STEPS, nproc=2)
    result = train(paths, nproc=2, timeout=300)
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stderr[-3000:]
    rec = read_progress(paths.progress)
    assert rec is not None and "optim.state=int8 under FSDP2" in (rec.reason or "")
    assert "103 rows" in rec.reason and "optim.state=fp32" in rec.reason
