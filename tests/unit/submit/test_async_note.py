"""The ``note:`` line of an asynchronous run that would hand over its last step
(``submit.plan.async_learning_note``): on the learning benchmark k = 1's last step learned
worse than the synchronous step's, while keep-best with the rescue handed over as good a
model (docs/async.md), so a run without them is told what to set."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_hpc.config.load import build_config
from grpo_hpc.config.profiles import load_profile
from grpo_hpc.core.errors import ExitCode
from grpo_hpc.submit.plan import async_learning_note, async_speed_note

from .test_preflight import _grpo_submit

HANDED = ["training.eval_every=5", "data.num_val=8", "training.final=best"]
"""A tiny run that keeps the best (its validation split evaluated) and rolls back."""


@pytest.mark.parametrize(
    ("overrides", "missing", "fix"),
    [
        (["algo.max_staleness=0"], None, None),  # synchronous: nothing to say
        ([], None, None),  # keep-best and the rescue (on_collapse=rollback, the default)
        (["data.num_val=0"], "a validation split", "data.num_val=32"),
        (["training.eval_every=0"], "evaluations", "training.eval_every=N"),
        (["training.final=last"], "keep-best", "training.final=best"),
        (["training.on_collapse=flag"], "the rescue", "training.on_collapse=rollback"),
        (
            ["data.num_val=0", "training.on_collapse=stop"],
            "a validation split and the rescue",
            "data.num_val=32 training.on_collapse=rollback",
        ),
    ],
)
def test_the_note_names_what_an_asynchronous_run_lacks(
    overrides: list[str], missing: str | None, fix: str | None
) -> None:
    cfg = build_config("tiny", [*HANDED, "algo.max_staleness=1", *overrides])
    note = async_learning_note(cfg)
    if missing is None:
        assert note == ""
        return
    assert note.startswith(f"note: asynchronous without {missing}: ")
    assert note.endswith(f"set {fix}") and "docs/async.md" in note


def test_dry_run_and_submit_print_the_note_only_for_an_asynchronous_run(tmp_path: Path) -> None:
    """Through the installed grpo-submit: the tiny config evaluates nothing, so its
    asynchronous run is told; the same run with evaluations, or synchronous, is not."""
    env = {"GRPO_HPC_LOGS": str(tmp_path / "logs")}
    args = ("--profile", "local", "--config", "tiny", "--dry-run")
    told = _grpo_submit(*args, "algo.max_staleness=1", env=env)
    assert told.returncode == ExitCode.OK, told.stderr
    [note] = [x for x in told.stdout.splitlines() if x.startswith("note: ")]
    assert "without evaluations" in note and note.endswith("set training.eval_every=N")
    for quiet in (("algo.max_staleness=1", "training.eval_every=2"), ()):
        result = _grpo_submit(*args, *quiet, env=env)
        assert result.returncode == ExitCode.OK, result.stderr
        assert "note: " not in result.stdout
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(
    ("profile", "overrides", "told"),
    [
        ("h100x2", [], True),  # a generator thread beside each rank's update, on its GPU
        ("supercloud", [], True),
        ("local", [], False),  # no GPU: nothing measured to say
        ("h100x2", ["algo.max_staleness=0"], False),
        ("h100x2", ["rollout.placement=split"], False),  # generation GPUs of its own
        ("h100x2", ["rollout.steps_per_generation=2"], False),  # no thread: nothing beside
    ],
)
def test_the_speed_note_is_for_the_thread_placement_on_gpus(
    profile: str, overrides: list[str], told: bool
) -> None:
    """On one H100 and one H200 the thread placement gained 1.0-1.2x a synchronous step
    (bench/results/LOG-speed.md): a run that shares each GPU between its update and its
    generator thread is told so, and where else generation can run."""
    cfg = build_config("tiny", ["algo.max_staleness=1", *overrides])
    note = async_speed_note(cfg, load_profile(profile))
    assert bool(note) == told
    if told:
        assert note.startswith("note: asynchronous beside the update on the same GPU: ")
        assert "1.0-1.2x" in note and "rollout.placement=split" in note
        assert "rollout.steps_per_generation=M" in note


def test_dry_run_says_a_grouped_run_generates_several_steps_at_once(tmp_path: Path) -> None:
    """Through the installed grpo-submit: ``rollout.steps_per_generation=2`` is placed in
    the trainer (no thread, no copy), at most 1 update stale; a bound below it is refused
    with the fix."""
    env = {"GRPO_HPC_LOGS": str(tmp_path / "logs")}
    args = ("--profile", "local", "--config", "tiny", "--dry-run")
    ok = _grpo_submit(*args, "algo.max_staleness=1", "rollout.steps_per_generation=2", env=env)
    assert ok.returncode == ExitCode.OK, ok.stderr
    [line] = [x for x in ok.stdout.splitlines() if x.startswith("placement: ")]
    assert "the trainer generates 2 steps' batches in one rollout" in line
    assert "at most 1 update(s) stale" in line and "thread" not in line
    bad = _grpo_submit(*args, "rollout.steps_per_generation=3", "algo.max_staleness=1", env=env)
    assert bad.returncode == ExitCode.CONFIG_ERROR
    assert "set algo.max_staleness=2 or more" in bad.stderr
    assert not (tmp_path / "logs").exists()
