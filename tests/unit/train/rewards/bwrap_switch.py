"""The production sandbox (bubblewrap) in the tests: a test that needs it is skipped where
this machine cannot run it, unless ``GRPO_HPC_REQUIRE_BWRAP`` is set, as scripts/test.sh
sets it when it runs as root (where it installs bubblewrap): then the test fails, saying
why, so that the suite cannot pass with the sandbox untested (as ``GRPO_HPC_REQUIRE_SLURM``
does for the Slurm tests)."""

from __future__ import annotations

import os

import pytest

from grpo_hpc.train.rewards import bwrap

REQUIRE_ENV = "GRPO_HPC_REQUIRE_BWRAP"


def required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def need_bwrap() -> None:
    """Return where bubblewrap works here; else skip, or fail when it is required."""
    found = bwrap.detect()
    if found.name == "bwrap":
        return
    if required():
        pytest.fail(
            f"bubblewrap required ({REQUIRE_ENV} is set) but unusable here: {found.detail}",
            pytrace=False,
        )
    pytest.skip(f"bubblewrap unusable here: {found.detail} (set {REQUIRE_ENV}=1 to fail)")
