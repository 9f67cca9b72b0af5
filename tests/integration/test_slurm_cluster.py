"""Smoke tests of the local single-node Slurm test cluster (slurm/up.sh).

They check what the toolkit relies on: sbatch/sacct job states (submitit reads states with
sacct), fake GPUs through --gres, scancel -> CANCELLED, and --signal warnings before the
time limit (slurmctld checks time limits every 30 s, so that test takes up to ~35 s).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from ..slowdown import guard

pytestmark = pytest.mark.slurm

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL")


def _run(*cmd: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=guard(30), check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr}"
    return proc.stdout


def sbatch(tmp_path: Path, script: str, *args: str, name: str = "job") -> tuple[str, Path]:
    """Submit ``script`` (bash body) with extra sbatch ``args``; return (job id, output file)."""
    path = tmp_path / f"{name}.sh"
    path.write_text("#!/bin/bash\n" + script)
    out = tmp_path / f"{name}.out"
    job_id = _run(
        "sbatch", "--parsable", f"--job-name={name}", f"--output={out}", *args, str(path)
    ).strip()
    assert job_id.isdigit(), job_id
    return job_id, out


def sacct_state(job_id: str) -> str:
    """State of the job allocation as accounting sees it ('' until slurmdbd knows the job)."""
    out = _run("sacct", "-j", job_id, "-n", "-X", "-P", "-o", "State")
    lines = out.strip().splitlines()
    return lines[0].strip() if lines else ""


def wait_state(job_id: str, want: tuple[str, ...], timeout: float = 60.0) -> str:
    """Poll sacct until the state starts with one of ``want`` (e.g. 'CANCELLED by 0')."""
    deadline = time.monotonic() + guard(timeout)
    state = ""
    while time.monotonic() < deadline:
        state = sacct_state(job_id)
        if state.startswith(want):
            return state
        if state.startswith(TERMINAL):
            break
        time.sleep(0.5)
    pytest.fail(f"job {job_id}: sacct state {state!r}, wanted {want} within {timeout:.0f} s")


def test_cluster_is_up(slurm_cluster) -> None:
    # "comp": the node is finishing an earlier test's job (epilog); it is up.
    state = _run("sinfo", "-h", "-N", "-n", slurm_cluster.node, "-o", "%t").strip()
    assert state in ("idle", "mix", "alloc", "comp"), state
    default = _run("sinfo", "-h", "-o", "%P").split()
    assert f"{slurm_cluster.partition}*" in default


def test_sbatch_job_completes(tmp_path: Path) -> None:
    job_id, out = sbatch(tmp_path, 'echo "hello from $SLURM_JOB_ID on $SLURMD_NODENAME"\n')
    assert wait_state(job_id, ("COMPLETED",)) == "COMPLETED"
    assert sacct_state(job_id) == "COMPLETED"
    assert out.read_text().strip() == f"hello from {job_id} on localhost"


def test_failing_job_is_failed(tmp_path: Path) -> None:
    job_id, _ = sbatch(tmp_path, "exit 3\n")
    assert wait_state(job_id, ("FAILED",)) == "FAILED"
    exit_code = _run("sacct", "-j", job_id, "-n", "-X", "-P", "-o", "ExitCode").strip()
    assert exit_code == "3:0"


def test_gres_gpu_job_runs(tmp_path: Path, slurm_cluster) -> None:
    n = slurm_cluster.gpus
    job_id, out = sbatch(
        tmp_path, 'echo "CVD=$CUDA_VISIBLE_DEVICES"\nsrun true\n', f"--gres=gpu:{n}"
    )
    wait_state(job_id, ("COMPLETED",))
    assert out.read_text().strip() == "CVD=" + ",".join(str(i) for i in range(n))
    tres = _run("sacct", "-j", job_id, "-n", "-X", "-P", "-o", "AllocTRES")
    assert f"gres/gpu={n}" in tres


def test_scancel_running_job_is_cancelled(tmp_path: Path) -> None:
    job_id, _ = sbatch(tmp_path, "sleep 300\n")
    wait_state(job_id, ("RUNNING",))
    _run("scancel", job_id)
    state = wait_state(job_id, ("CANCELLED",))
    assert state.startswith("CANCELLED"), state


@pytest.mark.slow
def test_signal_before_time_limit(tmp_path: Path) -> None:
    """--signal=USR1@25 reaches job steps (srun, as submitit uses it); B: the batch shell.

    Both jobs run side by side (1 CPU each). slurmctld checks time limits every 30 s and
    sends a warning signal up to one check early: with a 1-minute limit and a 25 s lead it
    comes 5 to 35 s after the start (with 15 s: 15 to 45 s), after the traps are set.
    """
    loop = "while :; do sleep 1 & wait $!; done"
    step_job, step_out = sbatch(
        tmp_path,
        f"srun bash -c 'trap \"echo step got USR1; exit 0\" USR1; {loop}'\n",
        "--signal=USR1@25",
        "--time=1",
        name="step_signal",
    )
    batch_job, batch_out = sbatch(
        tmp_path,
        f"trap 'echo batch got USR1; exit 0' USR1\n{loop}\n",
        "--signal=B:USR1@25",
        "--time=1",
        name="batch_signal",
    )
    # A job that got no signal would hit its 1-minute limit and end as TIMEOUT.
    assert wait_state(step_job, ("COMPLETED",), timeout=100) == "COMPLETED"
    assert wait_state(batch_job, ("COMPLETED",), timeout=40) == "COMPLETED"
    assert "step got USR1" in step_out.read_text()
    assert "batch got USR1" in batch_out.read_text()
