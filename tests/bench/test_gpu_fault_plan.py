"""The GPU fault campaign's pure parts (bench/faults/gpu_plan.py): the schedule, the
verdict of each fault kind, the per-kind table."""

from __future__ import annotations

from dataclasses import replace

from bench.faults.gpu_plan import (
    KINDS,
    RANK_LIMIT_S,
    GpuTrialResult,
    markdown_table,
    plan_trial,
    repeated_steps,
    summarize,
    verdict,
)


def test_every_kind_recurs_and_a_trial_depends_on_seed_and_index_only() -> None:
    plans = [plan_trial(3, i) for i in range(18)]
    assert [p.kind for p in plans] == list(KINDS) * 3
    assert plan_trial(3, 7) == plans[7] and plan_trial(4, 7) != plans[7]
    assert all(p.target in (0, 1) for p in plans)
    assert all(p.delay_s == 0 for p in plans if p.kind in ("time_limit", "cuda_oom"))


def test_repeated_steps() -> None:
    assert repeated_steps([1, 2, 3, 4, 3, 4, 5, 6]) == [3, 4]
    assert repeated_steps([1, 2, 3]) == []


def _good(kind: str) -> GpuTrialResult:
    r = GpuTrialResult(0, kind, 1, finished=True, jobs_submitted=2, max_live_jobs=1)
    r.attempts, r.resumes, r.ended_s = 2, 2, 60.0
    r.reason = "rank 1 stopped answering (no pulse for 60 s) at step 4"
    r.decisions = ["stalled_step0 CANCEL_AND_RESUBMIT", "finished DONE"]
    return r


def test_each_kind_passes_only_as_promised() -> None:
    for kind in KINDS:
        if kind != "cuda_oom":
            assert verdict(_good(kind), save_every=2) == [], kind
    slow = replace(_good("hang_rank"), ended_s=RANK_LIMIT_S + 1)
    assert "job ended 121.0 s after the fault" in verdict(slow, 2)[0]
    assert verdict(replace(_good("kill_rank"), resumes=0), 2) == [
        "no resume from a checkpoint was seen"
    ]
    bad = replace(_good("kill_rank"), resume_mismatch=["resume-a1-step4-rank1.json: rng"])
    assert verdict(bad, 2) == ["resumed state differs from its checkpoint: "
                               "resume-a1-step4-rank1.json: rng"]  # fmt: skip
    assert verdict(replace(_good("kill_rank"), steps_repeated=[3, 4, 5]), 2) == [
        "steps [3, 4, 5] repeated (more than the checkpoint interval)"
    ]
    assert verdict(replace(_good("time_limit"), attempts=1), 2) == [
        "the run never hit its time limit"
    ]
    assert verdict(replace(_good("step0_stall"), decisions=["finished DONE"]), 2) == [
        "the monitor never called it stalled_step0"
    ]
    assert "duplicate" not in str(verdict(_good("kill_rank"), 2))
    assert verdict(replace(_good("kill_rank"), max_live_jobs=2), 2) == [
        "2 live jobs of one run at once"
    ]


def test_an_oom_passes_when_stopped_once_never_resubmitted() -> None:
    oom = GpuTrialResult(5, "cuda_oom", 1, stopped="out_of_memory", jobs_submitted=1)
    assert verdict(oom, 2) == []
    assert verdict(replace(oom, jobs_submitted=2), 2) != []
    assert verdict(replace(oom, stopped=""), 2) != []


def test_summary_and_table() -> None:
    rows = [_good("kill_rank"), replace(_good("kill_rank"), ended_s=90.0, max_live_jobs=2)]
    s = summarize(rows, 2)
    k = s["by_kind"]["kill_rank"]
    assert (k["trials"], k["passed"], k["duplicate_job_trials"]) == (2, 1, 1)
    assert k["ended_s"] == "90 / 90" and k["resumes_exact"] == "4 / 4"
    assert s["failed"] == [{"index": 0, "kind": "kill_rank",
                            "why": ["2 live jobs of one run at once"]}]  # fmt: skip
    table = markdown_table(s).splitlines()
    assert table[0].startswith("| kind | trials | passed |") and len(table) == 4
    assert table[2].startswith("| `kill_rank` | 2 | 1 |")
