"""A local profile's ``env:`` reaches the trainer. A Slurm job gets it from its sbatch setup
lines; submitit's LocalExecutor runs none, so the launcher carries it
(bench/supercloud-emulated.yaml sets GRPO_HPC_EMULATE_GPU there), and ``--dry-run`` says
it."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_hpc.config.load import build_config
from grpo_hpc.config.profiles import profile_from_dict
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import ProgressRecord, TrainState, write_progress
from grpo_hpc.node import launch
from grpo_hpc.node.launch import NodeLauncher
from grpo_hpc.submit import job, plan

FAKE_TRAINER = """
import os, sys
from grpo_hpc.core.progress import ProgressRecord, TrainState, write_progress
open(sys.argv[2], "w").write(os.environ.get("GRPO_HPC_EMULATE_GPU", "unset"))
write_progress(sys.argv[1], ProgressRecord(run="r", state=TrainState.FINISHED, exit_code=0))
"""
ENV = {"GRPO_HPC_EMULATE_GPU": "7.0:32"}


def test_the_launcher_gives_its_env_to_the_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = RunPaths(tmp_path / "r")
    paths.root.mkdir()
    write_progress(paths.progress, ProgressRecord(run="r", state=TrainState.INTERRUPTED))
    seen = tmp_path / "seen"
    cmd = [sys.executable, "-c", FAKE_TRAINER, str(paths.progress), str(seen)]
    monkeypatch.setattr(launch, "torchrun_command", lambda *a, **k: cmd)
    monkeypatch.delenv("GRPO_HPC_EMULATE_GPU", raising=False)
    assert NodeLauncher(str(paths.root), 1, dict(ENV))() == 0
    assert seen.read_text() == "7.0:32"


@pytest.mark.parametrize(("executor", "carried"), [("local", ENV), ("slurm", {})])
def test_only_a_local_job_carries_the_profiles_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, executor: str, carried: dict
) -> None:
    launchers: list[NodeLauncher] = []

    class Executor:
        def submit(self, launcher: NodeLauncher) -> SimpleNamespace:
            launchers.append(launcher)
            return SimpleNamespace(job_id="1")

    monkeypatch.setattr(job, "make_executor", lambda *a: Executor())
    profile = profile_from_dict({"executor": executor, "env": dict(ENV)}, name="p")
    paths = RunPaths(tmp_path / "r")
    paths.root.mkdir()
    job.submit_attempt(paths, profile, build_config("tiny", []), {}, "test")
    assert launchers[0].env == carried


def test_the_dry_run_of_a_local_profile_says_its_env(tmp_path: Path) -> None:
    profile = profile_from_dict({"executor": "local", "env": dict(ENV)}, name="p")
    cfg = build_config("tiny", [])
    text = plan.preview(SimpleNamespace(profile=profile, paths=RunPaths(tmp_path), config=cfg))
    assert "# environment (the profile's env): GRPO_HPC_EMULATE_GPU=7.0:32" in text
