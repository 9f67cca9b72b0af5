"""A model the fused log-prob head cannot score and transformers cannot run under SDPA
(Gemma 2: soft-capped logits and attention) trains through the real trainer from
``random:<config>``: HF generate decodes it (said in the rollout line), eager attention
(said in one line), the update scores the model's own logits
(tests/unit/train/algo/test_update_model_logits.py proves them equal to HF's). Before, such
a run died at step 0, after grpo-submit had let it queue."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.train.algo.test_update_model_logits import GEMMA2

from .helpers import make_run, train


@pytest.mark.slow
def test_a_soft_capped_model_trains_through_the_trainer(tmp_path: Path) -> None:
    shape = tmp_path / "gemma2"
    shape.mkdir()
    (shape / "config.json").write_text(json.dumps(GEMMA2))
    paths = make_run(
        tmp_path / "run",
        "g2",
        f"model.name_or_path=random:{shape}",
        "reward.correctness=0",
        "training.export_final=false",
        "training.max_steps=1",
        "training.save_every_steps=1",
    )
    result = train(paths)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rollout: HF generate" in result.stdout  # told: no native engine for gemma2
    assert "eager attention" in result.stdout  # told: transformers has no SDPA for it
    steps = [json.loads(line) for line in paths.metrics.read_text().splitlines()]
    steps = [m for m in steps if "loss" in m]
    assert [m["step"] for m in steps] == [1] and steps[0]["grad_norm"] > 0, steps
