"""bench/learning/run.py's run bookkeeping: which (seed, system) pairs still need a run, and how
runs that shared the machine (``--jobs``) count in the summary."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.learning.results import devices
from bench.learning.run import merge_runs, pending_runs, summarize

from ..slowdown import guard


def _run(seed: int, evals: list[tuple[int, float, float]], jobs: int | None = None) -> dict:
    """A run as bench/learning/run.py stores it; ``jobs`` absent as in runs from before --jobs."""
    run = {
        "seed": seed,
        "evals": [{"step": st, "s": s, "accuracy": a, "strict": a} for st, s, a in evals],
        "steps": [],
    }
    return run if jobs is None else run | {"jobs": jobs}


def test_pending_runs_pairs_every_system_on_a_seed_first() -> None:
    result: dict = {"systems": {}}
    assert pending_runs(result, [3, 1], ["trl", "grpo_hpc"]) == [
        (3, "trl"),
        (3, "grpo_hpc"),
        (1, "trl"),
        (1, "grpo_hpc"),
    ]


def test_pending_runs_skips_runs_already_there() -> None:
    result = {
        "systems": {
            "grpo_hpc": [{"seed": 1}],
            "trl": [{"seed": 3}],
            "grpo_hpc_hf": [{"seed": 5}],  # another system's seed 5 does not count
        }
    }
    assert pending_runs(result, [1, 3, 5], ["grpo_hpc", "trl"]) == [
        (1, "trl"),
        (3, "grpo_hpc"),
        (5, "grpo_hpc"),
        (5, "trl"),
    ]
    assert pending_runs(result, [1], ["grpo_hpc"]) == []
    assert pending_runs(result, [], ["grpo_hpc", "trl"]) == []


def test_summarize_times_only_runs_that_had_the_machine_alone() -> None:
    runs = [
        _run(0, [(0, 0.0, 0.1), (2, 10.0, 0.5), (4, 20.0, 0.9)]),  # alone: reaches 0.8 at 20 s
        _run(1, [(0, 0.0, 0.2), (2, 30.0, 0.8), (4, 50.0, 0.7)], jobs=1),  # alone: at 30 s
        _run(2, [(0, 0.0, 0.0), (2, 100.0, 0.9), (4, 200.0, 1.0)], jobs=4),  # shared: reaches
        _run(3, [(0, 0.0, 0.1), (2, 90.0, 0.3), (4, 180.0, 0.4)], jobs=4),  # shared: never
        _run(4, [(0, 0.0, 0.1), (2, 50.0, 0.2), (4, 80.0, 0.5)]),  # alone: never
    ]
    s = summarize(runs, 0.8)
    assert s["seeds"] == [0, 1, 2, 3, 4]
    assert s["time_to_target_mean_s"] == pytest.approx(25.0)  # (20 + 30) / 2, not 100
    assert s["timed_seeds"] == 2
    assert s["seeds_reaching_target"] == 3  # the shared run that reaches it counts here
    finals = [0.9, 0.7, 1.0, 0.4, 0.5]
    mean = sum(finals) / 5
    se = math.sqrt(sum((x - mean) ** 2 for x in finals) / 4 / 5)
    assert s["final_accuracy_mean"] == pytest.approx(mean) == 0.7
    assert s["final_accuracy_se"] == pytest.approx(se)
    curve = s["curve"]
    assert [c["step"] for c in curve] == [0, 2, 4]
    # accuracy over all five runs, the clock over the three alone (seeds 0, 1, 4) only
    assert [c["accuracy_mean"] for c in curve] == pytest.approx([0.1, 0.54, 0.7])
    assert [c["s"] for c in curve] == pytest.approx([0.0, 30.0, 50.0])


def test_summarize_with_shared_runs_only() -> None:
    runs = [
        _run(5, [(0, 0.0, 0.1), (1, 40.0, 0.85), (2, 80.0, 0.9)], jobs=2),
        _run(6, [(0, 0.0, 0.3), (1, 60.0, 0.5), (2, 100.0, 0.6)], jobs=2),
    ]
    s = summarize(runs, 0.8)
    assert s["time_to_target_mean_s"] is None  # no run had the machine to itself
    assert s["timed_seeds"] == 0
    assert s["seeds_reaching_target"] == 1
    assert s["final_accuracy_mean"] == pytest.approx(0.75)
    assert s["final_accuracy_se"] == pytest.approx(0.15)  # std 0.212 / sqrt(2)
    # with no alone run the clock falls back to the shared ones
    assert [c["s"] for c in s["curve"]] == pytest.approx([0.0, 50.0, 90.0])


def test_summarize_clock_missing_where_no_alone_run_evaluated() -> None:
    alone = _run(0, [(0, 0.0, 0.2), (2, 20.0, 0.6)])
    shared = _run(1, [(0, 0.0, 0.4), (1, 70.0, 0.5), (2, 90.0, 0.8)], jobs=3)
    s = summarize([alone, shared], 0.6)
    assert [(c["step"], c["s"]) for c in s["curve"]] == [(0, 0.0), (1, None), (2, 20.0)]
    assert [c["accuracy_mean"] for c in s["curve"]] == pytest.approx([0.3, 0.5, 0.7])
    assert (s["time_to_target_mean_s"], s["timed_seeds"], s["seeds_reaching_target"]) == (
        20.0,
        1,
        2,
    )


def test_merge_replaces_a_seed_run_again_and_keeps_the_rest() -> None:
    result = {
        "systems": {"grpo_hpc": [_run(0, []), _run(1, [(5, 1.0, 0.1)])], "trl": [_run(0, [])]}
    }
    again = {"systems": {"grpo_hpc": [_run(1, [(5, 1.0, 0.9)]), _run(7, [])]}}
    assert merge_runs(result, again) == 2
    assert [r["seed"] for r in result["systems"]["grpo_hpc"]] == [0, 1, 7]
    assert result["systems"]["grpo_hpc"][1]["evals"][0]["accuracy"] == 0.9  # the new run
    assert [r["seed"] for r in result["systems"]["trl"]] == [0]  # untouched


def test_runs_keep_the_device_they_ran_on_when_a_file_gains_runs_of_another() -> None:
    """A file's ``env`` is its last call's: runs made before on another GPU keep theirs."""
    result = {"systems": {"grpo_hpc": [_run(0, [])]}, "env": {"device": "H100"}}
    other = {"systems": {"opsm": [_run(0, [(5, 1.0, 0.5)])]}, "env": {"device": "H200"}}
    merge_runs(result, other)
    assert [r["device"] for r in result["systems"]["grpo_hpc"]] == ["H100"]
    assert [r["device"] for r in result["systems"]["opsm"]] == ["H200"]
    assert devices(result) == "H100 and H200"
    assert summarize(result["systems"]["opsm"], 0.8)["devices"] == ["H200"]
    one = {"systems": {"grpo_hpc": [_run(0, [])]}, "env": {"device": "H100"}}
    assert devices(one) == "H100"  # a file from before runs named theirs: its env's


def test_merge_files_from_several_gpus_into_one_summary(tmp_path: Path) -> None:
    config = {"terms": 2, "steps": 10, "target": 0.8, "overlong": "mask", "prompts": 4}
    config |= {"G": 8, "num_eval": 4}
    env = {"device": "test"}
    for gpu, seeds in enumerate(([0, 2], [1])):
        runs = [_run(s, [(5, 1.0, 0.5), (10, 2.0, 0.9)], jobs=8) for s in seeds]
        part = {"systems": {"grpo_hpc": runs}, "config": config | {"name": f"g{gpu}"}}
        part |= {"target": 0.8, "env": env}
        (tmp_path / f"g{gpu}.json").write_text(json.dumps(part))
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "bench.learning", "--out", str(out), "--name", "all"]
    cmd += ["--merge", str(tmp_path / "g0.json"), str(tmp_path / "g1.json")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=guard(120))
    assert done.returncode == 0, done.stderr
    merged = json.loads((out / "all.json").read_text())
    assert [r["seed"] for r in merged["systems"]["grpo_hpc"]] == [0, 1, 2]
    assert merged["summary"]["grpo_hpc"]["final_accuracy_mean"] == pytest.approx(0.9)
    assert (out / "all.png").stat().st_size > 0
    # a file of other settings is refused, naming it
    other = json.loads((tmp_path / "g1.json").read_text())
    other["config"]["lr"] = 1.0
    (tmp_path / "bad.json").write_text(json.dumps(other))
    bad = subprocess.run([*cmd[:-2], str(tmp_path / "bad.json")], capture_output=True, text=True)
    assert bad.returncode != 0 and "bad.json holds runs of other settings" in bad.stderr


def test_summary_counts_the_handed_over_model_on_the_test_problems() -> None:
    """A keep-best run's curve scores the validation split; what counts for the user is
    ``final/`` scored on the test problems (``handed``). A run without one (TRL, grpo_hpc
    without a validation split) hands over its last step, its last evaluation."""
    best = _run(1, [(0, 0.0, 0.2), (40, 10.0, 0.1)]) | {
        "handed": {"accuracy": 0.7, "strict": 0.7, "best": {"step": 15}, "stopped": True},
        "collapses": [{"step": 14, "signal": "no_signal", "action": "STOP"}],
    }
    plain = _run(2, [(0, 0.0, 0.2), (40, 10.0, 0.4)])
    s = summarize([best, plain], 0.8)
    assert s["handed_accuracy_mean"] == pytest.approx(0.55)
    assert s["final_accuracy_mean"] == pytest.approx(0.25)  # the runs' own last evaluations
    assert s["handed_below_half"] == 1
    assert s["collapses_acted_on"] == 1
    assert s["curve_split"] == "validation"
    assert summarize([plain], 0.8)["curve_split"] == "test"


def test_each_curve_names_the_problems_it_scored() -> None:
    """The keep-best systems evaluate their validation split during the run (their test
    figure is the handed-over model's, afterwards); the others evaluate the test problems."""
    from bench.learning.results import curve_problems
    from bench.learning.systems import NUM_VAL

    assert curve_problems("grpo_hpc_rollback", 256) == f"{NUM_VAL} validation"
    assert curve_problems("grpo_hpc_flag", 256) == f"{NUM_VAL} validation"
    assert curve_problems("grpo_hpc", 256) == "256 test"
    assert curve_problems("trl", 256) == "256 test"


def test_async_pairs_with_the_defaults_seed_by_seed() -> None:
    """``grpo_hpc_async`` is the defaults with one change, and its seeds pair with
    ``grpo_hpc``'s: the difference of each seed's handed-over accuracy, its mean and that
    mean's standard error (hand-computed), on the seeds both ran only."""
    from bench.learning.results import paired, paired_line, pairings
    from bench.learning.systems import OPSM_DELTA, SYSTEMS, ZERO_STEP

    # the asynchronous systems measured before 2026-12-06 keep AdamW's step on a zero
    # gradient (ZERO_STEP), so their stored runs mean what they measured; the asynchronous
    # defaults since are grpo_hpc_async_skip_empty
    assert ZERO_STEP == "optim.skip_empty_steps=false"
    assert SYSTEMS["grpo_hpc_async"] == (
        "grpo_hpc",
        [*SYSTEMS["grpo_hpc"][1], "algo.max_staleness=1", ZERO_STEP],
    )
    assert SYSTEMS["grpo_hpc_async_skip_empty"][1] == [
        "algo.max_staleness=1",
        "optim.skip_empty_steps=true",
    ]
    base = [_run(s, [(40, 1.0, a)]) for s, a in ((1, 0.5), (2, 0.7), (3, 0.9), (9, 0.1))]
    other = [_run(s, [(40, 1.0, a)]) for s, a in ((1, 0.6), (2, 0.6), (3, 1.0), (7, 0.0))]
    p = paired(base, other)
    assert p is not None and p["seeds"] == [1, 2, 3]  # 7 and 9 ran on one side only
    # differences +0.1, -0.1, +0.1: mean 1/30, deviations 2/30, -4/30, 2/30, so
    # SE = sqrt((4 + 16 + 4) / 900 / 2 / 3) = 0.0667: the mean is within one SE
    diffs = [0.1, -0.1, 0.1]
    m = sum(diffs) / 3
    se = math.sqrt(sum((d - m) ** 2 for d in diffs) / 2 / 3)
    assert p["diff_mean"] == pytest.approx(m) and p["diff_se"] == pytest.approx(se)
    assert p["base_mean"] == pytest.approx(0.7) and p["other_mean"] == pytest.approx(2.2 / 3)
    assert p["within_one_se"] and (p["other_higher"], p["other_lower"]) == (2, 1)
    far = paired(base, [_run(s, [(40, 1.0, a + 0.2)]) for s, a in ((1, 0.5), (2, 0.71), (3, 0.9))])
    assert far is not None and not far["within_one_se"]  # +0.2, +0.21, +0.2: SE 0.0033
    assert paired(base, [_run(5, [(40, 1.0, 0.5)])]) is None
    systems = {"grpo_hpc": base, "grpo_hpc_async": other, "trl": base}
    assert list(pairings(systems)) == ["grpo_hpc_async - grpo_hpc"]
    # partial rollouts pair the same way, with the two changes they need
    assert SYSTEMS["grpo_hpc_partial"] == (
        "grpo_hpc",
        [*SYSTEMS["grpo_hpc"][1], "algo.max_staleness=2", "rollout.partial_pool=2", ZERO_STEP],
    )
    both = pairings(systems | {"grpo_hpc_partial": other})
    assert list(both) == ["grpo_hpc_async - grpo_hpc", "grpo_hpc_partial - grpo_hpc"]
    # and two steps' batches from one rollout, one update stale at most
    assert SYSTEMS["grpo_hpc_grouped"][1][-3:] == [
        "algo.max_staleness=1",
        "rollout.steps_per_generation=2",
        ZERO_STEP,
    ]
    grouped = pairings(systems | {"grpo_hpc_grouped": other})
    assert list(grouped) == ["grpo_hpc_async - grpo_hpc", "grpo_hpc_grouped - grpo_hpc"]
    assert pairings({"grpo_hpc": base}) == {}
    # off-policy sequence masking pairs with the defaults; the rescue's asynchronous
    # system with the rescue's synchronous one
    assert SYSTEMS["grpo_hpc_async_opsm"][1][-3:] == [
        "algo.max_staleness=1",
        f"algo.offpolicy_mask={OPSM_DELTA}",
        ZERO_STEP,
    ]
    assert SYSTEMS["grpo_hpc_rollback_async"][1] == [
        *SYSTEMS["grpo_hpc_rollback"][1],
        "algo.max_staleness=1",
        ZERO_STEP,
    ]
    rescue = pairings({"grpo_hpc_rollback": base, "grpo_hpc_rollback_async": other})
    assert list(rescue) == ["grpo_hpc_rollback_async - grpo_hpc_rollback"]
    line = paired_line("grpo_hpc_async - grpo_hpc", p)
    assert line.startswith("grpo_hpc_async - grpo_hpc: +0.033 ± 0.067 over 3 paired seeds")
    assert line.endswith("within one standard error")


def test_every_grpo_hpc_system_is_a_config_grpo_submit_accepts() -> None:
    """Each system's settings over the benchmark's shared ones build a valid config (the
    demo config, as the runner's ``create_run`` builds it), on the GPU path and the CPU
    path: a system that a refusal would stop shows up here, not after a GPU call's setup.
    The grouped systems are checked for what they set."""
    from bench.learning.run import overrides, parser
    from bench.learning.systems import SYSTEMS, ZERO_STEP
    from grpo_hpc.config.load import build_config

    args = parser().parse_args(["--out", "unused"])
    for name, (runner, extra) in SYSTEMS.items():
        if runner != "grpo_hpc":
            continue
        for cuda in (True, False):
            cfg = build_config("demo", overrides(args, cuda, seed=500) + list(extra))
            assert cfg.training.max_steps == 40, name
    grouped3 = build_config("demo", overrides(args, True, 500) + SYSTEMS["grpo_hpc_grouped3"][1])
    assert (grouped3.rollout.steps_per_generation, grouped3.algo.max_staleness) == (3, 2)
    rescue = build_config(
        "demo", overrides(args, True, 500) + SYSTEMS["grpo_hpc_rollback_grouped3"][1]
    )
    assert rescue.training.on_collapse == "rollback" and rescue.data.num_val > 0
    assert rescue.rollout.steps_per_generation == 3
    # the asynchronous run's two changes apart: staleness without TIS, TIS without staleness
    caps = {}
    for name in ("grpo_hpc", "grpo_hpc_async", "grpo_hpc_async_notis", "grpo_hpc_sync_tis"):
        cfg = build_config("demo", overrides(args, True, 500) + SYSTEMS[name][1])
        caps[name] = (cfg.algo.max_staleness, cfg.algo.importance_cap)
    assert caps == {
        "grpo_hpc": (0, 0.0),
        "grpo_hpc_async": (1, 2.0),
        "grpo_hpc_async_notis": (1, 0.0),
        "grpo_hpc_sync_tis": (0, 2.0),
    }
    # AdamW's step on a zero gradient: taken where measured before 2026-12-06, skipped by
    # the asynchronous defaults since (grpo_hpc_async_skip_empty)
    from grpo_hpc.train.algo.optimization import skips_empty_steps

    skips = {}
    for name in (
        "grpo_hpc",
        "grpo_hpc_async",
        "grpo_hpc_grouped3",
        "grpo_hpc_async_skip_empty",
        "grpo_hpc_grouped3_skip_empty",
        "grpo_hpc_partial_skip_empty",
    ):
        skips[name] = skips_empty_steps(
            build_config("demo", overrides(args, True, 500) + SYSTEMS[name][1])
        )
    assert skips == {
        "grpo_hpc": False,
        "grpo_hpc_async": False,
        "grpo_hpc_grouped3": False,
        "grpo_hpc_async_skip_empty": True,
        "grpo_hpc_grouped3_skip_empty": True,  # the defaults: unset, on at k >= 1
        "grpo_hpc_partial_skip_empty": True,
    }
    # the grouped and partial systems at the defaults differ from the measured ones by
    # ZERO_STEP alone, so a session's pairs of them differ by the skip alone
    for name in ("grouped3", "partial"):
        assert [*SYSTEMS[f"grpo_hpc_{name}_skip_empty"][1], ZERO_STEP] == (
            SYSTEMS[f"grpo_hpc_{name}"][1]
        )
