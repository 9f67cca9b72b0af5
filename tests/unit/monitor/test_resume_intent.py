"""``grpo-submit --resume`` killed between sbatch and jobs.jsonl: the intent it recorded
before submitting lets the next ``--resume`` (or a monitor pass) adopt the job instead of
submitting a second one. Slurm is a set of shell scripts on PATH that log every sbatch and
list the submitted jobs like squeue does; the real cluster version is in
tests/integration/test_submit_slurm.py."""

from __future__ import annotations

import stat
from pathlib import Path

from grpo_hpc.core.fsutil import read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.monitor.decision import MonitorPolicy
from grpo_hpc.monitor.loop import Backend, monitor_pass
from tests.conftest import run_cli

FAKE_SLURM = {
    # every sbatch call is logged; job ids count up from 101
    "sbatch": 'echo "$@" >> "$SLURM_LOG"; echo "Submitted batch job $((100 + $(/usr/bin/wc -l '
    '< "$SLURM_LOG")))"',
    "sinfo": "echo debug",
    "srun": "true",
    # squeue --name=...: every job sbatch accepted, as id|submit time|submit line
    "squeue": 'case "$*" in *--name=*) n=100; while read -r args; do n=$((n + 1)); '
    'echo "$n|$(/usr/bin/date +%s)|sbatch $args"; done < "$SLURM_LOG";; esac',
    "sacct": "true",
    "scancel": "true",
}

KILLED_AFTER_SBATCH = (
    "import os, sys; import grpo_hpc.submit.job as s; "
    "s.record_job = lambda *a, **k: os._exit(9); "  # the process dies before the write
    "from grpo_hpc.cli.submit import main; sys.exit(main(sys.argv[1:]))"
)


def _slurm_env(tmp_path: Path, logs: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKE_SLURM.items():
        f = bin_dir / name
        f.write_text(f"#!/bin/sh\n{body}\n")
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "sbatch.log"
    log.touch()
    return {"PATH": str(bin_dir), "SLURM_LOG": str(log), "GRPO_HPC_LOGS": str(logs)}


def _sbatch_calls(env: dict[str, str]) -> int:
    return len(Path(env["SLURM_LOG"]).read_text().splitlines())


def _killed_resume(env: dict[str, str], run: str) -> None:
    import subprocess
    import sys

    from tests.conftest import REPO

    cmd = [sys.executable, "-c", KILLED_AFTER_SBATCH, "--resume", run]
    proc = subprocess.run(cmd, env={**__import__("os").environ, **env}, cwd=REPO, timeout=300)
    assert proc.returncode == 9


def _submit(env: dict[str, str], *args: str):
    result = run_cli("grpo_hpc.cli.submit:main", *args, env=env)
    assert result.returncode == 0, result.stderr
    return result


def test_next_resume_adopts_instead_of_submitting_again(tmp_path: Path, logs_dir: Path) -> None:
    env = _slurm_env(tmp_path, logs_dir)
    _submit(env, "--profile", "slurm-local", "--config", "tiny", "--name", "r")
    paths = RunPaths(logs_dir / "r")
    _killed_resume(env, "r")
    assert _sbatch_calls(env) == 2  # Slurm has job 102 ...
    assert [j["job_id"] for j in read_jsonl(paths.jobs)] == ["101"]  # ... the run does not
    assert read_jsonl(paths.events)[-1]["phase"] == "intent"

    result = _submit(env, "--resume", "r")
    assert "adopted job 102" in result.stdout
    assert _sbatch_calls(env) == 2, "submitted a second job for one --resume"
    jobs = read_jsonl(paths.jobs)
    assert [j["job_id"] for j in jobs] == ["101", "102"] and "adopted" in jobs[-1]["reason"]
    last = read_jsonl(paths.events)[-1]
    assert (last["phase"], last["new_job_id"], last["note"]) == ("done", "102", "adopted")

    _submit(env, "--resume", "r")  # an ordinary resume afterwards: intent, sbatch, done
    assert _sbatch_calls(env) == 3 and read_jsonl(paths.jobs)[-1]["job_id"] == "103"
    phases = [(e["phase"], e["class"]) for e in read_jsonl(paths.events)[-2:]]
    assert phases == [("intent", "manual"), ("done", "manual")]


def test_monitor_adopts_the_job_of_a_killed_resume(tmp_path: Path, logs_dir: Path) -> None:
    env = _slurm_env(tmp_path, logs_dir)
    _submit(env, "--profile", "slurm-local", "--config", "tiny", "--name", "r")
    paths = RunPaths(logs_dir / "r")
    _killed_resume(env, "r")
    adopted: list[str] = []
    backend = Backend(
        job_records=lambda ids: {},
        queued_job_ids=lambda: {"101", "102"},
        submitted_jobs=lambda p, since: ["101", "102"],
        adopt=lambda p, job, reason, nodes: adopted.append(job),
        resubmit=lambda p, reason: (_ for _ in ()).throw(AssertionError("submitted again")),
    )
    (out,) = monitor_pass([paths], MonitorPolicy(), backend=backend)
    assert out.new_job_id == "102" and adopted == ["102"]
    last = read_jsonl(paths.events)[-1]
    assert (last["phase"], last["class"], last["note"]) == ("done", "manual", "adopted")
    # a person's resume spends none of the monitor's retry budget
    from grpo_hpc.monitor.decision import history_from

    assert history_from(read_jsonl(paths.events), read_jsonl(paths.jobs)).retries == {}
