"""Partial rollouts (``rollout.partial_pool``) on the real trainer: answers are continued by
newer weights, no sample trains staler than ``algo.max_staleness`` (a group as stale as its
first token), and a run SIGKILLed mid-run and resumed ends equal, bit for bit, to the
uninterrupted one (one process and two DDP ranks: the pool is saved per rank).

The model is a random tiny Llama whose EOS row of the (tied) output layer is scaled up, so
that its answers end at many lengths (a long tail: with the plain random model most rows
run to the cap, every round ends together and nothing is ever continued)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from grpo_hpc.train.setup.models import LlamaShape, load_model_and_tokenizer, save_random_llama

from .helpers import make_run, train
from .test_resume_exact import STEPS, check_kill_and_resume

EOS_SCALE = 12.0
"""The EOS row's scale: a third to two thirds of the rows end before the 48-token cap
(measured on this model: lengths 5 .. 30 and 4 of 16 at the cap)."""
G, PROMPTS, K = 2, 2, 2
PARTIAL = [
    f"algo.max_staleness={K}",
    "rollout.partial_pool=2",
    f"rollout.num_generations={G}",
    f"rollout.prompts_per_step={PROMPTS}",
    "rollout.max_new_tokens=48",
    "algo.micro_batch_size=4",
]


@pytest.fixture(scope="module")
def ending_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny config's model shape with answers that end (see the module's docstring)."""
    out = tmp_path_factory.mktemp("ending") / "model"
    save_random_llama(out, LlamaShape(64, 2, 4, 2, 128), seed=0)
    model, tok = load_model_and_tokenizer(out, "sdpa", torch.device("cpu"))
    with torch.no_grad():
        model.get_output_embeddings().weight[tok.eos_token_id] *= EOS_SCALE
    model.save_pretrained(out)
    return out


def _rows(run) -> list[dict]:  # noqa: ANN001 - RunPaths
    lines = run.metrics.read_text().splitlines()
    return [r for r in map(json.loads, lines) if "reward/mean" in r]


def _histogram(row: dict) -> dict[int, float]:
    return {
        int(key.split("/")[1]): v
        for key, v in row.items()
        if key.startswith("staleness/") and key.split("/")[1].isdigit()
    }


@pytest.mark.parametrize("engine", ["native", "hf"])
def test_answers_are_continued_and_none_trains_staler_than_the_bound(
    tmp_path: Path, ending_model: Path, engine: str
) -> None:
    """Every step trains a step's groups, each at most k stale (its first token's weights),
    some of them continued answers; the sampler's log-probs of a continued answer are of
    two weights, which the importance weights see (finite, not all 1)."""
    steps = ["training.max_steps=8", f"rollout.engine={engine}"]
    run = make_run(
        tmp_path, f"partial-{engine}", *PARTIAL, *steps, f"model.name_or_path={ending_model}"
    )
    result = train(run)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _rows(run)
    assert [r["step"] for r in rows] == list(range(1, 9))
    for r in rows:
        counts = _histogram(r)
        assert sum(counts.values()) == PROMPTS * G, r
        assert all(v == 0 for s, v in counts.items() if s > K), r
        assert r["staleness/max"] <= K
        if "rollout/is_weight_mean" in r:  # absent where every group was flat (no update)
            assert math.isfinite(r["rollout/is_weight_mean"]) and r["rollout/is_weight_max"] > 0
    assert any(r.get("rollout/logp_diff", 0) > 0 for r in rows)
    continued = sum(r["partial/continued_rows"] for r in rows)
    assert continued > 0, "no answer was continued: the test proved nothing"
    assert max(r["staleness/max"] for r in rows) == K
    assert all(r["partial/pool_groups"] >= 0 and r["partial/dropped_groups"] == 0 for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize(("engine", "nproc"), [("native", 1), ("hf", 2)])
def test_partial_kill_and_resume_is_bit_exact(
    tmp_path: Path, ending_model: Path, engine: str, nproc: int
) -> None:
    """SIGKILL at a random moment after the first checkpoint, resume: the weights and the
    optimizer at the end equal the uninterrupted run's, bit for bit; the resumed rank's
    state digest equals its checkpoint's (the pool of answers in flight included)."""
    steps = [*STEPS, *PARTIAL, f"rollout.engine={engine}", f"model.name_or_path={ending_model}"]
    steps[steps.index(f"rollout.prompts_per_step={PROMPTS}")] = (
        f"rollout.prompts_per_step={2 * nproc}"
    )
    run = check_kill_and_resume(tmp_path, steps, nproc)
    assert sum(r["partial/continued_rows"] for r in _rows(run)) > 0
