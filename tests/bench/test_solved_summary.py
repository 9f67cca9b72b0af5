"""bench/collapse/solved_summary.py: what the GPU stage ``solved`` reports of a run (pure)."""

from __future__ import annotations

from bench.collapse.solved_summary import summarize


def test_counts_solved_steps_their_longest_run_and_what_was_handed_over() -> None:
    rows = [
        {"step": 0, "eval/accuracy": 0.8},
        *(
            {"step": s, "loss": 0.0, "rollout/solved": v}
            for s, v in enumerate([0.5, 1.0, 1.0, 0.75, 1.0, 1.0, 1.0], start=1)
        ),  # fmt: skip
        {"step": 7, "eval/accuracy": 0.97},
    ]
    events = [{"phase": "solved", "action": "FINISH", "step": 7}, {"phase": "decision"}]
    progress = {"state": "finished", "exit_code": 0, "reason": "task solved", "max_steps": 60}
    s = summarize(rows, events, progress, {"step": 7})
    assert (s["steps"], s["steps_all_solved"], s["longest_all_solved"]) == (7, 5, 3)
    assert s["solved_events"] == events[:1] and s["collapse_events"] == []
    assert s["final_step"] == 7 and s["validation_accuracy"] == [(0, 0.8), (7, 0.97)]
    assert summarize([], [], {}, None)["final_step"] is None
