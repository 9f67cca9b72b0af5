"""Every console script, met the way users meet it: nothing under logs/, a wrong run name,
an unreadable progress file, files deleted under a running monitor. Each case is one
line on stderr and a documented exit code, never a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.fsutil import append_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.monitor.decision import MonitorPolicy
from grpo_hpc.monitor.loop import Backend, monitor_pass
from tests.conftest import make_checkpoint, run_cli

MAINS = {
    "grpo-status": "grpo_hpc.cli.status:main",
    "grpo-monitor": "grpo_hpc.cli.monitor:main",
    "grpo-ckpt": "grpo_hpc.cli.ckpt:main",
    "grpo-submit": "grpo_hpc.cli.submit:main",
}


def _run(prog: str, *args: str):
    result = run_cli(MAINS[prog], *args)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def _one_line_error(result, prog: str, code: int, fragment: str) -> None:
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:"), result.stderr
    assert fragment in lines[0], lines[0]


def _run_dir(logs: Path, name: str) -> RunPaths:
    paths = RunPaths(logs / name)
    paths.root.mkdir(parents=True)
    # a Slurm job id that no Slurm knows: the state reads "?" or MISSING, nothing is signalled
    append_jsonl(paths.jobs, {"job_id": "424242", "attempt": 0, "executor": "slurm"})
    return paths


CASES = [
    ("grpo-status", [], "does not exist"),  # no logs/ at all
    ("grpo-status", ["nope"], "no run 'nope'"),
    ("grpo-status", ["--logs", "/etc/hostname"], "is not a directory"),
    ("grpo-monitor", ["--once"], "no runs under"),
    ("grpo-monitor", ["nope", "--once"], "no run 'nope'"),
    ("grpo-ckpt", ["list", "nope"], "no run 'nope'"),
    ("grpo-submit", ["--resume", "nope"], "no run 'nope'"),
    ("grpo-submit", ["--profile", "local", "--logs", "/etc/hostname"], "is not a directory"),
    ("grpo-submit", ["--profile", "local", "--from-step", "3"], "--from-step goes with --resume"),
]


@pytest.mark.parametrize(("prog", "args", "fragment"), CASES)
def test_no_logs_or_no_such_run(logs_dir: Path, prog: str, args: list, fragment: str) -> None:
    if args and args[0] == "nope":
        logs_dir.mkdir()  # runs directory there, run not
    _one_line_error(_run(prog, *args), prog, ExitCode.CONFIG_ERROR, fragment)


@pytest.mark.parametrize("content", ["[1, 2]", "null", "\xff\xfe garbage", "directory"])
def test_unreadable_progress_is_a_warning_not_a_crash(logs_dir: Path, content: str) -> None:
    paths = _run_dir(logs_dir, "r")
    if content == "directory":
        paths.progress.mkdir()
    else:
        paths.progress.write_bytes(content.encode("latin-1"))
    for args in (["r"], ["--json"], []):
        result = _run("grpo-status", *args)
        assert result.returncode == 0, result.stderr
        warnings = [line for line in result.stderr.splitlines() if "progress.json" in line]
        assert len(warnings) == 1 and "unreadable" in warnings[0], result.stderr
    assert "no progress" in _run("grpo-status").stdout


def test_run_deleted_under_the_monitor_is_skipped(logs_dir: Path) -> None:
    paths = _run_dir(logs_dir, "gone")
    backend = Backend(job_records=lambda ids: {}, queued_job_ids=set)
    shutil.rmtree(paths.root)  # between discovery and the pass
    assert monitor_pass([paths], MonitorPolicy(), backend=backend) == []
    assert not paths.root.exists(), "the monitor re-created a deleted run directory"


def test_checkpoints_deleted_under_a_reader(logs_dir: Path, monkeypatch) -> None:
    paths = _run_dir(logs_dir, "r")
    make_checkpoint(paths, 4)
    assert paths.latest_checkpoint() == 4
    # deleted after is_dir() said yes, before the listing: as if no checkpoint
    real_iterdir = Path.iterdir

    def racing_iterdir(self: Path):
        if self == paths.checkpoints:
            shutil.rmtree(self)
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", racing_iterdir)
    assert paths.latest_checkpoint() is None


def test_cancel_local_never_signals_init_or_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from grpo_hpc.monitor import loop as monitor

    sent: list[tuple] = []
    monkeypatch.setattr(monitor.os, "kill", lambda *a: sent.append(("kill", *a)))
    monkeypatch.setattr(monitor.os, "killpg", lambda *a: sent.append(("killpg", *a)))
    for pid in (0, 1, os.getpid()):  # e.g. a jobs.jsonl line with job_id "1"
        monitor.cancel_local(pid)
    assert sent == []


@pytest.mark.parametrize("profile", ["local", "slurm-local"])
def test_eval_of_a_path_that_is_no_model_says_what_is_missing(tmp_path: Path, profile: str):
    """A MODEL_OR_RUN with a slash is a path: a missing one is named as such (it used to be
    refused as an invalid run name), here or before a job; a folder that is neither a model
    nor a run says so."""
    missing = run_cli("grpo_hpc.cli.eval:main", "exported/none", "--profile", profile)
    assert "Traceback" not in missing.stderr
    _one_line_error(missing, "grpo-eval", ExitCode.CONFIG_ERROR, "'exported/none' does not exist")
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = run_cli("grpo_hpc.cli.eval:main", str(empty), "--profile", profile)
    _one_line_error(nothing, "grpo-eval", ExitCode.CONFIG_ERROR, "is neither a model directory")
