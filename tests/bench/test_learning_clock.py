"""bench/learning/run.py's clock: evaluation time is excluded, training time counted."""

from __future__ import annotations

from bench.learning.run import curve_from_metrics, time_to


def _eval(step: int, t: float, acc: float) -> dict:
    return {"step": step, "time": t, "eval/accuracy": acc, "eval/accuracy_strict": acc / 2}


def _step(step: int, t: float) -> dict:
    return {"step": step, "time": t, "reward/mean": 0.5}


def test_eval_segments_do_not_count() -> None:
    # eval 0 ends at t=100 (setup and the eval before it never count); steps take 10 s;
    # the eval after step 2 takes 50 s, which must not move the clock.
    rows = [
        _eval(0, 100.0, 0.1),
        _step(1, 110.0),
        _step(2, 120.0),
        _eval(2, 170.0, 0.5),
        _step(3, 180.0),
        _step(4, 190.0),
        _eval(4, 260.0, 0.9),
    ]
    curve = curve_from_metrics(rows)
    assert [(e["step"], e["s"], e["accuracy"]) for e in curve["evals"]] == [
        (0, 0.0, 0.1),
        (2, 20.0, 0.5),
        (4, 40.0, 0.9),
    ]
    assert [s["s"] for s in curve["steps"]] == [10.0, 20.0, 30.0, 40.0]
    assert time_to(curve["evals"], 0.8) == 40.0
    assert time_to(curve["evals"], 0.5) == 20.0
    assert time_to(curve["evals"], 0.95) is None
