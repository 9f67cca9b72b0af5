"""``optim.state=int8`` (torchao's AdamW8bit) through the real trainer: two FSDP2 processes
train with int8 moments, save sharded checkpoints, and a run resumed from one continues
exactly: every rank's state after the load equals its digest at the save, and the step-4
weights equal those the run had before it was rewound, bit for bit (CPU, deterministic).
A model that does not shard evenly is refused with one line (before torchao is imported).

torchao is in the test extra (setup.cfg): the training test imports it and fails where it
is missing (a broken test install), never skips."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.common import build_model
from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.progress import read_progress
from grpo_hpc.train.state import state_digest

from .helpers import make_run, train

STEPS = [
    "dist.strategy=fsdp",
    "optim.state=int8",
    "training.max_steps=4",
    "training.save_every_steps=2",
    "faults.enabled=true",
    "faults.state_digest=true",
]


def _gathered(dcp_dir: Path, out: Path) -> dict:
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(dcp_dir, out)
    return torch.load(out, weights_only=False)


@pytest.mark.slow
def test_int8_moments_train_save_and_resume_exactly(tmp_path: Path) -> None:
    import torch
    import torchao.optim  # noqa: F401  (the test extra's: the trainer's ranks import it)

    model = tmp_path / "model"  # a Llama whose every dimension splits over two ranks
    build_model(model, "tiny")
    paths = make_run(tmp_path, "run", *STEPS, f"model.name_or_path={model}", nproc=2)
    first = train(paths, nproc=2, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "[Optim] optim.state=int8: torchao.optim" in first.stdout  # AdamW8bit ran
    shutil.copytree(paths.checkpoint(4) / "dcp", tmp_path / "uninterrupted-step4")
    from grpo_hpc.submit.job import rewind

    rewind(paths, 2)  # drop step 4, resume from the sharded step-2 checkpoint
    again = train(paths, nproc=2, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    n, bad = state_digest.compare_folder(paths.root / "state_digest")
    assert n == 2 and bad == [], bad  # both ranks loaded exactly what they saved
    # DCP writes the int8 moments dequantized (fp32: a checkpoint as large as fp32 moments');
    # the load quantizes them again, exactly (the digests above)
    a = _gathered(tmp_path / "uninterrupted-step4", tmp_path / "a.pt")
    b = _gathered(paths.checkpoint(4) / "dcp", tmp_path / "b.pt")
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
