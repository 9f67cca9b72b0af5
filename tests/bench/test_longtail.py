"""The long-tail benchmark's pure parts: the length distribution (scaling to a cap, seeded
draws) and the analysis of a synchronous and an asynchronous run (tokens/s/GPU as NeMo RL
counts them, idle shares, the wait for the longest row, the check that imposed lengths
were honoured), each on synthetic rows with answers computed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.speed import length_dist as ld
from bench.speed import longtail_analysis as la
from bench.speed.longtail import plan_runs, step_command

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "bench/speed/lengths/smollm2_gsm8k_cap1024.json"


def test_scaled_keeps_the_shape_and_runs_capped_rows_to_the_cap() -> None:
    d = ld.LengthDist(lengths=[10, 100, 1000, 1024], cap=1024, at_cap=[False, False, False, True])
    # x4: 40, 400, 4000; the row that hit the recorded cap runs to the new one (4097 = no EOS)
    assert ld.scaled(d, 4096) == [40, 400, 4000, 4097]
    # /4 rounds, never below 1 token: 10/4 = 2.5 -> 2 (banker's), 100/4 = 25, 1000/4 = 250
    assert ld.scaled(d, 256) == [2, 25, 250, 257]
    assert ld.scaled(ld.LengthDist([1], 1024), 8) == [1]
    assert [ld.completion_length(t, 256) for t in ld.scaled(d, 256)] == [2, 25, 250, 256]


def test_a_distribution_refuses_lengths_past_its_cap() -> None:
    with pytest.raises(ValueError):
        ld.LengthDist(lengths=[5, 2000], cap=1024)
    with pytest.raises(ValueError):
        ld.LengthDist(lengths=[5], cap=1024, at_cap=[False, True])


def test_draws_are_seeded_by_seed_call_and_rank() -> None:
    targets = list(range(1, 101))
    a = ld.draw(targets, 64, seed=3, call=5)
    assert a == ld.draw(targets, 64, seed=3, call=5)  # a sync and an async run draw alike
    assert a != ld.draw(targets, 64, seed=3, call=6)
    assert a != ld.draw(targets, 64, seed=4, call=5)
    assert a != ld.draw(targets, 64, seed=3, call=5, rank=1)
    assert set(a) <= set(targets)


def test_the_recorded_distribution_states_its_provenance(tmp_path: Path) -> None:
    d = ld.load(RECORDED)
    assert "SmolLM2-135M" in d.provenance["model"] and "GSM8K" in d.provenance["data"]
    assert d.provenance["command"].startswith("python -m bench.speed.record_lengths")
    assert len(d.lengths) == len(d.at_cap) >= 64 and d.cap == 1024
    ld.save(d, tmp_path / "again.json")  # save and load give the same distribution
    assert ld.load(tmp_path / "again.json") == d
    assert json.loads(RECORDED.read_text())["summary"] == ld.summary(d)


def _step(step: int, **kw: float) -> dict:
    return {"loss": 0.0, "step": step, "world_size": 2, "completions": 4, **kw}


# Three steps, 2 GPUs, 4 completions a step. Step 1 is dropped (warm-up).
STEPS = [
    _step(1, **{"time/step": 9.0, "time/generate": 5.0, "time/train": 3.0, "gen_len/mean": 1.0}),
    _step(2, **{"time/step": 2.0, "time/generate": 1.5, "time/train": 0.5, "gen_len/mean": 10.0,
                "time/wait_rollouts": 0.25}),
    _step(3, **{"time/step": 4.0, "time/generate": 5.0, "time/train": 1.0, "gen_len/mean": 20.0,
                "time/wait_rollouts": 0.75}),
]  # fmt: skip


def _call(call: int, rank: int, prompt: int, lengths: list[int], **kw: object) -> dict:
    return {"call": call, "rank": rank, "greedy": False, "prompt_tokens": prompt, "cap": 32,
            "lengths": lengths, "drawn": None, "check_every": 4, "start": 100.0,
            "end": 101.0, "ticks": [], **kw}  # fmt: skip


# Two ranks, 2 rows each; an evaluation (greedy) call in between is not a step's batch.
RECORDS = [
    _call(0, 0, 30, [1, 1]), _call(0, 1, 30, [1, 1]),
    {**_call(-1, 0, 999, [5, 5]), "greedy": True},
    _call(1, 0, 50, [10, 10]), _call(1, 1, 50, [10, 10]),
    _call(2, 1, 70, [20, 20]), _call(2, 0, 70, [20, 20]),
]  # fmt: skip


def test_tokens_per_gpu_second_as_nemo_rl_counts_them() -> None:
    prompts = la.prompt_tokens_per_step(RECORDS, 3)
    assert prompts == [60, 100, 140]  # per call, both ranks
    # steps 2-3: prompt 100 + 140, response 10*4 + 20*4 = 120 -> 360 tokens in 6 s on 2 GPUs
    assert la.tokens_per_gpu_s(STEPS, prompts) == pytest.approx(360 / 6 / 2)
    assert la.prompt_tokens_per_step(RECORDS, 4) is None  # calls and steps do not pair


def test_idle_shares_cap_each_phase_at_its_step() -> None:
    # engine: generate 1.5 + min(5, 4) = 5.5 of 6 s busy -> idle 1/12
    assert la.idle_share(STEPS, "time/generate") == pytest.approx(1 - 5.5 / 6)
    # optimizer: 0.5 + 1.0 of 6 s -> idle 0.75
    assert la.idle_share(STEPS, "time/train") == pytest.approx(0.75)
    assert la.idle_share(STEPS, "time/weight_sync") is None  # not logged: None, not 0
    assert la.mean_of(STEPS, "time/wait_rollouts") == pytest.approx(0.5)


def test_wait_for_the_longest_row_starts_when_half_the_rows_ended() -> None:
    # median length 6; checks every 4 steps at 0.1 s (t=4), 0.2 s (t=8), 0.3 s (t=12):
    # the first at or after 6 tokens is t=8, 0.2 s into a 1 s generation -> 0.8 s of tail
    call = _call(0, 0, 0, [2, 5, 7, 30], ticks=[0.1, 0.2, 0.3])
    assert la.longest_row_wait(call) == pytest.approx(0.8)
    # every row ended before the first check (t=4): the wait runs from it
    assert la.longest_row_wait(_call(0, 0, 0, [1, 2, 3], ticks=[0.5])) == pytest.approx(0.5)
    # the median row ended past the last check: a tail under one interval, 0
    assert la.longest_row_wait(_call(0, 0, 0, [30, 30], ticks=[0.1])) == 0.0


def test_length_mismatches_find_a_row_not_honoured_and_a_step_that_disagrees() -> None:
    steps = [_step(1, **{"gen_len/mean": 3.0}), _step(2, **{"gen_len/mean": 8.0})]
    good = [
        _call(0, 0, 1, [2, 4], drawn=[2, 4]),
        _call(1, 0, 1, [8, 8], drawn=[8, 40]),  # 40 is past the cap: 32 tokens, not 8
    ]
    bad = la.length_mismatches(steps, good)
    assert bad == ["call 1 rank 0: drawn [8, 32], got [8, 8]"]
    honoured = [good[0], _call(1, 0, 1, [8, 8], drawn=[8, 8])]
    assert la.length_mismatches(steps, honoured) == []
    off = [_step(1, **{"gen_len/mean": 3.0}), _step(2, **{"gen_len/mean": 7.0})]
    assert la.length_mismatches(off, honoured) == ["step 2: logged mean length 7.0, 8.0 made"]
    assert la.length_mismatches(steps[:1], honoured) == ["2 sampled generations for 1 steps"]


def test_summary_and_table() -> None:
    s = la.summarize("max_staleness=1", STEPS, RECORDS)
    assert s["tokens_per_gpu_s"] == pytest.approx(30.0)
    assert s["steps_measured"] == 2 and s["gpus"] == 2
    assert s["weight_sync_s"] is None and s["wait_rollouts_s"] == pytest.approx(0.5)
    table = la.markdown([s]).splitlines()
    assert table[0].startswith("| run | tokens/s/GPU |")
    assert table[2].startswith("| max_staleness=1 | 30 | 3.00 |") and "| - |" in table[2]
    assert la.speedup({"tokens_per_gpu_s": 20.0}, s) == pytest.approx(1.5)
    marked = la.markdown([s | {"cut": True}, s | {"cut": True, "failed": "exit 1"}])
    assert "| max_staleness=1 (stopped at its timeout) | 30 |" in marked
    assert "| max_staleness=1 (failed: exit 1) | 30 |" in marked
    assert la.speedup({"tokens_per_gpu_s": None}, s) is None


def test_an_asynchronous_runs_drain_steps_are_not_measured() -> None:
    """The last steps of a finished asynchronous run train batches made ahead with nothing
    generating beside them (step 3 here: 4 s, as if generation were free): they are left
    out, and a synchronous run, a cut one, keep every step after the first."""
    assert la.drain_steps(0, 0, False) == 0
    assert la.drain_steps(1, 0, False) == 1 and la.drain_steps(2, 0, False) == 2
    assert la.drain_steps(2, 2, False) == 1  # partial rollouts run one round ahead
    assert la.drain_steps(2, 0, True) == 0  # cut: generation still ran beside its last steps
    s = la.summarize("max_staleness=1", STEPS, RECORDS, drain=1)
    assert s["steps_measured"] == 1 and s["steps_drained"] == 1
    assert s["step_s"] == pytest.approx(2.0)
    # step 2 alone: prompt 100 + response 40 in 2 s on 2 GPUs
    assert s["tokens_per_gpu_s"] == pytest.approx(140 / 2 / 2)
    assert la.summarize("x", STEPS[:1], RECORDS[:2], drain=1)["steps_measured"] == 0


def test_each_run_imposes_or_records_and_keeps_its_files(tmp_path: Path) -> None:
    k0, k1 = plan_runs([0, 1], [])
    imposed = step_command(k1, tmp_path, tmp_path, ["--shape", "tiny", "--length-dist", "F"])
    assert imposed[imposed.index("--override") + 1] == "algo.max_staleness=1"
    assert "--record" not in imposed and imposed[imposed.index("--engine") + 1] == "native"
    assert imposed[imposed.index("--keep") + 1] == str(tmp_path / "k1")
    real = step_command(k0, tmp_path, tmp_path, ["--model-dir", "M", "--source", "gsm8k"])
    assert "--record" in real and "algo.max_staleness=0" in real


def test_a_variant_is_one_more_run_with_its_overrides(tmp_path: Path) -> None:
    """``NAME=OVERRIDES`` runs after the staleness runs, in DIR/NAME, with each override
    passed on; a malformed variant or a name used twice is refused."""
    runs = plan_runs([0, 1], ["k1high=algo.max_staleness=1 rollout.decode_priority=high"])
    assert [r.name for r in runs] == ["k0", "k1", "k1high"]
    cmd = step_command(runs[2], tmp_path, tmp_path, ["--shape", "tiny", "--length-dist", "F"])
    overrides = [cmd[i + 1] for i, w in enumerate(cmd) if w == "--override"]
    assert overrides == ["algo.max_staleness=1", "rollout.decode_priority=high"]
    assert cmd[cmd.index("--keep") + 1] == str(tmp_path / "k1high")
    for bad in (["k1high"], ["k/1=algo.max_staleness=1"], ["k1=algo.max_staleness=1"]):
        with pytest.raises(ValueError):
            plan_runs([0, 1], bad)
    # no staleness value: the variants alone (the other half of a comparison across calls)
    alone = plan_runs([], ["m3=algo.max_staleness=2 rollout.steps_per_generation=3"])
    assert [(r.name, r.overrides) for r in alone] == [
        ("m3", ("algo.max_staleness=2", "rollout.steps_per_generation=3"))
    ]
    with pytest.raises(ValueError, match="no runs"):
        plan_runs([], [])


def test_a_split_runs_generators_count_among_its_gpus() -> None:
    """A split run's metrics count its trainers in ``world_size`` and its generators apart:
    tokens/s/GPU divides by both (the same 2 GPUs as a 2-rank synchronous run); the
    longest-row wait is read from the first rank that generated (its generator)."""
    assert la.gpus({"world_size": 2}) == 2 and la.gpus({"world_size": 1, "generators": 1}) == 2
    prompts = la.prompt_tokens_per_step(RECORDS, 3)
    split = [{**s, "world_size": 1, "generators": 1} for s in STEPS]
    assert la.tokens_per_gpu_s(split, prompts) == la.tokens_per_gpu_s(STEPS, prompts)
    moved = [{**r, "rank": r["rank"] + 1} for r in RECORDS]  # no rank 0 among them
    assert la.longest_row_waits(moved, rank=1) == la.longest_row_waits(RECORDS, rank=0)


def test_the_metrics_alone_are_read_again_without_the_drain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m bench.speed.longtail_analysis METRICS --staleness K``: steps after the
    first and before the drain, and their response tokens a second (prompts unknown)."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in STEPS))
    la.main([str(path), "--staleness", "1"])
    out = capsys.readouterr().out
    # step 2 alone: 10 x 4 response tokens in 2 s on 2 GPUs
    assert "measured 1 (first 1, last 1 left out): 2.00 s/step, 10 response tokens/s/GPU" in out
    la.main([str(path), "--staleness", "0"])
    assert "measured 2 (first 1, last 0 left out): 3.00 s/step" in capsys.readouterr().out


def test_a_grouped_run_read_again_leaves_out_its_first_group_and_a_group_cut_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--steps-per-generation 2`` on 5 steps: steps 1-2 (the first rollout's, it compiles)
    and step 5 (a group of one) are left out; steps 3-4, one whole group, are measured."""
    times = [9.0, 1.0, 6.0, 2.0, 1.0]
    steps = [_step(i + 1, **{"time/step": t, "gen_len/mean": 10.0}) for i, t in enumerate(times)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in steps))
    la.main([str(path), "--staleness", "1", "--steps-per-generation", "2"])
    # 2 steps x 4 completions x 10 tokens in 8 s on 2 GPUs
    assert "measured 2 (first 2, last 1 left out): 4.00 s/step, 5 response tokens/s/GPU" in (
        capsys.readouterr().out
    )


def test_the_switch_interval_experiment_reaches_the_trainer_process(tmp_path: Path) -> None:
    """``grpo_step --switch-interval-ms`` (a long-tail run's GIL experiment) is passed to
    the imposing child, which sets the interpreter's interval before anything else runs
    (here it then fails on a run folder that does not exist)."""
    import argparse
    import sys

    from bench.speed import imposed_lengths
    from bench.speed.grpo_step import child_command
    from grpo_hpc.core.errors import ConfigError

    args = argparse.Namespace(
        length_dist=Path("F"), record=False, probe=False, cap_gib=0.0, seed=3,
        switch_interval_ms=0.5,
    )  # fmt: skip
    cmd = child_command(args, tmp_path)
    assert cmd[cmd.index("--switch-interval-ms") + 1] == "0.5"
    args.switch_interval_ms = 0.0
    assert "--switch-interval-ms" not in child_command(args, tmp_path)
    before = sys.getswitchinterval()
    try:
        with pytest.raises(ConfigError):  # no run folder: after the setting
            imposed_lengths.child(str(tmp_path / "none"), None, 0, tmp_path / "r", 0.5)
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize(
    ("steps", "k", "pool", "grouped", "cut", "expected"),
    [
        (5, 0, 0, 1, False, (1, 0)),  # synchronous: the first step
        (5, 1, 0, 1, False, (1, 1)),  # asynchronous: and the drain
        (5, 2, 2, 1, False, (1, 1)),
        (9, 2, 0, 3, False, (3, 0)),  # groups of 3: the first group; 4-6 and 7-9 whole
        (7, 2, 0, 3, False, (3, 1)),  # 7 generated alone (the run's end): left out
        (8, 2, 0, 3, True, (3, 2)),  # cut in a group: its steps left out
        (2, 1, 0, 3, False, (3, 0)),
    ],
)
def test_the_measured_window(
    steps: int, k: int, pool: int, grouped: int, cut: bool, expected: tuple[int, int]
) -> None:
    assert la.window(steps, k, pool, grouped, cut) == expected


def test_a_rollout_of_several_steps_shares_its_prompt_tokens_among_them() -> None:
    """``rollout.steps_per_generation``: one sampled call makes several steps' batches;
    each step takes an equal share of its prompts (exact over a whole group), the last
    call of a run cut short by its end takes the steps left."""
    calls = [_call(0, 0, 100, [1, 1]), _call(1, 0, 60, [1, 1])]
    assert la.prompt_tokens_per_step(calls, 4, 2) == [50, 50, 30, 30]
    assert la.prompt_tokens_per_step(calls, 3, 2) == [50, 50, 60]
    assert la.prompt_tokens_per_step(calls, 5, 2) is None  # a call missing
    assert la.prompt_tokens_per_step(calls[:1], 2, 2) == [50, 50]
