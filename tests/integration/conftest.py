"""Integration-test fixtures: the local Slurm test cluster (slurm/up.sh).

Tests marked ``@pytest.mark.slurm`` get the session-scoped ``slurm_cluster`` fixture
automatically. It runs ``bash slurm/up.sh --nodes 2`` once per session (well under a second
when the cluster is already up): node ``localhost`` in the default partition ``debug`` for
the single-node tests, plus ``grpo-n1``/``grpo-n2`` (each slurmd in its own network
namespace) in partition ``multi`` for the two-node tests, which ask for ``two_nodes``. If
the two extra nodes cannot be made (no network namespaces here), it falls back to the
single-node cluster and only the two-node tests are skipped. The cluster is never stopped,
so reruns are fast; stop it with ``bash slurm/down.sh``.

If the cluster cannot be brought up (not root, packages missing, up.sh fails) the test
is skipped, unless ``GRPO_HPC_REQUIRE_SLURM`` is set (as in CI): then it fails.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
UP_SH = REPO_ROOT / "slurm" / "up.sh"
REQUIRE_ENV = "GRPO_HPC_REQUIRE_SLURM"
UP_TIMEOUT_S = 600
MULTI_NODES = ("grpo-n1", "grpo-n2")


@dataclass(frozen=True)
class SlurmCluster:
    """What tests need to know about the local cluster brought up by slurm/up.sh."""

    partition: str = "debug"
    node: str = "localhost"
    gpus: int = 2
    state_dir: Path = Path("/var/lib/grpo-slurm")
    multi_nodes: tuple[str, ...] = ()
    """The nodes of partition ``multi`` (empty when up.sh --nodes 2 failed)."""
    multi_error: str = ""
    """Why there are no multi nodes."""

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
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> SlurmCluster:
    """Bring up (or reuse) the local Slurm cluster; it is left running after the session.

    up.sh runs once per session, not once per pytest-xdist worker: the Slurm tests run in
    two groups side by side (tests/conftest.py), and a second up.sh while a two-node test
    has killed a node on purpose would restart it under that test. The first worker runs it
    under a lock and leaves its outcome for the others."""
    if os.geteuid() != 0:
        _unavailable("slurm/up.sh needs root (it starts munged, MariaDB and Slurm daemons)")
    base = tmp_path_factory.getbasetemp()
    shared = base if worker_id == "master" else base.parent  # the session's, not the worker's
    with open(shared / "slurm_up.lock", "w") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)  # released when the file closes
        record = shared / "slurm_up.json"
        if not record.exists():
            record.write_text(json.dumps(_bring_up()))
        up = json.loads(record.read_text())
    if up["error"]:
        _unavailable(up["error"])
    multi_error = up["multi_error"]
    state_dir = Path(os.environ.get("GRPO_SLURM_STATE", "/var/lib/grpo-slurm"))
    gpus = int(os.environ.get("GRPO_SLURM_GPUS", "2"))
    nodes = () if multi_error else MULTI_NODES
    return SlurmCluster(gpus=gpus, state_dir=state_dir, multi_nodes=nodes, multi_error=multi_error)


@pytest.fixture(scope="session")
def two_nodes(slurm_cluster: SlurmCluster) -> SlurmCluster:
    """The cluster with its two namespace nodes in partition ``multi``."""
    if not slurm_cluster.multi_nodes:
        _unavailable(f"{UP_SH} --nodes 2 failed:\n{slurm_cluster.multi_error}")
    return slurm_cluster


def _bring_up() -> dict[str, str]:
    """Run up.sh (two nodes, else one): why the cluster, or its two-node partition, is not
    there ("" when it is)."""
    multi_error = ""
    proc = _up("--nodes", str(len(MULTI_NODES)))
    if proc.returncode != 0:
        multi_error = _tail(proc)
        proc = _up()  # the single-node cluster still serves every other test
    error = f"{UP_SH} exited with {proc.returncode}:\n{_tail(proc)}" if proc.returncode else ""
    return {"error": error, "multi_error": multi_error}


def _up(*args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            ["bash", str(UP_SH), *args],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=UP_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        _unavailable(f"running {UP_SH} failed: {exc}")
        raise  # not reached: _unavailable skips or fails


def _tail(proc: subprocess.CompletedProcess) -> str:
    return "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])


@pytest.fixture(autouse=True)
def _slurm_marker(request: pytest.FixtureRequest) -> None:
    """Give every test marked ``@pytest.mark.slurm`` the ``slurm_cluster`` fixture."""
    if request.node.get_closest_marker("slurm") is not None:
        request.getfixturevalue("slurm_cluster")
