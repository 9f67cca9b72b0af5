"""grpo-status's run view on keep-best (pure): which model is the one to hand over and why,
and what final/ holds, from a run's row."""

from __future__ import annotations

from grpo_hpc.core.best import BestRecord
from grpo_hpc.status.view import RunRow, best_line, final_line


def _row(rec: BestRecord, final_step: int | None) -> RunRow:
    return RunRow(
        run="r",
        final_model="/logs/r/final" if final_step is not None else None,
        final_step=final_step,
        best_step=rec.step,
        best_metric=rec.metric,
        best_score=rec.score,
        best_why=rec.why(),
    )


def test_within_noise_of_the_peak_says_so() -> None:
    rec = BestRecord(30, "accuracy", 22 / 32, "step-30", problems=32, evaluations=4,
                     peak_score=0.75, peak_step=10)  # fmt: skip
    row = _row(rec, 30)
    assert best_line(row) == (
        "best: step 30: accuracy 0.688, within noise (±0.153, 32 problems) of the peak "
        "0.750 at step 10 on validation (checkpoint step-30; grpo-export r OUT --best)"
    )
    assert final_line(row).startswith(
        "final model: /logs/r/final (step 30: accuracy 0.688, within noise"
    )


def test_the_start_that_beat_every_later_evaluation_is_the_final_model() -> None:
    rec = BestRecord(0, "accuracy", 0.4, "", problems=32, evaluations=4,
                     peak_score=0.4, peak_step=0)  # fmt: skip
    row = _row(rec, 0)
    assert final_line(row) == (
        "final model: /logs/r/final (step 0, the start: accuracy 0.400 beat every later "
        "evaluation; the last step's model in last/; grpo-eval /logs/r/final)"
    )
    assert "(the run's model directory; grpo-export r OUT --best)" in best_line(row)
