"""Keep-best (issue 56) on real trainer runs: the validation evaluation's best checkpoint
survives keep_last=1 retention and a resubmission, a resumed attempt compares against the
recorded best, final/ is the best and last/ the last, grpo-export --best, and each
evaluation's completions in eval_samples/ as grpo-status --samples shows them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_hpc.core.best import read_best
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.export.plan import read_provenance

from .helpers import make_run, train

MAX_STEPS = 4
# A random tiny model answering in one token: its greedy digit changes as it trains, so
# the validation accuracy moves between evaluations. Every score the test checks is the
# run's own, read back from its metrics.jsonl.
STEPS = (
    f"training.max_steps={MAX_STEPS}",
    "training.eval_every=1",
    "training.keep_last=1",
    "training.save_every_steps=1",
    "data.max_operand=9",
    "data.min_terms=1",
    "data.max_terms=1",
    "reward.require_marker=false",
    "optim.lr=1e-2",
    "rollout.max_new_tokens=1",
)
CRASH_AFTER = 2


def _evals(paths: RunPaths) -> list[tuple[int, float]]:
    rows = map(json.loads, paths.metrics.read_text().splitlines())
    return [(m["step"], m["eval/accuracy"]) for m in rows if "eval/accuracy" in m]


def _first_best(evals: list[tuple[int, float]]) -> tuple[int, float]:
    """The step keep-best must have chosen: the first to reach the highest score (a tie
    keeps the earlier checkpoint)."""
    top = max(score for _, score in evals)
    return next((step, score) for step, score in evals if score == top)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> RunPaths:
    """One run in two attempts: the first crashes after step 2 (its checkpoints and
    best.json stay), the second resumes from step 2's checkpoint and finishes."""
    root = tmp_path_factory.mktemp("runs")
    paths = make_run(
        root, "kb", *STEPS, "faults.enabled=true", f"faults.crash_at_step={CRASH_AFTER}"
    )
    first = train(paths)
    assert first.returncode != 0
    assert paths.latest_checkpoint() == CRASH_AFTER, first.stderr[-2000:]
    text = paths.config.read_text()
    paths.config.write_text(text.replace(f"crash_at_step: {CRASH_AFTER}", "crash_at_step: -1"))
    second = train(paths)
    assert second.returncode == 0, second.stderr[-3000:]
    return paths


def test_best_survives_retention_and_resume_and_is_final(run: RunPaths) -> None:
    evals = _evals(run)
    assert [s for s, _ in evals] == list(range(MAX_STEPS + 1))  # step 0 and every step
    step, score = _first_best(evals)
    # The run this test needs: a best that is neither the start nor the last step.
    assert 0 < step < MAX_STEPS, evals
    best = read_best(run.root)
    assert best is not None
    assert (best.step, best.score, best.metric) == (step, score, "accuracy")
    assert best.checkpoint == f"step-{step}" and best.evaluations == len(evals)
    # keep_last=1 with a save at every step: only the newest and the best are left.
    assert run.checkpoint_steps() == [step, MAX_STEPS]
    assert read_provenance(run.final)["step"] == step
    assert read_provenance(run.last)["step"] == MAX_STEPS


def test_resumed_attempt_compares_against_the_recorded_best(run: RunPaths) -> None:
    evals = dict(_evals(run))
    recorded = max(evals[s] for s in range(CRASH_AFTER + 1))
    # The resumed attempt's first evaluation did not beat the first attempt's best: from
    # scratch it would have been the best; against the record it is not.
    assert evals[CRASH_AFTER + 1] <= recorded
    assert read_best(run.root).step <= CRASH_AFTER


def test_eval_samples_and_status(run: RunPaths, capsys: pytest.CaptureFixture) -> None:
    from grpo_hpc.cli import status

    evals = dict(_evals(run))
    for step, acc in evals.items():
        rows = [json.loads(x) for x in run.eval_samples_at(step).read_text().splitlines()]
        assert len(rows) == 8
        assert set(rows[0]) == {"step", "question", "completion", "answer", "gold", "verdict"}
        assert sum(r["verdict"] for r in rows) == acc * len(rows)
    assert status.main([run.name, "--logs", str(run.root.parent), "--samples"]) == 0
    out = capsys.readouterr().out.splitlines()
    right = round(evals[MAX_STEPS] * 8)
    assert out[0] == f"evaluation at step {MAX_STEPS}: {right}/8 right"
    assert any(line.startswith("worst") for line in out)
    assert all(len(line) <= 100 for line in out)
    assert status.main([run.name, "--logs", str(run.root.parent)]) == 0
    detail = capsys.readouterr().out
    best = read_best(run.root)
    assert f"best: step {best.step}, accuracy {best.score:.3f}" in detail
    assert f"{best.score:.3f}@{best.step}" in detail  # the table's BEST cell


def test_export_best(run: RunPaths, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from grpo_hpc.cli import export

    logs = ["--logs", str(run.root.parent)]
    assert export.main([run.name, str(tmp_path / "b"), "--best", *logs]) == 0
    assert read_provenance(tmp_path / "b")["step"] == read_best(run.root).step
    assert export.main([run.name, "--best", *logs]) == 2
    assert "give OUT for --best" in capsys.readouterr().err
