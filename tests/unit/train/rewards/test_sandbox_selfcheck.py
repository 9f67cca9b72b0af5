"""A reward that cannot run must not read as zero.

The sandbox and the math-verify worker prove themselves at startup; bubblewrap's private
/tmp must not hide an interpreter installed under /tmp."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from grpo_hpc.config.schema import RewardConfig
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.train.rewards import bwrap, sandbox, verifier
from grpo_hpc.train.rewards import functions as rewards
from tests.conftest import REPO

from .bwrap_switch import REQUIRE_ENV, need_bwrap


@pytest.fixture
def fresh_caches():
    """proven_isolation/detect are per-process caches: start and end each test clean. The
    cached functions are taken once, before the test: a test that monkeypatches one may
    still have it patched at this teardown (an autouse fixture that uses monkeypatch
    makes monkeypatch outlive this one)."""
    cached = (bwrap.detect, sandbox.proven_isolation, rewards.announce_sandbox)
    for f in cached:
        f.cache_clear()
    yield
    for f in cached:
        f.cache_clear()


@pytest.fixture(scope="module")
def tmp_venv():
    """A venv under /tmp (as clusters stage environments on node-local disk), seeing this
    checkout through PYTHONPATH."""
    root = Path(tempfile.mkdtemp(prefix="grpo-venv-", dir="/tmp"))
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(root)],
        check=True,
    )
    yield root / "bin" / "python"
    shutil.rmtree(root, ignore_errors=True)


RUN_FROM_VENV = """
from grpo_hpc.train.rewards import sandbox
good = sandbox.run_python("x = 2", checks=["assert x == 2"], isolation="bwrap")
bad = sandbox.run_python("x = 2", checks=["assert x == 3"], isolation="bwrap")
print(good.ok, bad.ok, repr(good.stderr.strip()[-200:]))
print(sandbox.proven_isolation().name)
"""


def test_sandbox_venv_under_tmp(tmp_venv: Path) -> None:
    """Regression: bwrap's private /tmp hid a venv's interpreter (``bwrap: execvp
    /tmp/.../bin/python: No such file or directory``) and every completion scored 0."""
    need_bwrap()
    result = subprocess.run(
        [str(tmp_venv), "-c", RUN_FROM_VENV],
        capture_output=True, text=True, timeout=120, cwd="/", env={"PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    verdict, chosen = result.stdout.strip().splitlines()
    assert verdict.startswith("True False"), verdict
    assert chosen == "bwrap"


def test_environment_paths_under_tmp_only() -> None:
    found = bwrap.environment_paths(
        "/tmp/v/bin/python", ("/tmp", "/usr", "/"), ("/tmp/v/lib/site", "", "/usr/lib/py")
    )
    assert found == []  # none of these exist: nothing to bind
    here = tempfile.mkdtemp(prefix="grpo-env-", dir="/tmp")
    try:
        found = bwrap.environment_paths(f"{here}/bin/python", (here, "/usr", "/tmp"), ())
        assert found == [here]  # /usr is visible anyway; /tmp itself must stay private
        cmd = bwrap.command("/tmp/work", ["python"], keep=found)
        assert cmd.index("--tmpfs") < cmd.index(here) < cmd.index("/tmp/work")
    finally:
        shutil.rmtree(here)


def test_bwrap_failing_self_check_falls_back(fresh_caches, monkeypatch) -> None:
    """bwrap starts, but cannot run the interpreter: the audit-hook sandbox takes over and
    the log line says why."""
    need_bwrap()
    real = bwrap.command
    monkeypatch.setattr(  # bind nothing: an interpreter under a hidden dir cannot start
        bwrap, "command", lambda w, a, bwrap="bwrap", keep=None: real(w, ["/tmp/no/python"], bwrap)
    )
    monkeypatch.setattr(bwrap, "detect", lambda: bwrap.Isolation("bwrap", "probe passed"))
    iso = sandbox.proven_isolation()
    assert iso.name == "audit-hook"
    assert "bwrap failed its self-check: a trivial passing program failed" in iso.detail
    assert sandbox.run_python("print(6 * 7)").stdout.strip() == "42"


def test_no_working_sandbox_stops_the_run(fresh_caches, monkeypatch) -> None:
    monkeypatch.setattr(sandbox.sys, "executable", "/nonexistent/python")
    with pytest.raises(sandbox.SandboxUnavailableError) as err:
        rewards.prove_workers(RewardConfig(code=1.0, correctness=0.0))
    assert "a trivial passing program failed" in str(err.value)
    assert "\n" not in str(err.value) and isinstance(err.value, ConfigError)


def test_sandbox_that_passes_everything_is_refused(fresh_caches, monkeypatch) -> None:
    always_ok = sandbox.SandboxResult(True, 0, False, "", "")
    monkeypatch.setattr(sandbox, "run_python", lambda *a, **k: always_ok)
    assert sandbox.self_check("audit-hook") == "a trivial failing program passed"


def test_math_verifier_self_check() -> None:
    assert verifier.self_check() is None
    rewards.prove_workers(RewardConfig(code=0.0, correctness=1.0))  # does not raise


def test_math_verifier_broken_worker_stops_the_run(monkeypatch) -> None:
    monkeypatch.setattr(verifier, "_judge", lambda *a: 0.0)  # a worker that scores all 0
    broken = verifier._Verifier()
    monkeypatch.setattr(verifier, "VERIFIER", broken)
    try:
        with pytest.raises(ConfigError, match="math-verify worker does not work"):
            rewards.prove_workers(RewardConfig(code=0.0, correctness=1.0))
    finally:
        broken._stop()


def _die_once(marker: str):  # noqa: ANN202
    real = verifier._judge
    # The verifier warms up by judging in the process that forks the worker (once per
    # process): there, in a pytest worker that had not warmed up yet, the SIGTERM below
    # killed the pytest worker itself (a fresh-clone run, 2026-12-05). Only the fork dies.
    test_process = os.getpid()

    def judge(*args):  # noqa: ANN002, ANN202 - runs in the forked worker
        if os.getpid() != test_process and not Path(marker).exists():
            Path(marker).touch()
            os.kill(os.getpid(), signal.SIGTERM)  # the job's scancel reaching the worker
        return real(*args)

    return judge


def test_math_verifier_self_check_survives_worker_killed_by_scancel(monkeypatch, tmp_path) -> None:
    """Found by bench/faults/run.py (two_faults: disk_full + scancel): the scancel's SIGTERM
    killed the worker during the start-up self-check; the run was refused as a config error
    (exit 2) and the monitor STOPPED it for good."""
    monkeypatch.setattr(verifier, "_judge", _die_once(str(tmp_path / "died")))
    fresh = verifier._Verifier()
    monkeypatch.setattr(verifier, "VERIFIER", fresh)
    try:
        assert verifier.self_check() is None
        assert (tmp_path / "died").exists(), "the worker never died: the test proved nothing"
    finally:
        fresh._stop()


def test_a_required_bwrap_that_cannot_run_fails_the_test(monkeypatch) -> None:
    """The switch itself: where bubblewrap is unusable, a test that needs it is skipped,
    and fails instead when GRPO_HPC_REQUIRE_BWRAP is set (scripts/test.sh as root)."""
    unusable = bwrap.Isolation("audit-hook", "bwrap: No permissions to create new namespace")
    monkeypatch.setattr(bwrap, "detect", lambda: unusable)
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="No permissions"):
        need_bwrap()
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_ENV} is set.*No permissions"):
        need_bwrap()
    monkeypatch.setattr(bwrap, "detect", lambda: bwrap.Isolation("bwrap", "works"))
    need_bwrap()  # where it works: neither
