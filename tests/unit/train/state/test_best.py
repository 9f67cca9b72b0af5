"""Keep-best's decisions, pinned as tables (pure): which score beats which, the record after
an evaluation, what retention spares, what final/ and last/ hold, the selection metric,
and the --samples lines. The trainer runs them in tests/e2e/test_keep_best.py."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from grpo_hpc.config.schema import DataConfig
from grpo_hpc.core.best import BestRecord, better, eval_noise, read_best, unreadable, write_best
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.export.run import final_steps
from grpo_hpc.status.view import eval_samples_lines
from grpo_hpc.tasks.problems import Splits, load_splits
from grpo_hpc.train.evaluation.held_out import select_metric
from grpo_hpc.train.state.best import next_best
from grpo_hpc.train.state.checkpoint import pruned


@pytest.mark.parametrize(
    ("new", "old", "mode", "wins"),
    [
        (0.5, None, "max", True),  # nothing recorded: any score
        (0.5, 0.4, "max", True),
        (0.4, 0.5, "max", False),
        (0.5, 0.5, "max", False),  # a tie keeps the earlier checkpoint
        (0.3, 0.4, "min", True),
        (0.5, 0.4, "min", False),
        (math.nan, 0.1, "max", False),  # a NaN never wins
        (0.0, math.nan, "max", True),  # nor stands in the way
    ],
)
def test_better(new: float, old: float | None, mode: str, wins: bool) -> None:
    assert better(new, old, mode) is wins


def test_next_best_counts_every_evaluation_and_names_the_checkpoint() -> None:
    first, improved = next_best(None, 0, "accuracy", 0.25, split="v", problems=8)
    assert improved and first.step == 0 and first.evaluations == 1 and first.checkpoint == ""
    worse, improved = next_best(first, 2, "accuracy", 0.125, checkpoint="step-2")
    assert not improved and worse.step == 0 and worse.evaluations == 2
    new, improved = next_best(worse, 4, "accuracy", 0.5, checkpoint="step-4")
    assert improved and (new.step, new.checkpoint, new.evaluations) == (4, "step-4", 3)
    # a record of another metric (the config changed between attempts) is replaced
    other, improved = next_best(new, 6, "pass@1", 0.0)
    assert improved and other.metric == "pass@1" and other.step == 6


def _replay(scores: list[tuple[int, float]], problems: int, mode: str = "max") -> BestRecord:
    """The record after evaluations (step, score) in order, each of ``problems`` problems."""
    rec = None
    for step, score in scores:
        rec, _ = next_best(rec, step, "accuracy", score, mode=mode, problems=problems)
    assert rec is not None
    return rec


def test_eval_noise_is_the_collapse_detectors() -> None:
    from grpo_hpc.train.supervision.collapse import Thresholds, Watch, _noise

    assert eval_noise(0.75, 32) == pytest.approx(2 * (0.75 * 0.25 / 32) ** 0.5)
    assert eval_noise(0.75, 0) == 0.0  # problems unknown: no noise allowed for
    watch, th = Watch(problems=32), Thresholds(eval_sigmas=3.0)
    assert _noise(watch, th, 0.6) == eval_noise(0.6, 32, 3.0)


def test_the_demo_hands_over_the_newest_model_within_noise_of_the_peak() -> None:
    """The demo's validation scores (32 problems): 0.75 at step 10 was a lucky draw; steps
    20 and 30 (22/32) match it within noise, and step 30 trained longest."""
    rec = _replay([(0, 0.22), (10, 0.75), (20, 22 / 32), (30, 22 / 32)], 32)
    assert (rec.step, rec.score, rec.peak, rec.evaluations) == (30, 22 / 32, (0.75, 10), 4)
    assert rec.why() == (
        "step 30: accuracy 0.688, within noise (±0.153, 32 problems) of the peak 0.750 at step 10"
    )
    tie = _replay([(0, 0.0), (2, 0.5), (4, 0.5)], 8)  # a tie says so, not "within noise"
    assert tie.why() == "step 4: accuracy 0.500, equal to the peak at step 2"


@pytest.mark.parametrize(
    ("scores", "problems", "want"),
    [
        # a fall beyond the noise: the peak stays the model to hand over
        ([(0, 0.2), (10, 0.75), (20, 0.5), (30, 0.5)], 32, 10),
        # within noise, then beyond it: the last one that matched stays
        ([(0, 0.2), (10, 0.75), (20, 0.7), (30, 0.5)], 32, 20),
        # a slow drift down: each step within noise of the one before, never of the peak
        ([(0, 0.1), (10, 0.8), (20, 0.72), (30, 0.65), (40, 0.58), (50, 0.5)], 32, 20),
        # the start beats every later evaluation beyond the noise: the start
        ([(0, 0.5), (10, 0.2), (20, 0.1)], 32, 0),
        # ties with no noise to allow for (problems unknown): the newer one
        ([(0, 0.2), (10, 0.5), (20, 0.5)], 0, 20),
        # a NaN never is the model to hand over
        ([(0, 0.2), (10, float("nan"))], 32, 0),
    ],
)
def test_next_best_never_hands_over_a_model_significantly_below_the_peak(
    scores: list[tuple[int, float]], problems: int, want: int
) -> None:
    rec = _replay(scores, problems)
    assert rec.step == want
    peak = max(s for _, s in scores if s == s)
    assert rec.peak[0] == peak and rec.score >= peak - eval_noise(peak, problems)


def test_a_record_whose_checkpoint_is_gone_is_compared_afresh() -> None:
    """KeepBest reads a record whose checkpoint was set aside as NaN (score and peak): the
    next evaluation is the model to hand over, whatever it scores, and the new peak."""
    rec = _replay([(0, 0.2), (10, 0.9)], 32)
    gone = dataclasses.replace(rec, score=math.nan, peak_score=math.nan)
    new, chosen = next_best(gone, 20, "accuracy", 0.1, problems=32, checkpoint="step-20")
    assert chosen and (new.step, new.peak, new.checkpoint, new.evaluations) == (
        20, (0.1, 20), "step-20", 3
    )  # fmt: skip


def test_next_best_lower_is_better() -> None:
    rec = _replay([(0, 0.5), (10, 0.2), (20, 0.25), (30, 0.6)], 32, mode="min")
    assert (rec.step, rec.peak) == (20, (0.2, 10))


def test_record_written_before_the_peak_was_kept_reads_its_score_as_the_peak(
    tmp_path: Path,
) -> None:
    old = {"step": 10, "metric": "accuracy", "score": 0.75, "checkpoint": "step-10",
           "problems": 32, "evaluations": 2}  # fmt: skip
    (tmp_path / "best.json").write_text(json.dumps(old))
    rec = read_best(tmp_path)
    assert rec is not None and rec.peak == (0.75, 10)
    new, chosen = next_best(rec, 20, "accuracy", 0.5, problems=32)
    assert not chosen and (new.step, new.peak, new.evaluations) == (10, (0.75, 10), 3)


@pytest.mark.parametrize("text", ["[]", "3", '"best"', "null", '{"step": 1}'])
def test_best_json_that_is_no_record_reads_as_none(tmp_path: Path, text: str) -> None:
    (tmp_path / "best.json").write_text(text)
    assert read_best(tmp_path) is None
    assert unreadable(tmp_path)


def test_record_round_trip_and_unreadable_file(tmp_path: Path) -> None:
    assert read_best(tmp_path) is None
    rec = BestRecord(step=3, metric="accuracy", score=0.5, checkpoint="step-3")
    write_best(tmp_path, rec)
    assert read_best(tmp_path) == rec
    (tmp_path / "best.json").write_text("{not json")
    assert read_best(tmp_path) is None


@pytest.mark.parametrize(
    ("complete", "keep", "protected", "deleted"),
    [
        ([2, 4, 6], 1, set(), [2, 4]),
        ([2, 4, 6], 1, {2}, [4]),  # the best survives keep_last=1
        ([2, 4, 6], 2, {6}, [2]),  # a best among the newest costs nothing
        ([2, 4, 6], 0, {2}, []),  # 0 keeps all
        ([], 1, {2}, []),
    ],
)
def test_retention_spares_the_best(
    complete: list[int], keep: int, protected: set[int], deleted: list[int]
) -> None:
    assert pruned(complete, keep, protected) == deleted


def _best(step: int, checkpoint: str | None = None) -> BestRecord:
    return BestRecord(step, "accuracy", 0.5, f"step-{step}" if checkpoint is None else checkpoint)


@pytest.mark.parametrize(
    ("mode", "best", "complete", "want"),
    [
        ("best", _best(4), [4, 10], (4, 10)),  # final/ the best, last/ the last
        ("best", _best(10), [10], (10, 10)),  # the best was the last: last/ the same
        ("last", _best(4), [4, 10], (10, None)),
        ("best", None, [10], (10, None)),  # no evaluation: final/ is the last
        ("best", _best(0, ""), [10], (0, 10)),  # the start beat every later evaluation
        ("last", _best(0, ""), [10], (10, None)),
        ("best", _best(4), [10], (10, None)),  # its checkpoint gone (a rewind)
    ],
)
def test_final_and_last(
    mode: str, best: BestRecord | None, complete: list[int], want: tuple[int, int | None]
) -> None:
    assert final_steps(mode, best, 10, complete) == want


def test_validation_split_is_disjoint_and_chooses_the_metric() -> None:
    splits = load_splits(DataConfig(source="arithmetic", num_train=64, num_eval=8, num_val=8), 0)
    assert len(splits.validation) == 8
    seen = {p["question"] for p in splits.train + splits.test}
    assert seen.isdisjoint(p["question"] for p in splits.validation)
    # the train and test problems are those of a run without a validation split
    none = load_splits(DataConfig(source="arithmetic", num_train=64, num_eval=8, num_val=0), 0)
    assert (none.train, none.test, none.validation) == (splits.train, splits.test, [])
    assert select_metric("auto", splits) == "accuracy"
    assert select_metric("accuracy_strict", splits) == "accuracy_strict"
    assert select_metric("auto", none) is None  # the test split chooses nothing
    code = Splits([], [{"question": "q", "gold": "", "tests": ["assert f()"]}], [])
    assert select_metric("auto", code) == "pass@1"
    with pytest.raises(ConfigError, match="select_metric=accuracy"):
        select_metric("accuracy", code)


def test_samples_lines_fit_and_put_the_wrong_ones_first() -> None:
    rows = [
        {"question": "q" * 300, "completion": "c" * 300, "answer": str(i), "gold": "1",
         "verdict": float(i == 1)}
        for i in range(6)
    ]  # fmt: skip
    lines = eval_samples_lines(7, rows, n=2, width=80)
    assert lines[0] == "evaluation at step 7: 1/6 right"
    assert lines[1] == "worst 2:" and lines[2].startswith("  wrong gold 1, got 0 |")
    assert lines[4] == "best 1:" and lines[5].startswith("  right gold 1, got 1 |")
    assert all(len(x) <= 80 for x in lines) and lines[2].endswith("...")


def test_a_stall_after_a_peak_at_the_start_hands_over_the_start() -> None:
    """Seed 407 of the learning benchmark (2026-12-04, 128 validation problems): peak 0.19
    at the start, then a stall at 0.09-0.13. 0.13 is within noise of 0.19, but noise cannot
    tell it from the start either: the start is handed over, not the stalled model."""
    rec = _replay([(0, 0.1875), (5, 0.09), (10, 0.133), (20, 0.07), (30, 0.133)], 128)
    assert (rec.step, rec.peak, rec.start_score) == (0, (0.1875, 0), 0.1875)
    learned = _replay([(0, 0.16), (5, 0.34), (10, 0.27)], 128)  # 0.27 beats the start
    assert (learned.step, learned.peak) == (10, (0.34, 5))


def test_retention_keeps_the_peak_a_collapse_rolls_back_to(tmp_path: Path) -> None:
    from grpo_hpc.core.paths import RunPaths
    from grpo_hpc.train.state.checkpoint import protected_steps

    write_best(tmp_path, _replay([(0, 0.16), (5, 0.34), (10, 0.27)], 128))
    assert protected_steps(RunPaths(tmp_path)) == {5, 10}
