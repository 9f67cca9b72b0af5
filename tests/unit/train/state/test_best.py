"""Keep-best's decisions, pinned as tables (pure): which score beats which, the record after
an evaluation, what retention spares, what final/ and last/ hold, the selection metric,
and the --samples lines. The trainer runs them in tests/e2e/test_keep_best.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from grpo_hpc.config.schema import DataConfig
from grpo_hpc.core.best import BestRecord, better, read_best, write_best
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
    assert improved and first.step == 0 and first.evaluations == 1
    worse, improved = next_best(first, 2, "accuracy", 0.125)
    assert not improved and worse.step == 0 and worse.evaluations == 2
    new, improved = next_best(worse, 4, "accuracy", 0.5)
    assert improved and (new.step, new.checkpoint, new.evaluations) == (4, "step-4", 3)
    # a record of another metric (the config changed between attempts) is replaced
    other, improved = next_best(new, 6, "pass@1", 0.0)
    assert improved and other.metric == "pass@1" and other.step == 6


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
        ("best", _best(0, ""), [10], (10, None)),  # none beat step 0 (no checkpoint)
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
