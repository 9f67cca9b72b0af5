"""After a node failure, a two-node job whose part on the node left cannot end yet
(COMPLETING: its allocation still holds that node) is waited for by the monitor, not
cancelled and replaced (grpo_hpc/monitor/node_loss.py). No trainer: the job is a two-node
``srun sleep`` and the run's later jobs are held by --begin, so it costs no CPU. In the
two-node tests' pytest-xdist group (tests/conftest.py): it kills grpo-n2."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_hpc.core.fsutil import append_jsonl, read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.slurm import job_name

from ..slowdown import guard
from .slurm_helpers import (
    cli,
    cluster_lock,
    describe,
    events,
    job_ids,
    kill_node,
    node_processes,
    queued,
    restart_nodes,
    scancel,
    submit,
    wait_for,
    wait_sacct,
    write_profile,
)

pytestmark = pytest.mark.slurm

PROFILE = "slurm-local-2node"
VICTIM = "grpo-n2"


@pytest.fixture(scope="module", autouse=True)
def _slurmctld_stays() -> Iterator[None]:
    """slurmctld must not be taken away under this module (slurm_helpers.cluster_lock)."""
    with cluster_lock(exclusive=False):
        yield


@pytest.fixture
def logs(two_nodes, tmp_path: Path) -> Iterator[Path]:
    """The test's logs directory; afterwards its runs' jobs are cancelled and both nodes
    are up again."""
    root = tmp_path / "logs"
    yield root
    if root.is_dir():
        scancel(*(j for d in root.iterdir() if d.is_dir() for j in job_ids(RunPaths(d))))
    restart_nodes()


def _squeue(job: str, fmt: str) -> str:
    return _run_out("squeue", "-h", "-j", job, "-o", fmt)


def _run_out(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=guard(30)).stdout.strip()


def _stepds(node: str, job: str) -> list[int]:
    """The slurmstepd processes of ``job`` on ``node`` (``slurmstepd: [JOB.STEP]``): not
    those of another test's job on the same node."""
    found = []
    for pid, comm in node_processes(node).items():
        with contextlib.suppress(OSError):
            title = Path(f"/proc/{pid}/cmdline").read_bytes()
            if comm == "slurmstepd" and f"[{job}.".encode() in title:
                found.append(pid)
    return found


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def test_after_a_node_failure_the_monitor_waits_for_the_job_still_completing(
    logs: Path, tmp_path: Path
) -> None:
    """No trainer: the run's job is a two-node ``srun sleep`` (no CPU) and later jobs are
    held by --begin. grpo-n2 dies while the job's part on grpo-n1 cannot end (its slurmstepd
    stopped, as a step stuck in teardown): accounting says NODE_FAIL, squeue COMPLETING. A
    monitor pass (profile ``nodes_wait_s: 0``) then waits and says why (it used to cancel
    the job and resubmit on grpo-n1 within its pass, blocking 30 s on a job that could not
    leave). Once Slurm has released the nodes and requeued the job, a pass replaces it on
    the node left."""
    profile = write_profile(tmp_path / "held-2node.yaml", base=PROFILE, nodes_wait_s=0,
                            sbatch_extra={"begin": "now+1hour"})  # fmt: skip
    first = submit(logs, "ending", profile=str(profile))
    paths = RunPaths(logs / "ending")
    scancel(first)
    wait_for(f"job {first} gone from squeue", lambda: first not in queued(), 60)
    sbatch = ["sbatch", "--parsable", "-p", "multi", "-N", "2", "--requeue", "-o", "/dev/null",
              f"--job-name={job_name('ending')}", "--wrap", "srun sleep 600"]  # fmt: skip
    job = _run_out(*sbatch).split(";")[0]
    append_jsonl(paths.jobs, {"job_id": job, "attempt": 1, "executor": "slurm", "nodes": 2,
                              "submitted_at": time.time()})  # fmt: skip
    wait_for(f"job {job} running", lambda: _squeue(job, "%t") == "R", 60, interval=0.3)
    wait_for("its step on grpo-n1", lambda: len(_stepds("grpo-n1", job)) == 2, 30, interval=0.3)
    stepds = _stepds("grpo-n1", job)  # its batch step and its srun step
    _signal(stepds, signal.SIGSTOP)
    try:
        kill_node(VICTIM, reported=True)
        wait_for(f"job {job} COMPLETING", lambda: _squeue(job, "%T") == "COMPLETING", 30,
                 interval=0.3)  # fmt: skip
        wait_sacct(job, "NODE_FAIL", timeout=30)
        once = cli("cli.monitor", "ending", "--logs", str(logs), "--once", "--backoff", "0")
        assert once.returncode == 0, once.stdout + once.stderr
        assert _squeue(job, "%T") == "COMPLETING", "the test's premise"
        (ev,) = [e for e in events(paths, "decision") if e["job_id"] == job]
        assert (ev["action"], ev["slurm_state"]) == ("NONE", "COMPLETING"), describe(paths)
        assert "Slurm has not released its nodes" in ev["reason"]
        assert not events(paths, "intent") and job_ids(paths) == [first, job], describe(paths)
    finally:
        _signal(stepds, signal.SIGCONT)
    wait_sacct(job, "PENDING", timeout=60)  # released and requeued; grpo-n2 is down
    again = cli("cli.monitor", "ending", "--logs", str(logs), "--once", "--backoff", "0")
    assert again.returncode == 0, again.stdout + again.stderr
    (intent,) = events(paths, "intent")
    got = (intent["class"], intent["nodes"], intent["slurm_state"])
    assert got == ("node_fail", 1, "PENDING"), intent
    last = read_jsonl(paths.jobs)[-1]
    assert (last["nodes"], last.get("short_of")) == (1, 2), describe(paths)
