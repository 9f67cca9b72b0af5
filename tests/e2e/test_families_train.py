"""Every supported model family (docs/models.md) through the real trainer on the CPU: one
training step on the update's fast path (``algo.packing=true``: packed rows, each layer's
sliding window, the fused log-prob head), a checkpoint, then the same run resumed from it
for a second step. The model is ``random:tests/fixtures/families/<family>`` (the reduced
config, random weights built by the trainer). What the update computes is proven equal to
HF's forward in tests/unit/train/algo/test_update_families.py; here each family's checkpoint
(tied heads, stacked experts, Gemma's extra norms) must save, verify and load back into a
run that trains on.

The whole module is 18 trainer processes, two at a time; each costs mostly its imports, so
the runs are as small as the tiny config allows: no math-verify worker (the digit reward
alone), no final export (a random shape has none), one step each."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState, read_progress

from .helpers import make_run, train

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
FAMILIES = sorted(p.parent.name for p in FIXTURES.glob("*/config.json"))


@dataclass
class TrainAndResume:
    """A 1-step run, then the same run resumed to step 2."""

    paths: RunPaths
    first: subprocess.CompletedProcess
    checkpoint_after_first: int | None
    first_metrics: list[dict]
    again: subprocess.CompletedProcess | None = None


def _metrics(paths: RunPaths) -> list[dict]:
    if not paths.metrics.exists():
        return []
    return [json.loads(line) for line in paths.metrics.read_text().splitlines()]


def _train_and_resume(paths: RunPaths) -> TrainAndResume:
    first = train(paths)
    runs = TrainAndResume(paths, first, paths.latest_checkpoint(), _metrics(paths))
    if first.returncode == 0:
        text = paths.config.read_text()
        assert "max_steps: 1\n" in text
        paths.config.write_text(text.replace("max_steps: 1\n", "max_steps: 2\n"))
        runs.again = train(paths)
    return runs


def _selected(request: pytest.FixtureRequest) -> list[str]:
    """The families of this session's selected items (a -k selection trains only those)."""
    test = test_family_trains_checkpoints_and_resumes.__name__
    items = (i for i in request.session.items if getattr(i, "originalname", "") == test)
    return list(dict.fromkeys(i.callspec.params["family"] for i in items))


@pytest.fixture(scope="module")
def family_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[TrainAndResume]]]:
    """Every selected family's train-and-resume, two at a time (one process each, two
    cores; the runs share nothing): each test then checks its own."""
    root = tmp_path_factory.mktemp("families")
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {
            family: pool.submit(
                _train_and_resume,
                make_run(
                    root / family,
                    "fam",
                    f"model.name_or_path=random:{FIXTURES / family}",
                    "algo.packing=true",
                    "reward.correctness=0",
                    "training.export_final=false",
                    "training.max_steps=1",
                    "training.save_every_steps=1",
                ),
            )
            for family in _selected(request)
        }


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_family_trains_checkpoints_and_resumes(
    family_runs: dict[str, Future[TrainAndResume]], family: str
) -> None:
    runs = family_runs[family].result()
    assert runs.first.returncode == 0, runs.first.stderr[-3000:]
    assert "algo.packing=true" in runs.first.stdout  # the [Speed] line: the fast path ran
    steps = [m for m in runs.first_metrics if "loss" in m]
    assert [m["step"] for m in steps] == [1] and steps[0]["grad_norm"] > 0, steps
    assert runs.checkpoint_after_first == 1  # complete: manifest + COMPLETE, verified
    # The same run again: it resumes from step 1's checkpoint and trains step 2.
    assert runs.again is not None and runs.again.returncode == 0, runs.again.stderr[-3000:]
    rec = read_progress(runs.paths.progress)
    assert rec.state == TrainState.FINISHED
    assert (rec.step, rec.restarts, rec.start_step) == (2, 1, 1)
    steps = [m for m in _metrics(runs.paths) if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2] and steps[1]["grad_norm"] > 0, steps
    assert runs.paths.latest_checkpoint() == 2
