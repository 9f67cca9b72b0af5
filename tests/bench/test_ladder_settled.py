"""bench/memory/ladder.py keeps a measured row only while the estimator still resolves the
settings it ran: a field the row predates counts as its default, any other difference
(a new plan) makes the row run again."""

from __future__ import annotations

import dataclasses
import json

from bench.memory import ladder
from grpo_hpc.memory import estimate as memory
from grpo_hpc.memory.fit import Plan

SETTINGS = memory.Settings(ranks=2, strategy="ddp", precision="fp16", rows=64, lora_rank=16)
PLAN = Plan(SETTINGS, memory.estimate(ladder.load_shape("qwen2.5-0.5b"), SETTINGS), 32.0)


def _row(**changes: object) -> dict:
    ran = json.loads(json.dumps(dataclasses.asdict(SETTINGS)))
    return {"run_settings": {**ran, **changes}}


def test_the_same_settings_keep_the_row() -> None:
    assert ladder.same_settings(_row(), PLAN)


def test_a_field_the_row_predates_counts_as_its_default() -> None:
    row = _row()
    del row["run_settings"]["release_engine"]  # rows measured before the field existed
    assert ladder.same_settings(row, PLAN)


def test_a_new_plan_reruns_the_row() -> None:
    assert not ladder.same_settings(_row(engine="hf"), PLAN)
    assert not ladder.same_settings(_row(release_engine=True), PLAN)
    assert not ladder.same_settings({}, PLAN)  # never ran


def test_merge_takes_the_rows_each_copy_changed() -> None:
    def row(shape: str, status: str) -> dict:
        return {"shape": shape, "budget": "h100", "mode": "full", "gpus": 2, "status": status}

    base = [row("a", "timeout"), row("b", "timeout"), row("c", "fits")]
    first = [row("a", "fits"), row("b", "timeout"), row("c", "fits")]  # ran a
    second = [row("a", "timeout"), row("b", "oom"), row("c", "fits"), row("d", "fits")]
    merged = ladder.merge_rows(base, [first, second])
    # the second copy still holds a's old row: it must not undo the first copy's new one
    assert sorted((r["shape"], r["status"]) for r in merged) == [
        ("a", "fits"), ("b", "oom"), ("c", "fits"), ("d", "fits"),
    ]  # fmt: skip
    assert ladder.merge_rows(base, [base]) == base  # an untouched copy changes nothing
