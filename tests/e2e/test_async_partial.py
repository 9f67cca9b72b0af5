"""Partial rollouts (``rollout.partial_pool``) on the real trainer: answers are continued by
newer weights, no sample trains staler than ``algo.max_staleness`` (a group as stale as its
first token), and a run SIGKILLed mid-run and resumed ends equal, bit for bit, to the
uninterrupted one (one process and two DDP ranks: the pool is saved per rank). In the
split placement (the trainer keeps the pool, its generator process advances it) the run
trains, bit for bit and round for round, what the thread placement trains (HF generate
and the native engine; one trainer, and two served by one generator), a SIGKILL of either
role resumes bit for bit, and a rollback restarts the flights (or, by default, ends partial
rollouts) in both placements alike.

The model is conftest's ``ending_model``: a random tiny Llama whose answers end at many
lengths (a long tail)."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import time
from pathlib import Path

import pytest

from grpo_hpc.core.events import read as read_events
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState, read_progress
from grpo_hpc.status import report
from grpo_hpc.status.view import health_line

from ..slowdown import guard
from .helpers import assert_same, make_run, signal_job, start, train
from .test_async_split import (
    ROLLBACK,
    _completions,
    _pulse,
    _wait_for,
    as_split,
    both_placements,
    collapse_actions,
)
from .test_resume_exact import STEPS, _final_state, check_kill_and_resume

G, PROMPTS, K = 2, 2, 2
PARTIAL = [
    f"algo.max_staleness={K}",
    "rollout.partial_pool=2",
    f"rollout.num_generations={G}",
    f"rollout.prompts_per_step={PROMPTS}",
    "rollout.max_new_tokens=48",
    "algo.micro_batch_size=4",
]


def _rows(run: RunPaths) -> list[dict]:
    lines = run.metrics.read_text().splitlines()
    return [r for r in map(json.loads, lines) if "reward/mean" in r]


def _histogram(row: dict) -> dict[int, float]:
    return {
        int(key.split("/")[1]): v
        for key, v in row.items()
        if key.startswith("staleness/") and key.split("/")[1].isdigit()
    }


@pytest.mark.parametrize("engine", ["native", "hf"])
def test_answers_are_continued_and_none_trains_staler_than_the_bound(
    tmp_path: Path, ending_model: Path, engine: str
) -> None:
    """Every step trains a step's groups, each at most k stale (its first token's weights),
    some of them continued answers; the sampler's log-probs of a continued answer are of
    two weights, which the importance weights see (finite, not all 1)."""
    steps = ["training.max_steps=8", f"rollout.engine={engine}"]
    run = make_run(
        tmp_path, f"partial-{engine}", *PARTIAL, *steps, f"model.name_or_path={ending_model}"
    )
    result = train(run)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _rows(run)
    assert [r["step"] for r in rows] == list(range(1, 9))
    for r in rows:
        counts = _histogram(r)
        assert sum(counts.values()) == PROMPTS * G, r
        assert all(v == 0 for s, v in counts.items() if s > K), r
        assert r["staleness/max"] <= K
        if "rollout/is_weight_mean" in r:  # absent where every group was flat (no update)
            assert math.isfinite(r["rollout/is_weight_mean"]) and r["rollout/is_weight_max"] > 0
    assert any(r.get("rollout/logp_diff", 0) > 0 for r in rows)
    continued = sum(r["partial/continued_rows"] for r in rows)
    assert continued > 0, "no answer was continued: the test proved nothing"
    assert max(r["staleness/max"] for r in rows) == K
    assert all(r["partial/pool_groups"] >= 0 and r["partial/dropped_groups"] == 0 for r in rows)
    # what grpo-status RUN shows of the last step: its oldest group's age, the rows continued
    row = report.collect_rows(tmp_path, [run.name])[0]
    last = rows[-1]
    assert (row.staleness, row.continued) == (last["staleness/max"], last["partial/continued_rows"])
    said = f"{int(last['partial/continued_rows'])} rows continued"
    assert health_line(row).endswith(f"groups at most {row.staleness} update(s) stale, {said}")


@pytest.mark.slow
@pytest.mark.parametrize(("engine", "nproc"), [("native", 1), ("hf", 2)])
def test_partial_kill_and_resume_is_bit_exact(
    tmp_path: Path, ending_model: Path, engine: str, nproc: int
) -> None:
    """SIGKILL at a random moment after the first checkpoint, resume: the weights and the
    optimizer at the end equal the uninterrupted run's, bit for bit; the resumed rank's
    state digest equals its checkpoint's (the pool of answers in flight included). The
    native case also trains its first 6 steps synchronously (``algo.synchronous_steps``;
    the pool's first round, all of its weights, at step 6): its checkpoint of step 4 holds
    no pool, a later one a pool begun at step 6."""
    steps = [*STEPS, *PARTIAL, f"rollout.engine={engine}", f"model.name_or_path={ending_model}"]
    steps[steps.index(f"rollout.prompts_per_step={PROMPTS}")] = (
        f"rollout.prompts_per_step={2 * nproc}"
    )
    warm = engine == "native"
    steps += ["algo.synchronous_steps=6"] if warm else []
    run = check_kill_and_resume(tmp_path, steps, nproc)
    assert sum(r.get("partial/continued_rows", 0) for r in _rows(run)) > 0
    if warm:  # steps 1-5 a synchronous step's batch each; the pool's first round at step 6
        rows = _rows(RunPaths(tmp_path / "uninterrupted"))
        assert all("partial/pool_groups" not in r for r in rows[:5])
        assert all("partial/pool_groups" in r for r in rows[5:]), rows[5]
        assert [r["staleness/max"] for r in rows[:6]] == [0] * 6


SPLIT_STEPS = 8


def _rounds(run: RunPaths) -> list[list[float]]:
    """What each step's round did: rows continued, groups left in the pool, rows decoded,
    and the groups' ages (None where a step had no round: partial rollouts ended)."""
    keys = ["partial/continued_rows", "partial/pool_groups", "partial/decoded_rows"]
    keys += [f"staleness/{s}" for s in range(K + 1)]
    return [[r.get(k) for k in keys] for r in _rows(run)]


def _split_steps(model: Path) -> list[str]:
    return [
        *PARTIAL,
        f"training.max_steps={SPLIT_STEPS}",
        "training.save_every_steps=4",
        "training.keep_last=1",
        f"model.name_or_path={model}",
    ]


@pytest.fixture(scope="module")
def split_reference(tmp_path_factory: pytest.TempPathFactory, ending_model: Path) -> RunPaths:
    """The uninterrupted split run with partial rollouts (a trainer and a generator)."""
    root = tmp_path_factory.mktemp("split-partial")
    run = as_split(make_run(root, "uninterrupted", *_split_steps(ending_model), nproc=2))
    result = train(run, 2)
    assert result.returncode == 0, result.stderr[-3000:]
    return run


@pytest.mark.slow
def test_the_split_placement_trains_what_the_thread_placement_trains(
    tmp_path: Path, ending_model: Path, split_reference: RunPaths
) -> None:
    """Partial rollouts with the generator in a process of its own: the trainer keeps the
    pool (draws its prompts, saves it) and its generator advances it one round per request.
    The same seed trains, bit for bit, what the thread placement trains: the same rounds
    (continued rows, pool sizes, rows decoded, each group's age) and the same weights and
    optimizer at the end; answers were continued."""
    thread = make_run(tmp_path, "thread", *_split_steps(ending_model))
    result = train(thread)
    assert result.returncode == 0, result.stderr[-3000:]
    assert _rounds(split_reference) == _rounds(thread)
    assert sum(r["partial/continued_rows"] for r in _rows(split_reference)) > 0
    final = SPLIT_STEPS
    assert_same(_final_state(split_reference, final), _final_state(thread, final))


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["generator", "trainer"])
def test_a_split_run_killed_mid_pool_resumes_bit_exact(
    tmp_path: Path, ending_model: Path, split_reference: RunPaths, victim: str
) -> None:
    """SIGKILL of the generator (which holds nothing between requests: the pool is the
    trainer's, in its checkpoint) or of the trainer after the first checkpoint, under the
    real torchrun; the resume ends with the weights and optimizer of the uninterrupted
    split run, bit for bit."""
    seed = int(os.environ.get("GRPO_HPC_TEST_SEED", time.time_ns() % 10_000))
    rng = random.Random(seed)
    slow = ["faults.enabled=true", "faults.step_sleep=0.5"]  # changes no number
    run = as_split(
        make_run(tmp_path, f"killed-{victim}", *_split_steps(ending_model), *slow, nproc=2)
    )
    proc = start(run, 2)
    try:
        pid = int(_pulse(run, 1 if victim == "generator" else 0)[0])
        _wait_for(run, rng.randint(4, SPLIT_STEPS - 2), proc)
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=guard(120))  # torchrun ends the other process
    finally:
        signal_job(proc.pid, signal.SIGKILL)
    rec = read_progress(run.progress)
    assert rec is not None and rec.state != TrainState.FINISHED, (
        f"seed {seed}: the run finished before the kill; the test proved nothing"
    )
    result = train(run, 2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_progress(run.progress).step == SPLIT_STEPS
    final = SPLIT_STEPS
    assert_same(_final_state(split_reference, final), _final_state(run, final))


@pytest.mark.slow
def test_one_generator_advances_two_trainers_pools_as_two_ranks_do(
    tmp_path: Path, ending_model: Path
) -> None:
    """Two DDP trainers and one generator: each trainer keeps its own pool and the
    generator advances both in turn, each with its trainer's random stream; the run trains,
    bit for bit, what two DDP ranks of the thread placement train, with the same rounds.
    Both train their first 3 steps synchronously (``algo.synchronous_steps=3``): the
    trainers' pools start at step 3 (its first round, all of its own weights), alike."""
    steps = [*_split_steps(ending_model), "algo.synchronous_steps=3"]
    steps[steps.index(f"rollout.prompts_per_step={PROMPTS}")] = "rollout.prompts_per_step=4"
    thread, split = both_placements(tmp_path, *steps, ranks=2)
    assert _rounds(split) == _rounds(thread)
    assert sum(r.get("partial/continued_rows", 0) for r in _rows(split)) > 0
    rows = _rows(split)
    assert (
        all("partial/pool_groups" not in r for r in rows[:2]) and "partial/pool_groups" in rows[2]
    )
    assert [r["staleness/max"] for r in rows[:3]] == [0, 0, 0]
    final = SPLIT_STEPS
    assert_same(_final_state(split, final), _final_state(thread, final))


@pytest.mark.slow
@pytest.mark.parametrize("synchronous", [False, True], ids=["restart", "synchronous"])
def test_a_rollback_restarts_the_flights_or_ends_them_in_both_placements_alike(
    tmp_path: Path, ending_model: Path, synchronous: bool
) -> None:
    """A collapse rolled back at step 2 (flat zero rewards: no signal) with partial
    rollouts. With ``training.rollback_synchronous=false`` the groups in flight go back to
    their prompts under the restored weights (nothing trains older than the rollback) and
    the run stays asynchronous; by default the rollback ends partial rollouts (the pool
    dropped) and every later step trains a synchronous step's batch. Either way the split
    placement's trainer, which keeps the pool, samples every step what the thread
    placement samples."""
    steps = [*PARTIAL, f"model.name_or_path={ending_model}", *ROLLBACK]
    steps += [f"training.rollback_synchronous={str(synchronous).lower()}"]
    thread, split = both_placements(tmp_path, *steps)
    for run in (thread, split):
        assert collapse_actions(run)[:1] == [("ROLLBACK", 2)], collapse_actions(run)
        # step 3 is the restored weights' first batch: every group started after the rollback
        assert _rows(run)[2]["staleness/max"] == 0, _rows(run)[2]
        rollback = next(e for e in read_events(run.events) if e.get("action") == "ROLLBACK")
        after = _rows(run)[2:]
        if synchronous:  # no pool left, nothing ahead: each step's batch its own weights'
            assert "synchronous from here" in rollback["reason"], rollback["reason"]
            assert all(r["staleness/max"] == 0 and "partial/pool_groups" not in r for r in after)
        else:  # the pool goes on: later rounds continue answers across steps again
            assert "synchronous from here" not in rollback["reason"], rollback["reason"]
            assert all("partial/pool_groups" in r for r in after)
            assert max(r["staleness/max"] for r in after) > 0, after
    assert _rounds(split) == _rounds(thread)
    assert _completions(split) == _completions(thread)
    assert_same(_final_state(split, 4), _final_state(thread, 4))


@pytest.mark.slow
def test_the_split_placement_with_the_native_engine_trains_what_the_thread_one_trains(
    tmp_path: Path, ending_model: Path
) -> None:
    """The same with the native engine (a continued answer's prompt holds its answer so
    far, and the row stops at its room inside the decode step): the same rounds and the
    same weights and optimizer at the end, bit for bit. (This pool is small enough to
    prefill in one chunk: the chunked prefill is test_prefill_chunks.py's.)"""
    thread, split = both_placements(tmp_path, *_split_steps(ending_model), "rollout.engine=native")
    assert _rounds(split) == _rounds(thread)
    assert sum(r["partial/continued_rows"] for r in _rows(split)) > 0
    assert_same(_final_state(split, SPLIT_STEPS), _final_state(thread, SPLIT_STEPS))
