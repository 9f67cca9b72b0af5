"""A short run of a code task on the tiny model: HumanEval's training split, the code
reward in the sandbox, held-out pass@1 and pass@k in metrics.jsonl, grpo-status and the
plot's series."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_hpc.status.plot import panel, plot_data
from grpo_hpc.status.report import read_row
from tests.e2e.helpers import make_run, train


def test_code_run_logs_held_out_pass_at_k(tmp_path: Path) -> None:
    paths = make_run(
        tmp_path, "code", "data.source=humaneval", "data.num_train=8", "data.num_val=2",
        "reward.correctness=0", "reward.code=1", "rollout.max_new_tokens=16",
        "training.max_steps=2", "training.eval_every=2", "training.eval_samples=2",
        "training.save_every_steps=0", "algo.micro_batch_tokens=auto",
    )  # fmt: skip
    result = train(paths)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[Sandbox] code reward runs in" in result.stdout
    # auto's speed switches are off on a CPU (grpo_hpc.config.speed), the token budget
    # auto is the smaller one there (no GPU to estimate against), and all are logged so,
    # with the rollout engine rollout.engine=auto chose and why (as grpo-submit says it)
    speed = "[Speed] dist.compile=false (auto), algo.packing=false (auto), "
    speed += "algo.micro_batch_tokens=4096 (auto), dist.deterministic_kernels=true, "
    speed += "rollout: HF generate (rollout.engine=auto on a CPU: the native engine pays on a "
    assert speed + "GPU only)\n" in result.stdout
    metrics = [json.loads(line) for line in paths.metrics.read_text().splitlines()]
    steps = [m for m in metrics if "reward/mean" in m]
    evals = [m for m in metrics if "eval/pass@1" in m]
    assert [m["step"] for m in steps] == [1, 2] and all("reward/code" in m for m in steps)
    assert [m["step"] for m in evals] == [0, 2]  # before training, and after
    for m in evals:  # a random model writes no passing program, but the figure is there
        assert 0.0 <= m["eval/pass@1"] <= m["eval/pass@2"] <= 1.0
        assert "eval/accuracy" not in m
    assert "[Eval] step 2: held-out pass@1" in result.stdout
    row = read_row(paths, None)
    assert row.held_out_metric == "eval/pass@1" and row.held_out == evals[-1]["eval/pass@1"]
    shown, _, overlay = panel(plot_data(metrics, []), "eval/accuracy", "")
    assert (shown, overlay) == ("eval/pass@1", "eval/pass@2")


@pytest.mark.slow
def test_two_ranks_split_the_held_out_problems(tmp_path: Path) -> None:
    """Under two processes each rank judges its share (3 problems: 2 + 1 and a padding
    repeat that is not counted); the logged figures are over the 3 problems."""
    paths = make_run(
        tmp_path, "code2", "data.source=humaneval", "data.num_train=8", "data.num_val=3",
        "reward.correctness=0", "reward.code=1", "rollout.max_new_tokens=8",
        "training.max_steps=1", "training.eval_every=1", "training.eval_samples=2",
        "training.save_every_steps=0", nproc=2,
    )  # fmt: skip
    result = train(paths, nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    evals = [json.loads(x) for x in paths.metrics.read_text().splitlines() if "pass@1" in x]
    assert [m["step"] for m in evals] == [0, 1]
    assert "(0/6 completions passed every test" in result.stdout  # 3 problems x 2 samples
    # every completion of both ranks' shares in one samples file, the padding left out
    rows = [json.loads(x) for x in paths.eval_samples_at(1).read_text().splitlines()]
    assert len(rows) == 6 and {r["verdict"] for r in rows} == {0.0}
    assert len({r["question"] for r in rows}) == 3 and rows[0]["gold"] is None


@pytest.mark.slow
def test_a_sampled_evaluation_draws_from_its_own_stream(tmp_path: Path) -> None:
    """Two runs of one seed, one evaluating (pass@k, sampled) after every step, the other
    after the second only: they train on the same completions, and the evaluation at step
    2 samples the same programs. The evaluation's stream is named by the seed and the step;
    before, it drew from the training's own, so evaluating at step 1 changed step 2's
    rollouts and its own samples."""
    runs = {}
    for every in (1, 2):
        paths = make_run(
            tmp_path, f"every{every}", "data.source=humaneval", "data.num_train=8",
            "data.num_val=2", "reward.correctness=0", "reward.code=1",
            "rollout.max_new_tokens=12", "training.max_steps=2", f"training.eval_every={every}",
            "training.eval_samples=2", "training.save_every_steps=0", "training.log_samples=8",
        )  # fmt: skip
        result = train(paths)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[every] = paths
    assert runs[1].eval_samples_at(1).exists() and not runs[2].eval_samples_at(1).exists()

    def completions(paths) -> list[tuple[int, str]]:
        rows = [json.loads(x) for x in paths.samples.read_text().splitlines()]
        return [(r["step"], r["completion"]) for r in rows]

    def evaluated(paths) -> list[str]:
        rows = paths.eval_samples_at(2).read_text().splitlines()
        return [json.loads(x)["completion"] for x in rows]

    steps = completions(runs[1])
    assert {s for s, _ in steps} == {1, 2} and len({c for _, c in steps}) > 1
    assert steps == completions(runs[2])
    assert evaluated(runs[1]) == evaluated(runs[2])
