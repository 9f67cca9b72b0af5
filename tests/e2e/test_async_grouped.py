"""``rollout.steps_per_generation`` on the real trainer: one rollout makes several steps'
batches with the current weights, each trained at its own step (staleness 0, 1, .. M - 1
in turn, never past the bound), the generation's seconds shared among them; a run
SIGKILLed while batches of its group wait (a checkpoint holds them) and resumed ends equal,
bit for bit, to the uninterrupted one; a rollback makes it one batch a rollout; two DDP or
FSDP2 ranks each make their share; the first steps synchronous (``algo.synchronous_steps``)
start the groups after them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_hpc.core.events import read as read_events
from grpo_hpc.core.paths import RunPaths

from .helpers import make_run, train
from .test_resume_exact import STEPS, check_kill_and_resume

SAMPLES = 8  # the tiny config's 2 prompts x 4 completions


def _rows(run) -> list[dict]:  # noqa: ANN001 - RunPaths
    rows = [json.loads(x) for x in run.metrics.read_text().splitlines()]
    return [r for r in rows if "loss" in r]


@pytest.mark.slow
def test_grouped_kill_and_resume_is_bit_exact(tmp_path: Path) -> None:
    """M = 3 over 16 steps: rollouts at steps 1, 4, .., 16 (the last alone: the run ends),
    the batches 0, 1, 2 updates stale in turn; staleness 0 is scored by the same weights to
    the bit, a later one is not (the version is the weights'); each batch its share of its
    rollout's seconds. SIGKILLed at a random moment after the first checkpoint and resumed,
    the run ends equal to the uninterrupted one (tests/e2e/test_resume_exact.py): the
    checkpoints of steps 4 and 8 hold batches their group made for the next steps."""
    steps = [*STEPS, "algo.max_staleness=2", "rollout.steps_per_generation=3"]
    check_kill_and_resume(tmp_path, steps, 1)
    rows = _rows(RunPaths(tmp_path / "uninterrupted"))
    assert [r["staleness/max"] for r in rows] == [0, 1, 2] * 5 + [0]
    for r in rows:
        stale = int(r["staleness/max"])
        assert r[f"staleness/{stale}"] == SAMPLES and r.get("staleness/3", 0.0) == 0.0
        if stale == 0:
            assert r["rollout/logp_diff"] == 0.0, r
        else:
            assert r["rollout/logp_diff"] > 0.0, r
    shares = [r["time/generate"] for r in rows]
    assert shares[0] == shares[1] == shares[2] > 0 and shares[3] == shares[4] == shares[5]


def test_a_rollback_makes_it_one_batch_a_rollout(tmp_path: Path) -> None:
    """A collapse rolled back at step 2 (tests/e2e/test_async.py's setting): the batches
    the group made by weights that no longer exist do not train, and, as in the thread
    placement, the run goes on synchronous: every later batch made by the weights that
    train it."""
    dead = ("faults.enabled=true", "faults.zero_reward=true")  # flat groups: no signal
    collapse = ("training.collapse_window=2", "training.collapse_patience=2")
    rollback = ("training.on_collapse=rollback", "training.max_steps=4")
    run = make_run(tmp_path, "rb", *dead, *collapse, *rollback, "algo.max_staleness=1",
                   "rollout.steps_per_generation=2")  # fmt: skip
    result = train(run)
    assert result.returncode == 0, result.stderr[-3000:]
    events = [e for e in read_events(run.events) if e.get("phase") == "collapse"]
    assert [(e["action"], e["step"]) for e in events][:1] == [("ROLLBACK", 2)]
    assert "synchronous from here" in events[0]["reason"]
    assert [r["staleness/max"] for r in _rows(run)] == [0, 1, 0, 0]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_each_make_their_share_of_a_group(tmp_path: Path, strategy: str) -> None:
    """Two DDP or FSDP2 ranks: each rank's rollout makes its share of both steps' batches
    (every rank at the same point of the step: FSDP2's engine generates in step), and the
    run's histogram counts every rank's samples at the staleness of the group's turn. The
    DDP run also trains its first 2 steps synchronously (``algo.synchronous_steps=2``): its
    groups start at the second step."""
    grouped = ("algo.max_staleness=1", "rollout.steps_per_generation=2")
    warm = ("training.max_steps=5", "algo.synchronous_steps=2")
    steps = warm if strategy == "ddp" else ("training.max_steps=4",)
    run = make_run(tmp_path, strategy, *steps, *grouped, f"dist.strategy={strategy}", nproc=2)
    result = train(run, 2)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _rows(run)
    stale = [0, 0, 1, 0, 1] if strategy == "ddp" else [0, 1, 0, 1]
    assert [(r["world_size"], r["staleness/max"]) for r in rows] == [(2, s) for s in stale]
    assert all(r[f"staleness/{int(r['staleness/max'])}"] == SAMPLES for r in rows)
