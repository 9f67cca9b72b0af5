"""grpo-submit --resume on the real cluster: refused while the run's job is live, but waited
for when the job's trainer has recorded its end and the job is only leaving the queue;
killed between sbatch and jobs.jsonl, the next --resume (or a grpo-monitor pass) adopts the
job Slurm accepted instead of submitting another one; a submission sbatch refuses is one
line. The runs' jobs are held by --begin (pending, a live job all the same): none of them
uses a CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from grpo_hpc.core.fsutil import append_jsonl, read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import ProgressRecord, TrainState, write_progress
from grpo_hpc.core.slurm import job_name

from ..slowdown import guard, scaled
from .slurm_helpers import (
    REPO,
    cli,
    cli_env,
    describe,
    events,
    job_ids,
    queued,
    scancel,
    submit,
    wait_for,
    wait_sacct,
    write_profile,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

KILLED_AFTER_SBATCH = (
    "import os, sys; import grpo_hpc.submit.job as s; "
    "s.record_job = lambda *a, **k: os._exit(9); "  # dies after sbatch, before the write
    "from grpo_hpc.cli.submit import main; sys.exit(main(sys.argv[1:]))"
)


def _run_jobs(name: str) -> set[str]:
    out = subprocess.run(
        ["squeue", "-h", f"--name={job_name(name)}", "-o", "%i"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


def _held(tmp_path: Path) -> str:
    """A profile whose jobs pend until --begin (an hour away): live, and never running."""
    return str(write_profile(tmp_path / "held.yaml", sbatch_extra={"begin": "now+1hour"}))


def _killed_resume(logs: Path, name: str) -> None:
    """A ``grpo-submit --resume`` killed between sbatch and the jobs.jsonl write."""
    cmd = [sys.executable, "-c", KILLED_AFTER_SBATCH, "--resume", name, "--logs", str(logs)]
    killed = subprocess.run(cmd, env=cli_env(), cwd=REPO, timeout=guard(120))
    assert killed.returncode == 9


def test_resume_refuses_while_job_live(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    first = submit(logs, "live", profile=_held(tmp_path))
    paths = RunPaths(logs / "live")
    try:
        wait_for(f"job {first} in squeue", lambda: first in queued(), 30, interval=0.2)
        before = {p.name: p.read_bytes() for p in (paths.jobs, paths.events) if p.exists()}
        listing = sorted(p.name for p in paths.root.iterdir())
        proc = cli("cli.submit", "--resume", "live", "--logs", str(logs))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert f"live job {first}" in line and f"scancel {first}" in line, line
        after = {p.name: p.read_bytes() for p in (paths.jobs, paths.events) if p.exists()}
        assert after == before and _run_jobs("live") == {first}, "a second job was submitted"
        new = {p.name for p in paths.root.iterdir()} - set(listing)
        assert not new & {"monitor.lock", "events.jsonl"}, f"the refusal wrote {new}"
    finally:
        scancel(first)


def test_killed_resume_is_adopted_not_resubmitted(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    first = submit(logs, "adopt", profile=_held(tmp_path))
    paths = RunPaths(logs / "adopt")
    ours = {first}
    try:
        scancel(first)  # a resume while it is live is refused (test above)
        wait_for(f"job {first} gone from squeue", lambda: first not in queued(), 60)
        _killed_resume(logs, "adopt")
        assert job_ids(paths) == [first]
        orphan = _run_jobs("adopt") - {first}
        ours |= orphan
        assert len(orphan) == 1, "the killed --resume should have left one job in Slurm"

        proc = cli("cli.submit", "--resume", "adopt", "--logs", str(logs))
        assert proc.returncode == 0, proc.stderr
        (job,) = orphan
        assert f"adopted job {job}" in proc.stdout
        ours |= set(job_ids(paths)) | _run_jobs("adopt")
        assert job_ids(paths) == [first, job] and _run_jobs("adopt") <= {first, job}
        assert read_jsonl(paths.events)[-1]["note"] == "adopted"
    finally:
        subprocess.run(["scancel", *sorted(ours)], check=False)  # only this test's jobs


def test_monitor_adopts_the_job_of_a_killed_resume(tmp_path: Path) -> None:
    """The same killed --resume, then a grpo-monitor pass instead of a second --resume: it
    finishes the person's open intent by adopting the job, spends no retry budget, and
    submits nothing."""
    logs = tmp_path / "logs"
    first = submit(logs, "madopt", profile=_held(tmp_path))
    paths = RunPaths(logs / "madopt")
    ours = {first}
    try:
        scancel(first)
        wait_sacct(first, "CANCELLED")  # the monitor reads the end from accounting
        _killed_resume(logs, "madopt")
        orphan = _run_jobs("madopt") - {first}
        ours |= orphan
        assert len(orphan) == 1 and job_ids(paths) == [first], describe(paths)
        (job,) = orphan

        proc = cli("cli.monitor", "madopt", "--logs", str(logs), "--once")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"-> job {job}" in proc.stdout, proc.stdout
        ours |= set(job_ids(paths)) | _run_jobs("madopt")
        assert job_ids(paths) == [first, job], describe(paths)
        assert _run_jobs("madopt") == {job}, "the monitor submitted a job of its own"
        last = read_jsonl(paths.events)[-1]
        assert (last["phase"], last["class"], last["note"]) == ("done", "manual", "adopted")
        assert "adopted" in read_jsonl(paths.jobs)[-1]["reason"]
        assert not [e for e in events(paths, "intent") if e["class"] != "manual"], describe(paths)
    finally:
        subprocess.run(["scancel", *sorted(ours)], check=False)


def test_resume_waits_for_a_job_that_is_only_ending(tmp_path: Path) -> None:
    """A job whose trainer recorded its end (``--wait`` returns then) is still in squeue for
    a few seconds (its last seconds, then COMPLETING): a --resume typed at once waits for it
    to leave, then submits, instead of refusing."""
    logs = tmp_path / "logs"
    first = submit(logs, "ending", profile=_held(tmp_path))
    paths = RunPaths(logs / "ending")
    ours = {first}
    try:
        scancel(first)
        wait_for(f"job {first} gone from squeue", lambda: first not in queued(), 60)
        # the run's next job: ends ENDING_S after its start, its trainer already finished
        script = tmp_path / "ending.sh"
        script.write_text(f"#!/bin/bash\nsleep {scaled(ENDING_S):.0f}\n")
        out = subprocess.run(
            ["sbatch", "--parsable", f"--job-name={job_name('ending')}", "-o", "/dev/null",
             str(script)],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        ending = out.split(";")[0]
        ours.add(ending)
        append_jsonl(paths.jobs, {"job_id": ending, "attempt": 1, "executor": "slurm"})
        rec = ProgressRecord(run="ending", attempt=1, job_id=ending, state=TrainState.FINISHED)
        write_progress(paths.progress, rec)
        wait_for(f"job {ending} running", lambda: _state(ending) == "R", 60, interval=0.2)

        t0 = time.time()
        proc = cli("cli.submit", "--resume", "ending", "--logs", str(logs))
        ours |= set(job_ids(paths))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert wait_sacct(ending, "COMPLETED", "FAILED", "CANCELLED") == "COMPLETED"
        ended = _sacct_end(ending)
        # The job lived on for seconds after the resume began (it would have refused then,
        # had it not waited), and the next job was submitted only after it had ended.
        assert ended - t0 > 4, f"the job ended {ended - t0:.1f} s after the resume began"
        jobs = read_jsonl(paths.jobs)
        assert len(jobs) == 3 and jobs[-1]["submitted_at"] >= ended, describe(paths)
    finally:
        subprocess.run(["scancel", *sorted(ours)], check=False)


ENDING_S = 12
"""How long the hand-made job runs after it starts (longer than a CLI takes to start;
stretched on a slow machine, tests/slowdown.py)."""


def _sacct_end(job: str) -> float:
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "End", "-j", job],
        capture_output=True, text=True, check=True, env={**os.environ, "SLURM_TIME_FORMAT": "%s"},
    ).stdout.strip()  # fmt: skip
    assert out.isdigit(), f"job {job} has no end time: {out!r}"
    return float(out)


def _state(job: str) -> str:
    out = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%t"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip()


def test_submission_sbatch_refuses_is_one_line(tmp_path: Path) -> None:
    """submit/job.py turns submitit's FailedSubmissionError (sbatch's own message among
    submitit's) into one line, "submission failed: <sbatch's last line>": here sbatch of
    the real cluster refuses a partition that does not exist. Nothing is recorded as a
    job; the person's intent is closed with the error; the monitor keeps the run."""
    logs = tmp_path / "logs"
    first = submit(logs, "refused", profile=_held(tmp_path))
    paths = RunPaths(logs / "refused")
    try:
        scancel(first)
        wait_sacct(first, "CANCELLED")
        profile = yaml.safe_load(paths.profile.read_text())
        paths.profile.write_text(yaml.safe_dump({**profile, "partition": "nosuchpartition"}))

        proc = cli("cli.submit", "--resume", "refused", "--logs", str(logs))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert "submission failed: " in line and "Invalid partition name" in line, line
        assert job_ids(paths) == [first] and _run_jobs("refused") == set()
        last = read_jsonl(paths.events)[-1]
        assert (last["phase"], last["class"]) == ("error", "manual"), last
        assert "Invalid partition name" in last["error"]

        mon = cli("cli.monitor", "refused", "--logs", str(logs), "--once")
        assert mon.returncode == 0, mon.stdout + mon.stderr
        assert "[error: submission failed: " in mon.stdout, mon.stdout
        assert "Invalid partition name" in mon.stdout, mon.stdout
        assert job_ids(paths) == [first] and _run_jobs("refused") == set()
        stops = [e for e in events(paths, "decision") if e["action"] == "STOP"]
        assert not stops, "one refused submission must not stop the run"
    finally:
        scancel(*_run_jobs("refused"), first)
