"""The fault campaign's pure parts (bench/faults/plan.py, bench/faults/strike.py): schedule
from a seed and a placement, which processes a fault strikes, verdicts."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace

import pytest

from bench.faults.plan import (
    COMBINABLE,
    HANG_LIMIT_S,
    KINDS,
    PLACEMENT_OVERRIDES,
    ROLE_KINDS,
    SINGLE_NODE,
    SPLIT_NODE,
    TWO_NODE,
    TWO_NODE_KINDS,
    Fault,
    TrialPlan,
    TrialResult,
    batches,
    first_decision,
    kinds_for,
    markdown_table,
    plan_campaign,
    plan_trial,
    summarize,
    verdict,
)
from bench.faults.strike import struck_pids


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


SYNC_SEED1_DIGEST = "f07028ebfa04b8a9864b2f692d5c8a5795e49c90c36919e64e180363ea4e36a1"
"""sha256 of trials 0-99 of seed 1 (index, kind, profile, faults) as the code made them
before placements existed: the 100-trial campaign (faults_cpu_2026-11-23.json) and CI's
trials 1, 33, 4 keep their meaning."""


def test_the_synchronous_schedule_is_the_one_before_placements() -> None:
    plans = [plan_trial(1, i) for i in range(100)]
    rows = [[p.index, p.kind, p.profile, [asdict(f) for f in p.faults]] for p in plans]
    assert hashlib.sha256(json.dumps(rows).encode()).hexdigest() == SYNC_SEED1_DIGEST
    save = Fault("kill_trainer_in_save", 0.288)
    assert plan_trial(1, 1) == TrialPlan(1, "kill_trainer_in_save", SINGLE_NODE, (save,))
    assert plan_trial(1, 1) == plan_trial(1, 1, "sync") and plans[1].placement == "sync"
    assert kinds_for("sync") == KINDS and PLACEMENT_OVERRIDES["sync"] == ()


def test_split_kinds_strike_one_role_then_every_synchronous_kind() -> None:
    kinds = kinds_for("split")
    assert kinds == (*ROLE_KINDS, *KINDS)
    plans = plan_campaign(1, 3 * len(kinds), "split")
    assert [p.kind for p in plans] == list(kinds) * 3
    assert {p.placement for p in plans} == {"split"}
    for p in plans:  # two nodes of one process each: the trainer's, the generator's
        assert p.profile == (TWO_NODE if p.kind in TWO_NODE_KINDS else SPLIT_NODE)
    for p in plans:
        if p.kind in ROLE_KINDS:
            assert [f.kind for f in p.faults] == [p.kind] and 0 <= p.faults[0].delay_s <= 2.0
    assert not set(ROLE_KINDS) & {f.kind for p in plans if p.kind == "two_faults" for f in p.faults}
    assert PLACEMENT_OVERRIDES["split"] == ("algo.max_staleness=1", "rollout.placement=split")


def test_thread_placement_plans() -> None:
    plans = plan_campaign(1, 20, "thread")
    assert [p.kind for p in plans] == list(kinds_for("thread")) * 2
    assert all(p.placement == "thread" for p in plans)
    for p in plans:
        assert p.profile == (TWO_NODE if p.kind in TWO_NODE_KINDS else SINGLE_NODE)
    assert plans != plan_campaign(1, 20)  # moments of its own, not the synchronous ones
    assert PLACEMENT_OVERRIDES["thread"] == ("algo.max_staleness=1",)
    with pytest.raises(ValueError, match="unknown placement"):
        plan_trial(1, 0, "threads")


# pid -> rank of a split run (trainer rank 0, generator rank 1) and of a two-rank DDP run
SPLIT_PIDS = {4711: 0, 4712: 1}


@pytest.mark.parametrize(
    ("kind", "pids", "target", "struck"),
    [
        ("kill_generator", SPLIT_PIDS, 0, [4712]),
        ("hang_generator", SPLIT_PIDS, 0, [4712]),
        ("kill_trainer_only", SPLIT_PIDS, 0, [4711]),
        ("kill_generator", {10: 0, 11: 1, 12: 2}, 0, [12]),  # the last rank
        ("kill_generator", {4711: 0}, 0, []),  # no second role up: nothing
        ("kill_trainer_only", {4712: 1}, 0, []),
        ("kill_trainer", SPLIT_PIDS, 0, [4711, 4712]),  # the whole job
        ("kill_trainer_in_save", SPLIT_PIDS, 0, [4711, 4712]),
        ("hang_rank", SPLIT_PIDS, 1, [4712]),
        ("hang_rank", {4711: 0}, 1, [4711]),
    ],
)
def test_which_processes_a_fault_strikes(kind, pids, target, struck) -> None:  # noqa: ANN001
    assert struck_pids(kind, pids, target) == struck


def test_first_decision_after_the_fault() -> None:
    events = [
        {"phase": "decision", "action": "RESUBMIT", "class": "crash", "reason": "old", "time": 5},
        {"phase": "intent", "action": "RESUBMIT", "class": "crash", "reason": "x", "time": 11},
        {"phase": "decision", "action": "NONE", "class": "-", "reason": "", "time": 12},
        {"phase": "decision", "action": "RESUBMIT", "class": "stalled_phase",
         "reason": "generator (rank 1 on n) stopped answering", "time": 74.25},
        {"phase": "decision", "action": "DONE", "class": "finished", "reason": "", "time": 90},
    ]  # fmt: skip
    assert first_decision(events, 10.0) == (
        "stalled_phase: generator (rank 1 on n) stopped answering",
        64.2,
    )
    assert first_decision(events[-1:], 10.0) == ("", None)


HUNG = (
    "stalled_phase: trainer stalled at step 2/6: generator (rank 1 on localhost) stopped answering"
)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"decision": "stalled_heartbeat: no heartbeat for 20 s"}, "does not say"),
        ({"decision": HUNG.replace("stalled_phase", "crash")}, "['stalled_phase']"),
        ({"decision": "stalled_phase: trainer stalled: rank 1 stopped answering"},
         "['generator (rank']"),
        ({"act_s": HANG_LIMIT_S + 1}, "the monitor acted"),
        ({"act_s": None, "decision": ""}, "the monitor acted None s"),
        ({"kind": "kill_generator", "decision": "crash: job FAILED exit 1"}, "'generator (rank'"),
        ({"kind": "kill_trainer_only", "decision": "crash: generator (rank 1) was killed"},
         "['trainer (rank', 'SIGKILL']"),
    ],
)  # fmt: skip
def test_a_role_fault_must_be_named_and_a_hang_caught_in_time(change: dict, why: str) -> None:
    ok = replace(
        GOOD, kind="hang_generator", profile=SPLIT_NODE, struck=1, decision=HUNG, act_s=63.0
    )
    assert verdict(ok) == []
    bad = replace(ok, **change)
    assert any(why in w for w in verdict(bad)), verdict(bad)
    assert verdict(replace(bad, struck=0)) == []  # a fault that never struck judges nothing
    killed = "crash: job FAILED at step 2: generator (rank 1, pid 9 on n) was killed by SIGKILL"
    assert verdict(replace(ok, kind="kill_generator", decision=killed, act_s=200.0)) == []


def test_summary_and_table_list_role_kinds_after_the_synchronous_ones() -> None:
    named = "crash: trainer (rank 0, pid 9 on n) was killed by SIGKILL"
    rows = [replace(GOOD, kind=k, struck=1, decision=named) for k in ROLE_KINDS[:2]]
    s = summarize([*rows, GOOD])  # the first one fails: its decision names the trainer
    assert list(s["by_kind"]) == ["scancel", "kill_generator", "kill_trainer_only"]
    assert "| `kill_generator` | 1 | 0 |" in markdown_table(s)
    assert "| `kill_trainer_only` | 1 | 1 |" in markdown_table(s)
