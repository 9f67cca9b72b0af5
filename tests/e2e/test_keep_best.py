"""Keep-best on real trainer runs: the model to hand over (the newest evaluation within
noise of the peak) survives keep_last=1 retention and a resubmission, a resumed attempt
compares against the recorded peak, final/ is that model and last/ the last, grpo-export
--best, a run whose start beat every later evaluation hands over the start, and each
evaluation's completions in eval_samples/ as grpo-status --samples shows them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_hpc.core.best import eval_noise, next_best, read_best
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.export.plan import read_provenance

from .helpers import make_run, train

MAX_STEPS = 7
VAL = 32
# A random tiny model answering in one token learns a digit that answers 7 of the 32
# validation problems at step 4 and still at step 5, at this seed and learning rate. Every
# score the tests check is the run's own, read back from its metrics.jsonl.
STEPS = (
    f"training.max_steps={MAX_STEPS}",
    "training.eval_every=1",
    "training.keep_last=1",
    "training.save_every_steps=1",
    "training.seed=1",
    f"data.num_val={VAL}",
    "data.max_operand=9",
    "data.min_terms=1",
    "data.max_terms=1",
    "reward.require_marker=false",
    "optim.lr=5e-2",
    "rollout.max_new_tokens=1",
)
CRASH_AFTER = 5
STRICT = ("require_marker: false", "require_marker: true")
"""The resubmitted attempt's judge: an answer needs its marker, which a one-token answer
cannot carry, so every later evaluation scores 0: a fall far beyond the noise."""


def _evals(paths: RunPaths) -> list[tuple[int, float]]:
    rows = map(json.loads, paths.metrics.read_text().splitlines())
    return [(m["step"], m["eval/accuracy"]) for m in rows if "eval/accuracy" in m]


def _expected(evals: list[tuple[int, float]]) -> int:
    """The step keep-best must hand over: its rule (unit-tested) replayed on the run's
    evaluations."""
    rec = None
    for step, score in evals:
        rec, _ = next_best(rec, step, "accuracy", score, problems=VAL)
    assert rec is not None
    return rec.step


def _resubmit(paths: RunPaths, *edits: tuple[str, str]) -> None:
    text = paths.config.read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    paths.config.write_text(text)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> RunPaths:
    """One run in two attempts: the first crashes after step 5 (its checkpoints and
    best.json stay), the second resumes from step 5's checkpoint with a stricter judge and
    finishes."""
    root = tmp_path_factory.mktemp("runs")
    paths = make_run(
        root, "kb", *STEPS, "faults.enabled=true", f"faults.crash_at_step={CRASH_AFTER}"
    )
    first = train(paths)
    assert first.returncode != 0
    assert paths.latest_checkpoint() == CRASH_AFTER, first.stderr[-2000:]
    _resubmit(paths, (f"crash_at_step: {CRASH_AFTER}", "crash_at_step: -1"), STRICT)
    second = train(paths)
    assert second.returncode == 0, second.stderr[-3000:]
    return paths


def test_best_survives_retention_and_resume_and_is_final(run: RunPaths) -> None:
    evals = _evals(run)
    assert [s for s, _ in evals] == list(range(MAX_STEPS + 1))  # step 0 and every step
    step = _expected(evals)
    # The run this test needs: a model to hand over that is neither the start nor the last,
    # and that only matched an earlier peak (within noise): the newer one is handed over.
    best = read_best(run.root)
    assert best is not None
    assert 0 < best.peak[1] < step < MAX_STEPS, evals
    score = dict(evals)[step]
    assert (best.step, best.score, best.metric) == (step, score, "accuracy")
    assert best.problems == VAL and best.peak[0] - eval_noise(best.peak[0], VAL) <= score
    assert best.checkpoint == f"step-{step}" and best.evaluations == len(evals)
    # keep_last=1 with a save at every step: only the newest, the model to hand over and
    # the peak (a collapse rolls back to it) are left.
    assert run.checkpoint_steps() == [best.peak[1], step, MAX_STEPS]
    assert read_provenance(run.final)["step"] == step
    assert read_provenance(run.last)["step"] == MAX_STEPS


def test_resumed_attempt_compares_against_the_recorded_peak(run: RunPaths) -> None:
    evals = dict(_evals(run))
    peak = max(evals[s] for s in range(CRASH_AFTER + 1))
    # The resumed attempt's first evaluation fell beyond the noise of the first attempt's
    # peak: from scratch it would have been the model to hand over; against the record,
    # it is not.
    assert evals[CRASH_AFTER + 1] < peak - eval_noise(peak, VAL)
    assert read_best(run.root).step <= CRASH_AFTER


def test_eval_samples_and_status(run: RunPaths, capsys: pytest.CaptureFixture) -> None:
    from grpo_hpc.cli import status

    evals = dict(_evals(run))
    for step, acc in evals.items():
        rows = [json.loads(x) for x in run.eval_samples_at(step).read_text().splitlines()]
        assert len(rows) == VAL
        assert set(rows[0]) == {"step", "question", "completion", "answer", "gold", "verdict"}
        assert sum(r["verdict"] for r in rows) == acc * len(rows)
    assert status.main([run.name, "--logs", str(run.root.parent), "--samples"]) == 0
    out = capsys.readouterr().out.splitlines()
    right = round(evals[MAX_STEPS] * VAL)
    assert out[0] == f"evaluation at step {MAX_STEPS}: {right}/{VAL} right"
    assert any(line.startswith("worst") for line in out)
    assert all(len(line) <= 100 for line in out)
    assert status.main([run.name, "--logs", str(run.root.parent)]) == 0
    detail = capsys.readouterr().out
    best = read_best(run.root)
    assert f"best: {best.why()}" in " ".join(detail.split())
    assert best.why().startswith(f"step {best.step}: accuracy {best.score:.3f}, ")
    assert " the peak " in best.why()  # equal to it, or within noise of it
    assert best.why().endswith(f" at step {best.peak[1]}")
    assert f"{best.score:.3f}@{best.step}" in detail  # the table's BEST cell


def test_export_best(run: RunPaths, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from grpo_hpc.cli import export

    logs = ["--logs", str(run.root.parent)]
    assert export.main([run.name, str(tmp_path / "b"), "--best", *logs]) == 0
    assert read_provenance(tmp_path / "b")["step"] == read_best(run.root).step
    assert export.main([run.name, "--best", *logs]) == 2
    assert "give OUT for --best" in capsys.readouterr().err


def test_the_start_that_beat_every_later_evaluation_is_the_final_model(
    run: RunPaths, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A run that starts from the model above (7 of the 32 validation problems right at
    step 0), crashes after its step-0 evaluation and is resubmitted with the stricter
    judge: every later evaluation scores 0, so final/ holds the start, its weights read
    again from the run's model directory, and grpo-status and the trainer say why."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_hpc.cli import export, status

    start = run.final
    paths = make_run(
        tmp_path,
        "start",
        *STEPS,
        "training.max_steps=2",
        f"model.name_or_path={start}",
        "faults.enabled=true",
        "faults.crash_at_step=0",
    )
    assert train(paths).returncode != 0
    _resubmit(paths, ("crash_at_step: 0", "crash_at_step: -1"), STRICT)
    second = train(paths)
    assert second.returncode == 0, second.stderr[-3000:]
    evals = _evals(paths)
    assert evals[0][1] > 0 and all(score == 0 for _, score in evals[1:]), evals
    best = read_best(paths.root)
    assert (best.step, best.checkpoint, best.score) == (0, "", evals[0][1])
    why = f"step 0, the start: accuracy {best.score:.3f} beat every later evaluation"
    assert f"[Export] final model: {paths.final} ({why})" in second.stdout
    assert read_provenance(paths.final)["step"] == 0
    assert read_provenance(paths.last)["step"] == 2
    handed = AutoModelForCausalLM.from_pretrained(paths.final).state_dict()
    want = AutoModelForCausalLM.from_pretrained(start).state_dict()
    assert handed.keys() == want.keys()
    assert all(torch.equal(handed[k], want[k]) for k in want)
    logs = ["--logs", str(tmp_path)]
    assert status.main(["start", *logs]) == 0
    assert why in " ".join(capsys.readouterr().out.split())
    # grpo-export --best: the start as well; a best.json that is no record: one line
    assert export.main(["start", str(tmp_path / "b"), "--best", *logs]) == 0
    assert read_provenance(tmp_path / "b")["step"] == 0
    paths.best.write_text("[]")
    assert export.main(["start", str(tmp_path / "c"), "--best", *logs]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(
        f"{paths.best} is unreadable (not a keep-best record): the run's next evaluation "
        "rewrites it; meanwhile export --step N (grpo-ckpt list start)"
    )
