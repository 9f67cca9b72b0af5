"""grpo-eval --profile slurm-local: the evaluation as a job on the real local Slurm cluster
gives the result grpo-eval gives here, and a bad model name is refused before it queues.
The tests that need a trained run share one (trained here, 2 steps)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.e2e.helpers import make_run, train

from .slurm_helpers import cli


def squeue_ids() -> set[str]:
    from grpo_hpc.core.slurm import queued_job_ids

    return queued_job_ids()


pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The logs directory of run ``r``, trained here for 2 steps."""
    logs = tmp_path_factory.mktemp("eval") / "logs"
    paths = make_run(logs, "r", "training.max_steps=2", "training.eval_every=2")
    assert train(paths).returncode == 0
    return logs


def test_eval_job_matches_local_eval(tmp_path: Path, trained: Path) -> None:
    logs = ["--logs", str(trained)]
    common = ["r", *logs, "--data", "arithmetic", "--num", "6"]
    here, there = tmp_path / "here.json", tmp_path / "there.json"
    with ThreadPoolExecutor(max_workers=1) as pool:  # the job and the local eval side by side
        submitted = pool.submit(
            cli, "cli.eval", *common, "--profile", "slurm-local", "--out", str(there), timeout=300
        )
        local = cli("cli.eval", *common, "--out", str(here), timeout=300)
        job = submitted.result()
    assert local.returncode == 0, local.stdout + local.stderr
    assert job.returncode == 0, job.stdout + job.stderr
    assert "submitted evaluation job" in job.stdout and str(there) in job.stdout.splitlines()[-1]
    a, b = json.loads(here.read_text()), json.loads(there.read_text())
    assert (b["correct"], b["problems"], b["accuracy"]) == (
        a["correct"],
        a["problems"],
        a["accuracy"],
    )
    assert (tmp_path / "there.json.submitit").is_dir()  # the job's script and logs


def test_unknown_model_is_refused_before_queueing(tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    args = ["nope", "--logs", str(tmp_path), "--profile", "slurm-local", "--out", str(out)]
    proc = cli("cli.eval", *args, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "nope" in proc.stderr
    assert not out.exists() and not (tmp_path / "x.json.submitit").exists()


def test_a_job_that_can_never_start_is_cancelled_with_one_line(
    tmp_path: Path, trained: Path
) -> None:
    """A profile asking for more CPUs per task than the partition's node has (as
    supercloud's 20 on this 2-CPU cluster) pends with PartitionConfig forever: grpo-eval
    cancels it and says why, instead of waiting. One sbatch refuses outright (a GRES type
    the cluster lacks) is one line too."""
    local = Path(__file__).resolve().parents[2] / "templates" / "slurm-local.yaml"
    profile = tmp_path / "volta.yaml"
    profile.write_text(local.read_text().replace("cpus_per_task: 1", "cpus_per_task: 64"))
    args = ["r", "--logs", str(trained), "--profile", str(profile)]
    proc = cli("cli.eval", *args, "--out", str(tmp_path / "v.json"), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "can never start" in err[0] and "cancelled" in err[0], err
    job = proc.stdout.split("submitted evaluation job ")[1].split()[0]
    assert job not in squeue_ids()

    profile.write_text(local.read_text() + "gres: gpu:volta:2\n")
    proc = cli("cli.eval", *args, "--out", str(tmp_path / "w.json"), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "refused the evaluation job" in err[0], err
