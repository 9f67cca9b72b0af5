"""FSDP2 sharded (DCP) checkpoints resumed on another world size: two processes save,
one process (and, by DCP's resharding, any other count) resumes and finishes the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_hpc.core.manifest import verify_checkpoint
from grpo_hpc.core.progress import TrainState, read_progress
from grpo_hpc.train.state.checkpoint import GATHERED, SHARDED, format_of

from .helpers import assert_same, make_run, train

STEPS = ["dist.strategy=fsdp", "training.max_steps=4", "training.save_every_steps=2"]


@pytest.mark.slow
def test_two_process_sharded_checkpoint_resumes_in_one_process(tmp_path: Path) -> None:
    paths = make_run(tmp_path, "fsdp", *STEPS, nproc=2)
    first = train(paths, nproc=2)
    assert first.returncode == 0, first.stderr[-3000:]
    assert [format_of(paths.checkpoint(s)) for s in (2, 4)] == [SHARDED, SHARDED]
    assert verify_checkpoint(paths.checkpoint(4)) == []

    # Drop the last checkpoint and go on with one process from the sharded step-2 one.
    from grpo_hpc.submit.job import rewind

    rewind(paths, 2)
    paths.config.write_text(
        paths.config.read_text().replace("nproc_per_node: 2", "nproc_per_node: 1")
    )
    second = train(paths, nproc=1)
    assert second.returncode == 0, second.stderr[-3000:]
    rec = read_progress(paths.progress)
    assert rec is not None and rec.state is TrainState.FINISHED
    assert (rec.step, rec.start_step, rec.restarts) == (4, 2, 1)
    # One process has nothing to shard: its checkpoint is gathered again.
    ckpt = paths.checkpoint(4)
    assert format_of(ckpt) == GATHERED and verify_checkpoint(ckpt) == []
    assert json.loads((ckpt / "manifest.json").read_text())["world_size"] == 1


@pytest.mark.slow
def test_keeping_layers_gathered_changes_no_bit_of_the_training(tmp_path: Path) -> None:
    """dist.reshard_after_forward=false only keeps FSDP2's gathered layers from forward to
    backward (one all-gather fewer): two real 2-process runs, with and without it, end
    with the same weights and optimizer state, bit for bit."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    steps = ["dist.strategy=fsdp", "training.max_steps=2", "training.save_every_steps=2"]
    runs = {
        flag: make_run(
            tmp_path, f"reshard-{flag}", *steps, f"dist.reshard_after_forward={flag}", nproc=2
        )  # fmt: skip
        for flag in ("true", "false")
    }
    states = {}
    for flag, paths in runs.items():
        result = train(paths, nproc=2)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "reshard_after_forward: " + flag in paths.config.read_text()
        out = tmp_path / f"{flag}.pt"  # the sharded checkpoint gathered into one file
        dcp_to_torch_save(paths.checkpoint(2) / "dcp", out)
        states[flag] = torch.load(out, weights_only=False)
    a, b = states["true"], states["false"]
    assert a.keys() == b.keys()
    assert_same(a, b)
