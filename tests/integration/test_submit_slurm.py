"""grpo-submit against the real local Slurm cluster (slurm/up.sh) and the real trainer.

A tiny run goes through sbatch (submitit) -> srun -> NodeLauncher -> torchrun -> trainer,
and every file of the run directory is where the architecture says it is. The two
``grpo-submit --wait`` runs of this module run side by side (the cluster's two CPU slots),
started by one module fixture; each test checks its own.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState

from .slurm_helpers import cli, job_ids, progress, sacct, wait_sacct

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


ZERO_FAULTS = ["faults.enabled=true", "faults.zero_reward=true", "training.zero_reward_patience=2"]


@pytest.fixture(scope="module")
def waited(slurm_cluster, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Both runs submitted with --wait at once: name -> (logs, dry run, the --wait run)."""
    logs = tmp_path_factory.mktemp("submit") / "logs"

    def args(name: str) -> list[str]:
        return ["--profile", "slurm-local", "--config", "tiny", "--name", name, "--logs", str(logs)]

    dry = cli("cli.submit", *args("ok"), "--dry-run", "training.num_threads=1")
    with ThreadPoolExecutor(max_workers=2) as pool:
        ok = pool.submit(cli, "cli.submit", *args("ok"), "--wait", "training.num_threads=1",
                         timeout=300)  # fmt: skip
        zero = pool.submit(cli, "cli.submit", *args("zero"), "--wait", "training.num_threads=1",
                           *ZERO_FAULTS, timeout=300)  # fmt: skip
        return {"ok": (logs, dry, ok.result()), "zero": (logs, None, zero.result())}


def test_submit_wait_runs_tiny_to_completion(waited: dict) -> None:
    logs, dry, proc = waited["ok"]
    paths = RunPaths(logs / "ok")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # One plan behind both: the dry run printed the memory line and the #SBATCH lines of the
    # job that was then submitted.
    memory = [x for x in proc.stdout.splitlines() if x.startswith("memory:")]
    assert dry.returncode == 0 and memory and memory[0] in dry.stdout.splitlines()
    assert "exit code 0 (ok)" in proc.stdout

    (job,) = job_ids(paths)
    assert wait_sacct(job, "COMPLETED", "FAILED", "CANCELLED", timeout=60) == "COMPLETED"
    for f in ("config.yaml", "profile.yaml", "jobs.jsonl", "progress.json", "metrics.jsonl"):
        assert (paths.root / f).is_file(), f
    rec = progress(paths)
    assert rec.state is TrainState.FINISHED and rec.exit_code == 0
    assert rec.step == rec.max_steps == 4 and rec.job_id == job and rec.attempt == 0
    assert rec.last_checkpoint == 4 and paths.latest_checkpoint() == 4

    assert "[Step 4/4]" in paths.training_log.read_text()
    summary = paths.job_summary.read_text()
    assert f"job:        {job}" in summary and "exit code:  0 (OK)" in summary
    assert "step:       4/4" in summary
    job_dir = paths.submitit_dir / job
    for suffix in ("_submission.sh", "_0_log.out", "_0_log.err", "_0_result.pkl"):
        assert (job_dir / f"{job}{suffix}").exists(), suffix
    sbatch = (job_dir / f"{job}_submission.sh").read_text()
    assert "#SBATCH --signal=USR2@20" in sbatch and "#SBATCH --requeue" in sbatch
    directives = [x for x in sbatch.splitlines() if x.startswith("#SBATCH")]
    assert directives == [x for x in dry.stdout.splitlines() if x.startswith("#SBATCH")]


def test_submit_wait_reports_circuit_breaker(waited: dict) -> None:
    """The trainer's exit code (3) reaches grpo-submit --wait; Slurm records FAILED."""
    logs, _, proc = waited["zero"]
    paths = RunPaths(logs / "zero")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "exit code 3 (circuit_breaker)" in proc.stdout
    (job,) = job_ids(paths)
    assert wait_sacct(job, "COMPLETED", "FAILED", "CANCELLED", timeout=60) == "FAILED"
    rec = progress(paths)
    assert rec.state is TrainState.FAILED and rec.exit_code == 3 and rec.step == 2
    assert "exit code:  3 (CIRCUIT_BREAKER)" in paths.job_summary.read_text()
    assert sacct(job)[job] == "FAILED"
