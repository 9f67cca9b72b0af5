"""Helpers for the tests that run grpo-submit / grpo-monitor / grpo-status against the local
Slurm cluster (slurm/up.sh): CLIs as subprocesses, bounded polling, raw sacct for asserts.

Assertions about Slurm use ``sacct``/``squeue`` directly, not grpo_hpc.core.slurm, so a bug
in the code under test cannot hide itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml

from grpo_hpc.core.fsutil import read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import ProgressRecord, read_progress

from ..slowdown import guard

REPO = Path(__file__).resolve().parents[2]
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED")
T = TypeVar("T")


CLUSTER_LOCK = Path(tempfile.gettempdir()) / "grpo-hpc-test-cluster.lock"
"""The lock that keeps the tests of the two-node partition (pytest-xdist group
``slurm-multi``, tests/conftest.py) and a test that takes slurmctld away from running at
the same time: a job submitted or waited on while slurmctld is down would fail for a
reason the test did not set up."""


@contextlib.contextmanager
def cluster_lock(exclusive: bool) -> Iterator[None]:
    """Hold :data:`CLUSTER_LOCK`: shared by the tests that need slurmctld for their whole
    length, exclusive for one that stops it (waiting until no shared holder is left)."""
    with open(CLUSTER_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield  # released when the file closes


def cli_env() -> dict[str, str]:
    """Environment for the CLIs; sbatch exports it to the jobs (one thread, no downloads)."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
    }


def cli(module: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``python -m grpo_hpc.<module> args`` (the console scripts' entry points)."""
    return subprocess.run(
        [sys.executable, "-m", f"grpo_hpc.{module}", *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=guard(timeout),
        cwd=REPO,
    )


def start_cli(module: str, *args: str, log: Path) -> subprocess.Popen:
    """Start a CLI in the background, stdout+stderr to ``log``."""
    out = open(log, "ab")  # noqa: SIM115 - owned by the process
    return subprocess.Popen(
        [sys.executable, "-m", f"grpo_hpc.{module}", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=cli_env(),
        cwd=REPO,
    )


def submit(logs: Path, name: str, *overrides: str, profile: str = "slurm-local") -> str:
    """grpo-submit a tiny run (no wait); returns its first job id."""
    args = ["--profile", profile, "--config", "tiny", "--name", name, "--logs", str(logs)]
    proc = cli("cli.submit", *args, "training.num_threads=1", *overrides)
    assert proc.returncode == 0, f"grpo-submit failed ({proc.returncode}):\n{proc.stderr}"
    return job_ids(RunPaths(logs / name))[0]


def write_profile(path: Path, base: str = "slurm-local", **changes: Any) -> Path:
    """A copy of templates/<base>.yaml with some keys changed (e.g. time_min=1)."""
    data = yaml.safe_load((REPO / "templates" / f"{base}.yaml").read_text())
    path.write_text(yaml.safe_dump({**data, **changes}))
    return path


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout: float,
    interval: float = 1.0,
    explain: Callable[[], str] | None = None,
) -> T:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` after timeout,
    followed by ``explain()`` (read then, not when the wait began) where one is given."""
    limit = guard(timeout)  # stretched: tests/slowdown.py
    deadline = time.monotonic() + limit
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            why = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {limit:.0f} s waiting for {what}{why}")
        time.sleep(interval)


def cluster_state() -> str:
    """squeue and sinfo as they are now, for a failure message (never raises)."""
    parts = []
    for cmd in (["squeue", "-a", "-o", "%i %P %j %T %R %M"], ["sinfo", "-N", "-o", "%N %P %t %C"]):
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=guard(30), check=False
            )
            parts.append(f"-- {cmd[0]}\n{proc.stdout}{proc.stderr}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            parts.append(f"-- {cmd[0]}: {exc}")
    return "\n".join(parts)


# ----------------------------------------------------------------------- run directory


def job_ids(paths: RunPaths) -> list[str]:
    return [str(j["job_id"]) for j in read_jsonl(paths.jobs)]


def events(paths: RunPaths, phase: str | None = None) -> list[dict[str, Any]]:
    return [e for e in read_jsonl(paths.events) if phase is None or e.get("phase") == phase]


def progress(paths: RunPaths) -> ProgressRecord:
    rec = read_progress(paths.progress)
    assert rec is not None, f"{paths.progress} missing or unreadable"
    return rec


def step_log(paths: RunPaths) -> list[int]:
    """The training steps of metrics.jsonl in the order they were logged (eval lines skipped)."""
    return [int(m["step"]) for m in read_jsonl(paths.metrics) if "reward/mean" in m]


def final_event(paths: RunPaths) -> dict[str, Any] | None:
    """The STOP/DONE decision about the run's newest job, if a monitor made one."""
    ids = job_ids(paths)
    for ev in reversed(events(paths, "decision")):
        if ids and str(ev["job_id"]) == ids[-1] and ev["action"] in ("STOP", "DONE"):
            return ev
    return None


def describe(paths: RunPaths) -> str:
    """Everything useful about a run for a failure message."""
    parts = [f"== {paths.name}: jobs {job_ids(paths)} sacct {sacct(*job_ids(paths))}"]
    for f in (paths.progress, paths.events, paths.job_summary):
        if f.exists():
            parts.append(f"-- {f.name}\n{f.read_text()[-3000:]}")
    if paths.training_log.exists():
        parts.append("-- training_output.log (tail)\n" + paths.training_log.read_text()[-1500:])
    return "\n".join(parts)


# ------------------------------------------------------------------------------ Slurm


def _run(*cmd: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=guard(30), check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr}"
    return proc.stdout


def sacct(*ids: str) -> dict[str, str]:
    """Job id -> sacct state word of the allocation (missing until slurmdbd knows it)."""
    if not ids:
        return {}
    out = _run("sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(ids))
    rows = (line.split("|") for line in out.splitlines() if "|" in line)
    return {job: state.split()[0] for job, state in rows}


def sacct_start(job_id: str) -> float:
    """Unix time the job (its latest run) started."""
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "Start", "-j", job_id],
        capture_output=True,
        text=True,
        timeout=guard(30),
        env={**os.environ, "SLURM_TIME_FORMAT": "%s"},
        check=True,
    ).stdout.strip()
    assert out.isdigit(), f"job {job_id} has no start time: {out!r}"
    return float(out)


def wait_sacct(job_id: str, *want: str, timeout: float = 60) -> str:
    """Poll sacct until the job is in one of ``want``."""
    return wait_for(
        f"job {job_id} in {want} (now {sacct(job_id).get(job_id)})",
        lambda: sacct(job_id).get(job_id) in want and sacct(job_id)[job_id],
        timeout,
        interval=0.5,
    )


def jobs_of_run(paths: RunPaths) -> set[str]:
    """Every job Slurm has for this run directory (by job name and sbatch script path):
    squeue for queued jobs (at once), sacct for all (slurmdbd learns of a job seconds late)."""
    name, prefix = f"--name=grpo-{paths.name}", f"{paths.submitit_dir}/"
    lines = _run("squeue", "-h", name, "-o", "%i|%o").splitlines()
    lines += _run(
        "sacct", "-X", "-n", "-P", "-S", "now-1days", "-E", "now+3650days", name,
        "-o", "JobID,SubmitLine",
    ).splitlines()  # fmt: skip
    return {
        line.split("|", 1)[0] for line in lines if "|" in line and prefix in line.split("|", 1)[1]
    }


def assert_one_slurm_job_per_entry(paths: RunPaths, timeout: float = 30) -> None:
    """Slurm has exactly the jobs of jobs.jsonl for this run: no duplicate, no orphan."""
    ids = set(job_ids(paths))
    wait_for(f"Slurm to list jobs {sorted(ids)}", lambda: ids <= jobs_of_run(paths), timeout)
    assert jobs_of_run(paths) == ids, describe(paths)


def queued() -> set[str]:
    return {line.strip() for line in _run("squeue", "-h", "-o", "%i").splitlines() if line}


def scancel(*ids: str) -> None:
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=guard(30), check=False)


def dump_json(rows: Any) -> str:
    return json.dumps(rows, indent=1, default=str)


# ------------------------------------------------------------------ nodes of the cluster


def sacct_attempts(job_id: str) -> list[tuple[str, str]]:
    """(state, nodelist) of every run of a job, a requeued one's earlier runs included."""
    out = _run("sacct", "-D", "-X", "-n", "-P", "-o", "State,NodeList", "-j", job_id)
    return [tuple(line.split("|")) for line in out.splitlines() if "|" in line]  # type: ignore[misc]


def step_nodes(job_id: str) -> str:
    """The node list of the job's first step (the one submitit's srun starts)."""
    out = _run("sacct", "-n", "-P", "-o", "JobID,NodeList", "-j", job_id)
    rows = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
    return rows.get(f"{job_id}.0", "")


def node_processes(node: str) -> dict[int, str]:
    """pid -> command name of every process in the node's network namespace."""
    pids = [int(p) for p in _run("ip", "netns", "pids", node).split()]
    comms = {}
    for pid in pids:
        try:
            comms[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:  # exited meanwhile
            continue
    return comms


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_job_processes(node: str) -> list[int]:
    """SIGKILL the job's processes on a node (its slurmd and slurmstepd stay): the node's
    part of a job dies as under the OOM killer. Returns the pids killed."""
    pids = [p for p, c in node_processes(node).items() if c not in ("slurmd", "slurmstepd")]
    kill_pids(pids)
    return pids


def kill_node(node: str, down_within_s: float = 90.0, reported: bool = False) -> list[int]:
    """A node lost as a powered-off node is lost: everything on it, its slurmd included,
    stops answering at once (SIGSTOP), and is SIGKILLed only once slurmctld has set the
    node DOWN (SlurmdTimeout). Killing at once would let the kernel close the dead
    ranks' sockets: the surviving rank fails within a second, and whether its job then ends
    FAILED or NODE_FAIL is a race against slurmctld's ping (the test flipped on load).
    ``reported``: the node is also set DOWN at once (``scontrol update state=down``, as a
    site's health check or an admin does) instead of after SlurmdTimeout's 10-25 s; what
    follows (NODE_FAIL, the requeue, the node down until restart_nodes) is the same."""
    pids = list(node_processes(node))
    for pid in pids:
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            pass
    try:
        if reported:
            _run("scontrol", "update", f"nodename={node}", "state=down", "reason=lost-in-a-test")
        wait_for(f"slurmctld to set {node} DOWN", lambda: _node_down(node), down_within_s)
    finally:  # a failed wait must not leave the node stopped for every later two-node test
        kill_pids(pids)
    return pids


def _node_down(node: str) -> bool:
    """slurmctld has set the node DOWN (sinfo's ``down*``): its jobs are NODE_FAIL by now."""
    return _run("sinfo", "-h", "-N", "-n", node, "-o", "%t").strip().startswith("down")


def restart_nodes(nodes: int = 2) -> None:
    """``slurm/up.sh --nodes N``: restarts what is missing (a killed slurmd); the node
    returns to service by itself (ReturnToService=2)."""
    proc = subprocess.run(
        ["bash", str(REPO / "slurm" / "up.sh"), "--nodes", str(nodes)],
        capture_output=True,
        text=True,
        timeout=guard(120),
        check=False,
    )
    assert proc.returncode == 0, f"up.sh --nodes {nodes} failed:\n{proc.stdout}{proc.stderr}"


def stop_trainer(node: str) -> list[int]:
    """SIGSTOP the trainer process(es) on a node: a rank that hangs without dying (alive,
    holding its sockets, never answering). Returns the pids stopped."""
    pids = []
    for pid in node_processes(node):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"grpo_hpc.train" in argv and b"torch.distributed.run" not in argv:
            os.kill(pid, signal.SIGSTOP)
            pids.append(pid)
    return pids


def stop_slurmctld(state_dir: Path) -> int:
    """SIGTERM slurmctld and wait until it has exited (Slurm is away until
    :func:`restart_nodes` starts it again; queued jobs survive in its state). Returns its pid."""
    pid = int((state_dir / "run" / "slurmctld.pid").read_text().split()[0])
    os.kill(pid, signal.SIGTERM)
    wait_for(f"slurmctld (pid {pid}) to exit", lambda: not Path(f"/proc/{pid}").exists(), 30, 0.1)
    return pid


@contextlib.contextmanager
def monitored(tmp_path: Path) -> Iterator[tuple[Path, Path, list[subprocess.Popen]]]:
    """A two-node test's logs folder, monitor log and monitor processes (the test starts
    them); afterwards every monitor left is killed, the runs' jobs cancelled and both nodes
    brought back up for whatever runs next."""
    logs, log = tmp_path / "logs", tmp_path / "monitor.log"
    procs: list[subprocess.Popen] = []
    yield logs, log, procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    if logs.is_dir():
        scancel(*(j for d in logs.iterdir() if d.is_dir() for j in job_ids(RunPaths(d))))
    restart_nodes()
