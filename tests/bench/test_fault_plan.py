"""The fault campaign's pure parts (bench/faults/plan.py): schedule from a seed, verdicts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.faults.plan import (
    COMBINABLE,
    KINDS,
    SINGLE_NODE,
    TWO_NODE,
    TrialResult,
    batches,
    markdown_table,
    plan_campaign,
    plan_trial,
    summarize,
    verdict,
)


def test_schedule_is_a_function_of_seed_and_index() -> None:
    assert plan_campaign(7, 30) == plan_campaign(7, 30)
    assert plan_campaign(7, 30)[:12] == plan_campaign(7, 12)  # independent of --trials
    assert plan_trial(7, 17) == plan_campaign(7, 30)[17]  # --only reruns the same trial
    assert plan_campaign(7, 30) != plan_campaign(8, 30)


def test_every_kind_recurs_evenly() -> None:
    plans = plan_campaign(1, 100)
    counts = {k: sum(p.kind == k for p in plans) for k in KINDS}
    assert set(counts.values()) == {100 // len(KINDS)}


def test_profiles_and_fault_shapes() -> None:
    for p in plan_campaign(3, 200):
        assert p.profile == (TWO_NODE if p.kind in ("hang_rank", "node_down") else SINGLE_NODE)
        if p.kind == "two_faults":
            assert len(p.faults) == 2 and p.faults[0].kind != p.faults[1].kind
            assert {f.kind for f in p.faults} <= set(COMBINABLE)
        else:
            assert [f.kind for f in p.faults] == [p.kind]
        for f in p.faults:
            assert f.delay_s >= 0 and f.hold_s >= 0 and f.target in (0, 1)
            if f.kind in ("kill_trainer_in_save", "kill_trainer_in_first_step"):
                assert f.delay_s <= 0.3  # inside the slowed-down save / the first step


def test_moments_are_spread() -> None:
    delays = [p.faults[0].delay_s for p in plan_campaign(5, 200) if p.kind == "kill_trainer"]
    assert min(delays) < 2.0 and max(delays) > 6.0


GOOD = TrialResult(
    0, "scancel", SINGLE_NODE, [], finished=True, weights_match=True, jobs_submitted=2,
    max_live_jobs=1,
)  # fmt: skip


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"finished": False, "weights_match": None}, "run did not finish"),
        ({"weights_match": False}, "final weights differ"),
        ({"weights_match": None}, "final weights missing"),
        ({"max_live_jobs": 2}, "2 live jobs of one run at once"),
        ({"bad_checkpoints": 1}, "1 checkpoint(s) fail grpo-ckpt verify"),
        ({"error": "TimeoutError: x"}, "harness: TimeoutError: x"),
    ],
)
def test_verdict_names_each_broken_promise(change: dict, why: str) -> None:
    assert verdict(GOOD) == []
    assert any(why in w for w in verdict(replace(GOOD, **change))), verdict(replace(GOOD, **change))


def test_summary_counts() -> None:
    bad = replace(GOOD, index=1, kind="disk_full", weights_match=False, recover_s=4.0)
    ok = replace(GOOD, recover_s=2.0, wall_s=10.0)
    s = summarize([ok, bad])
    assert s["total"]["trials"] == 2 and s["total"]["passed"] == 1
    assert s["total"]["weights_identical"] == 1 and s["total"]["recover_s_max"] == 4.0
    assert s["by_kind"]["disk_full"]["passed"] == 0
    assert s["failed"] == [{"index": 1, "kind": "disk_full", "why": [verdict(bad)[0]]}]


def test_batches_keep_cluster_wide_faults_alone() -> None:
    plans = plan_campaign(1, 10)  # kinds in KINDS order: 5 restart_slurmctld, 7 node_down
    groups = [[p.index for p in g] for g in batches(plans, 3)]
    assert groups == [[0, 1, 2], [3, 4], [5], [6], [7], [8, 9]]
    assert [[p.index for p in g] for g in batches(plans[:3], 1)] == [[0], [1], [2]]


def test_markdown_table_rows() -> None:
    table = markdown_table(summarize([replace(GOOD, recover_s=2.0, wall_s=10.0)]))
    lines = table.splitlines()
    assert len(lines) == 4 and lines[2].startswith("| `scancel` | 1 | 1 | 1 | 1 | 2 | 0 | 0 |")
    assert lines[3].startswith("| **total** | 1 | 1 |")
