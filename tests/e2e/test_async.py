"""Asynchronous GRPO (algo.max_staleness) on the real trainer: no sample trains staler than
the bound, the staleness it reports is the weights' (not a label), a run SIGKILLed or
stopped mid-run and resumed ends equal, bit for bit, to the uninterrupted one (one process
and two DDP ranks), thread timing changes nothing, and a rollback trains nothing of the
weights it abandoned; with groups seeded by their place, one process and two ranks sample
alike."""

from __future__ import annotations

import json
import math
import signal
import time
from pathlib import Path

import pytest

from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.events import read as read_events
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import read_progress
from grpo_hpc.status import report
from grpo_hpc.status.view import health_line

from ..slowdown import guard
from .helpers import (
    assert_same,
    make_run,
    signal_job,
    start_forked,
    train,
    train_side_by_side,
    training,
)
from .test_resume_exact import STEPS, _final_state, check_kill_and_resume

SAMPLES = 8  # the tiny config's 2 prompts x 4 completions, all trained each step


def _bucket(key: str) -> bool:
    """A staleness histogram's bucket (``staleness/<n>``, not ``staleness/max``)."""
    return key.startswith("staleness/") and key.removeprefix("staleness/").isdigit()


def _rows(run) -> list[dict]:  # noqa: ANN001 - RunPaths
    lines = run.metrics.read_text().splitlines()
    return [r for r in map(json.loads, lines) if "reward/mean" in r]


@pytest.mark.parametrize(("k", "warm"), [(1, 0), (2, 0), (1, 3)])
def test_no_sample_trains_staler_than_the_bound(tmp_path: Path, k: int, warm: int) -> None:
    """Every step's histogram counts its samples at staleness min(step - 1, k) (the batch of
    step s is made by the weights of step s - k) and none past k. At staleness 0 the
    sampler's log-probs equal the trainer's to the bit (the same weights, scored alike), and
    at staleness >= 1 they differ: the version is the weights', not a label. With
    ``algo.synchronous_steps=warm`` the first ``warm`` steps train at staleness 0 (their
    batches made by their own weights), and staleness counts from there."""
    run = make_run(
        tmp_path, f"async-k{k}-w{warm}", "training.max_steps=5", f"algo.max_staleness={k}",
        f"algo.synchronous_steps={warm}",
    )  # fmt: skip
    result = train(run)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    for r in rows:
        stale = max(0, min(r["step"] - max(warm, 1), k))
        counts = {int(key.split("/")[1]): v for key, v in r.items() if _bucket(key)}
        assert counts == {s: (SAMPLES if s == stale else 0.0) for s in range(k + 1)}, r
        assert r["staleness/max"] == stale <= k
        assert 0.0 <= r["rollout/is_clipped_frac"] <= 1.0
        assert math.isfinite(r["rollout/is_weight_mean"]) and r["rollout/is_weight_max"] > 0
        if stale == 0:
            assert r["rollout/logp_diff"] == 0.0 and r["rollout/engine_kl"] == 0.0, r
        else:
            assert r["rollout/logp_diff"] > 0.0 and r["rollout/engine_kl"] > 0.0, r
    # what grpo-status RUN shows of the last step
    row = report.collect_rows(tmp_path, [run.name])[0]
    assert row.staleness == k and health_line(row).endswith(f"batch {k} update(s) stale")


def test_off_policy_sequence_masking_drops_only_stale_completions(tmp_path: Path) -> None:
    """algo.offpolicy_mask in the real trainer: step 1 (staleness 0, the sampler's
    log-probs the trainer's to the bit) drops nothing; the stale steps after it drop some
    completions (a delta just above 0 catches every negative one that drifted at all) and
    never all, and the share is in each metrics row."""
    run = make_run(
        tmp_path, "opsm", "training.max_steps=4", "algo.max_staleness=1", "algo.offpolicy_mask=1e-6"
    )
    result = train(run)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [r for r in _rows(run) if "rollout/offpolicy_masked_frac" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    share = [r["rollout/offpolicy_masked_frac"] for r in rows]
    assert share[0] == 0.0 and all(0.0 <= s < 1.0 for s in share), share
    assert max(share[1:]) > 0.0, share


@pytest.mark.parametrize("synchronous", [True, False])
def test_a_rollback_drops_the_batches_of_the_abandoned_weights(
    tmp_path: Path, synchronous: bool
) -> None:
    """A collapse rolled back at step 2 (to the start: tests/e2e/test_collapse_run.py's
    setting) leaves a batch generated ahead by weights that no longer exist: step 3 trains
    a batch made then by the restored weights (staleness 0), not that one. Then, by default
    (training.rollback_synchronous), the run is synchronous (step 4 at staleness 0 too, the
    event says so); with it off, step 4 is one update stale again."""
    dead = ("faults.enabled=true", "faults.zero_reward=true")  # flat groups: no signal
    collapse = ("training.collapse_window=2", "training.collapse_patience=2")
    rollback = ("training.on_collapse=rollback", "training.max_steps=4")
    remedy = f"training.rollback_synchronous={str(synchronous).lower()}"
    run = make_run(tmp_path, "rb", *dead, *collapse, *rollback, "algo.max_staleness=1", remedy)
    result = train(run)
    assert result.returncode == 0, result.stderr[-3000:]
    events = [e for e in read_events(run.events) if e.get("phase") == "collapse"]
    assert [(e["action"], e["step"]) for e in events][:1] == [("ROLLBACK", 2)]
    assert ("synchronous from here" in events[0]["reason"]) == synchronous
    assert [r["staleness/max"] for r in _rows(run)] == [0, 1, 0, 0 if synchronous else 1]


def test_the_run_does_not_depend_on_thread_timing(tmp_path: Path) -> None:
    """The same seed with the generator thread finishing long before the update (the
    update held back one second at step 3: ``faults.stall_at_step=2``) and racing it (no
    stall): the same weights and optimizer at the end, bit for bit."""
    steps = ["training.max_steps=5", "algo.max_staleness=1"]
    ref = make_run(tmp_path, "racing", *steps)
    held = make_run(tmp_path, "held", *steps, "faults.enabled=true", "faults.stall_at_step=2")
    train_side_by_side(ref, held)
    assert_same(_final_state(ref, 5), _final_state(held, 5))
    assert _rows(held)[2]["time/step"] >= 1.0  # the stall landed in step 3 (self.step 2)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("k", "engine", "nproc", "lora"),
    [(1, "hf", 1, 0), (2, "native", 1, 0), (1, "hf", 2, 0), (1, "native", 1, 4)],
)
def test_async_kill_and_resume_is_bit_exact(
    tmp_path: Path, k: int, engine: str, nproc: int, lora: int
) -> None:
    """As tests/e2e/test_resume_exact.py, asynchronous: SIGKILL at a random moment after the
    first checkpoint (while batches are generated ahead, or inside a save), resume, and the
    weights and optimizer at the end equal an uninterrupted run's of the same seed. The two
    runs' threads run at different moments, so it also shows the run does not depend on
    thread timing; the resumed rank's state digest equals its checkpoint's (the batches
    generated ahead included). Two DDP ranks (under the real torchrun): each generates its
    share ahead with no collective. LoRA: the copy that generates shares the frozen base
    with the policy (making.plain_copy) and still generates from version t's adapters.
    k = 2 also trains its first 6 steps synchronously (``algo.synchronous_steps``): a kill
    before step 6 resumes from the checkpoint of step 4 across the switch, a later one
    from a checkpoint that holds batches made ahead."""
    steps = [*STEPS, f"algo.max_staleness={k}", f"rollout.engine={engine}"]
    steps += [f"model.lora_rank={lora}"] if lora else []
    steps += ["algo.synchronous_steps=6"] if k == 2 else []
    run = check_kill_and_resume(tmp_path, steps, nproc)
    # the run really was asynchronous: its last step trained a batch k updates old
    assert _rows(run)[-1]["staleness/max"] == k
    if k == 2:  # and synchronous for its first 6 steps, stale from the 7th
        stale = [r["staleness/max"] for r in _rows(RunPaths(tmp_path / "uninterrupted"))]
        assert stale[:8] == [0] * 6 + [1, 2], stale


@pytest.mark.slow
@pytest.mark.parametrize("grouped", [False, True])
def test_a_stop_signal_saves_the_batches_generated_ahead(tmp_path: Path, grouped: bool) -> None:
    """SIGTERM (Slurm's preemption) while batches are generated ahead: the generation in
    flight finishes, the checkpoint of the stop holds it, exit 5; resumed, the run ends
    equal to the uninterrupted one (a batch cut short and made again by newer weights
    would not). Grouped (``rollout.steps_per_generation=2``): the stop lands in a group's
    rollout, on the main thread (cut: the step is made again on resume), or between (the
    checkpoint holds the group's batch); either way the end is the same."""
    steps = ["training.max_steps=8", "training.save_every_steps=0", "algo.max_staleness=1"]
    steps += ["rollout.steps_per_generation=2"] if grouped else []
    steps.append("rollout.max_new_tokens=48")  # a generation long enough to land in
    ref = make_run(tmp_path, "uninterrupted", *steps)
    run = make_run(tmp_path, "stopped", *steps)
    with training(ref) as ref_result:  # beside the stopped and resumed runs: shares nothing
        proc = start_forked(run)
        deadline = time.time() + 240
        while time.time() < deadline:
            rec = read_progress(run.progress)
            if rec is not None and rec.step >= 2:
                break
            assert proc.poll() is None, "trainer exited before step 2"
            time.sleep(0.02)
        signal_job(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=guard(120)) is not None
        rec = read_progress(run.progress)
        assert rec is not None and rec.exit_code == int(ExitCode.CHECKPOINTED), rec
        assert rec.step < 8, "the run finished before the stop; the test proved nothing"
        result = train(run)
        assert result.returncode == 0, result.stderr[-2000:]
        assert ref_result().returncode == 0
    assert_same(_final_state(ref, 8), _final_state(run, 8))


def test_groups_seeded_by_their_place_sample_alike_on_one_rank_and_two(tmp_path: Path) -> None:
    """``rollout.seed_per_group`` with batches generated ahead: each group's completions come
    from its place in the data order, not from the rank or the thread that generated it, so
    one process and two DDP ranks sample the same completions (the same rewards, every step).
    Steps 1 and 2 are generated by the same starting weights (step 2's ahead, at k = 1) and
    must agree exactly; later steps by weights equal within fp32 rounding (the ranks' sums
    are added in another order), which has not changed a sampled token in this run."""
    steps = ["training.max_steps=4", "algo.max_staleness=1", "rollout.seed_per_group=true"]
    one, two = make_run(tmp_path, "one", *steps), make_run(tmp_path, "two", *steps, nproc=2)
    assert train(one).returncode == 0
    assert train(two, 2).returncode == 0
    got = {r["step"]: (r["reward/mean"], r["staleness/max"]) for r in _rows(two)}
    want = {r["step"]: (r["reward/mean"], r["staleness/max"]) for r in _rows(one)}
    assert sorted(got) == [1, 2, 3, 4] and got == want, (got, want)

    # samples.jsonl: rank 0's first completion of each of its groups; the two-rank run's
    # (group 0) is among the one-process run's (groups 0, 1), the same text, every step
    def said(run) -> set[tuple]:  # noqa: ANN001 - RunPaths
        lines = run.samples.read_text().splitlines()
        return {(s["step"], s["question"], s["completion"]) for s in map(json.loads, lines)}

    assert len(said(two)) == 4 and said(two) <= said(one), (said(two), said(one))
