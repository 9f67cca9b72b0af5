"""Integration-test fixtures: the local single-node Slurm test cluster (slurm/up.sh).

Tests marked ``@pytest.mark.slurm`` get the session-scoped ``slurm_cluster`` fixture
automatically. It runs ``bash slurm/up.sh`` once per session (well under a second when
the cluster is already up) and never stops the cluster, so reruns are fast; stop it with
``bash slurm/down.sh``.

If the cluster cannot be brought up (not root, packages missing, up.sh fails) the test
is skipped, unless ``GRPO_HPC_REQUIRE_SLURM`` is set (as in CI): then it fails.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
UP_SH = REPO_ROOT / "slurm" / "up.sh"
REQUIRE_ENV = "GRPO_HPC_REQUIRE_SLURM"
UP_TIMEOUT_S = 600


@dataclass(frozen=True)
class SlurmCluster:
    """What tests need to know about the local cluster brought up by slurm/up.sh."""

    partition: str = "debug"
    node: str = "localhost"
    gpus: int = 2
    state_dir: Path = Path("/var/lib/grpo-slurm")

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"


def _unavailable(reason: str) -> None:
    """Skip, or fail when GRPO_HPC_REQUIRE_SLURM is set (CI must not silently skip)."""
    if os.environ.get(REQUIRE_ENV, "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(
            f"Slurm test cluster required ({REQUIRE_ENV} is set) but {reason}", pytrace=False
        )
    pytest.skip(f"Slurm test cluster unavailable: {reason} (set {REQUIRE_ENV}=1 to fail)")


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """Bring up (or reuse) the local Slurm cluster; it is left running after the session."""
    if os.geteuid() != 0:
        _unavailable("slurm/up.sh needs root (it starts munged, MariaDB and Slurm daemons)")
    try:
        proc = subprocess.run(
            ["bash", str(UP_SH)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=UP_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        _unavailable(f"running {UP_SH} failed: {exc}")
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        _unavailable(f"{UP_SH} exited with {proc.returncode}:\n{tail}")
    state_dir = Path(os.environ.get("GRPO_SLURM_STATE", "/var/lib/grpo-slurm"))
    gpus = int(os.environ.get("GRPO_SLURM_GPUS", "2"))
    return SlurmCluster(gpus=gpus, state_dir=state_dir)


@pytest.fixture(autouse=True)
def _slurm_marker(request: pytest.FixtureRequest) -> None:
    """Give every test marked ``@pytest.mark.slurm`` the ``slurm_cluster`` fixture."""
    if request.node.get_closest_marker("slurm") is not None:
        request.getfixturevalue("slurm_cluster")
