"""Asynchronous GRPO with FSDP2 (``dist.strategy=fsdp``, two gloo ranks, the tiny model) on
the real trainer: each rank's generating copy is a plain module holding the policy's full
weights, bit for bit, after every copy, and no sample trains staler than the bound; a run
SIGKILLed mid-run and resumed from its sharded checkpoint ends equal, bit for bit, to the
uninterrupted one; where FSDP2 and DDP add the same numbers in the same order, the two
train the same bits. (The split placement's FSDP2 trainers: tests/e2e/test_async_split.py.)"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState, read_progress
from grpo_hpc.node.launch import exit_code_from_progress
from grpo_hpc.train.state.checkpoint import SHARDED, format_of

from ..slowdown import guard
from .helpers import assert_same, env, full_state, make_run, train
from .test_resume_exact import MAX_STEPS, STEPS, _kill_and_resume

pytestmark = pytest.mark.slow
FSDP = ["dist.strategy=fsdp", "algo.max_staleness=1"]
SAMPLES = 8  # the tiny config's 2 prompts x 4 completions, over both ranks, each step
WORKER = Path(__file__).with_name("shadow_check_worker.py")


def _rows(run: RunPaths) -> list[dict]:
    lines = run.metrics.read_text().splitlines()
    return [r for r in map(json.loads, lines) if "reward/mean" in r]


def test_each_rank_generates_from_the_whole_policy_within_the_bound(tmp_path: Path) -> None:
    """Two FSDP2 ranks at k = 1 under torchrun (shadow_check_worker.py: the trainer's own
    main, checked after each copy): after every copy each rank's shadow equals the policy's
    full weights (DTensor's own gather) in every tensor, and the weights it took changed
    from one copy to the next (the check is not of a copy that never moves). Every step
    trains its 8 samples at staleness min(step - 1, 1) and times its copy; at staleness 0
    the sampler's log-probs equal the trainer's to the bit, at 1 they differ."""
    run = make_run(tmp_path, "fsdp-k1", *FSDP, "training.max_steps=4", nproc=2)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
    cmd = [*torchrun, "--standalone", "--nnodes=1", str(WORKER), str(run.root)]
    done = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=guard(300))
    assert exit_code_from_progress(run, done.returncode) == 0, done.stderr[-3000:]
    for rank in (0, 1):
        lines = (run.root / f"shadow-rank{rank}.txt").read_text().splitlines()
        copies = [tuple(map(int, line.split())) for line in lines]
        assert len(copies) == 4, copies  # one copy per step
        n = copies[0][1]
        assert n > 0 and copies == [(n, n, 0)] + [(n, n, 1)] * 3, copies
    rows = _rows(run)
    assert [r["staleness/max"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert all(r["time/weight_sync"] > 0 for r in rows)  # the gather, timed at every step
    for r in rows:
        stale = min(r["step"] - 1, 1)
        assert (r["staleness/0"], r["staleness/1"]) == (
            (SAMPLES, 0.0) if stale == 0 else (0.0, SAMPLES)
        )
        if stale == 0:
            assert r["rollout/logp_diff"] == 0.0 and r["rollout/engine_kl"] == 0.0, r
        else:
            assert r["rollout/logp_diff"] > 0.0 and r["rollout/engine_kl"] > 0.0, r


def test_fsdp_async_kill_and_resume_is_bit_exact(tmp_path: Path) -> None:
    """As tests/e2e/test_async.py's kill-and-resume on two DDP ranks, with FSDP2: SIGKILL
    at a random moment after the first (sharded) checkpoint under the real torchrun, then a
    resume: the weights and optimizer at the end equal the uninterrupted run's, bit for
    bit (the batches generated ahead resumed from each rank's file, the copy gathered
    again from the resumed shards)."""
    seed = int(os.environ.get("GRPO_HPC_TEST_SEED", time.time_ns() % 10_000))
    rng = random.Random(seed)
    ref = make_run(tmp_path, "uninterrupted", *STEPS, *FSDP, nproc=2)
    run = make_run(tmp_path, "killed", *STEPS, *FSDP, nproc=2)
    assert train(ref, 2).returncode == 0
    _kill_and_resume(run, 2, rng, seed)
    rec = read_progress(run.progress)
    assert rec.state == TrainState.FINISHED and rec.restarts == 1 and rec.step == MAX_STEPS
    assert format_of(run.checkpoint(MAX_STEPS)) == SHARDED
    assert_same(full_state(ref, MAX_STEPS), full_state(run, MAX_STEPS))
    assert _rows(run)[-1]["staleness/max"] == 1  # the run really was asynchronous


def test_fsdp_async_trains_what_ddp_async_trains_where_their_sums_agree(tmp_path: Path) -> None:
    """Two FSDP2 ranks and two DDP ranks at k = 1 end with the same weights and optimizer,
    bit for bit, where the two strategies add the same numbers in the same order: one
    micro-batch per rank per step and no gradient clipping. (With several micro-batches
    FSDP2 reduces each one's gradients and DDP their sum once per step; with clipping the
    norm is summed over shards, then ranks: both differ from DDP in the last bits, about
    1e-8, synchronous runs too.) So each FSDP2 rank's copy generated what DDP's did."""
    same_sums = ["optim.grad_clip=0", "training.max_steps=4", "training.save_every_steps=4"]
    fsdp = make_run(tmp_path, "fsdp", *FSDP, *same_sums, nproc=2)
    ddp = make_run(
        tmp_path, "ddp", "dist.strategy=ddp", "algo.max_staleness=1", *same_sums, nproc=2
    )
    for run in (fsdp, ddp):
        result = train(run, 2)
        assert result.returncode == 0, result.stderr[-3000:]
    assert format_of(fsdp.checkpoint(4)) == SHARDED
    assert_same(full_state(ddp, 4), full_state(fsdp, 4))
    assert [r["staleness/max"] for r in _rows(fsdp)] == [0.0, 1.0, 1.0, 1.0]
