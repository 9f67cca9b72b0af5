"""The fault campaign's trial set-up without a cluster (bench/faults/trial.py, run.py): the
profile each placement's runs go to, what every run of a placement adds to its config, the
reference run's placement, and the code the jobs import."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.faults.plan import (
    PLACEMENT_OVERRIDES,
    SINGLE_NODE,
    SPLIT_NODE,
    TWO_NODE,
    plan_campaign,
)
from bench.faults.run import reference_plans
from bench.faults.trial import PROFILES, REPO, cli_env, profile_arg
from grpo_hpc.cli.submit import main as submit
from grpo_hpc.config.profiles import load_profile


def test_the_split_profile_is_the_campaigns_own_and_runs_two_processes() -> None:
    assert profile_arg(SPLIT_NODE) == str(PROFILES / "slurm-local-split.yaml")
    assert profile_arg(SINGLE_NODE) == SINGLE_NODE and profile_arg(TWO_NODE) == TWO_NODE
    prof = load_profile(profile_arg(SPLIT_NODE))
    assert (prof.name, prof.nodes, prof.nproc_per_node) == (SPLIT_NODE, 1, 2)
    assert prof.partition == load_profile(SINGLE_NODE).partition  # the debug node


def test_a_split_run_on_it_is_accepted(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """grpo-submit --dry-run with the split placement's overrides: no refusal (exit 2), and
    the roles it prints are a trainer and a generator process."""
    args = ["--profile", profile_arg(SPLIT_NODE), "--config", "tiny", "--name", "split"]
    args += ["--logs", str(tmp_path), "--dry-run", *PLACEMENT_OVERRIDES["split"]]
    assert submit(args) == 0
    out = capsys.readouterr().out
    assert "placement: split: trainer rank 0, generator rank 1" in out


def test_references_are_made_in_the_campaigns_placement() -> None:
    refs = reference_plans(plan_campaign(1, 10, "thread"), "thread")
    assert [(r.kind, r.profile, r.placement) for r in refs] == [
        ("reference", SINGLE_NODE, "thread"),
        ("reference", TWO_NODE, "thread"),
    ]
    split = reference_plans(plan_campaign(1, 13, "split"), "split")
    assert [(r.profile, r.placement) for r in split] == [(TWO_NODE, "split"), (SPLIT_NODE, "split")]
    assert reference_plans(plan_campaign(1, 3))[0].placement == "sync"


def test_jobs_import_this_checkouts_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """sbatch exports the CLIs' environment to the jobs: this checkout comes first on
    PYTHONPATH, before an installed grpo_hpc and before what PYTHONPATH held."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/elsewhere", str(REPO)]))
    assert cli_env()["PYTHONPATH"].split(os.pathsep) == [str(REPO), "/elsewhere"]
    monkeypatch.delenv("PYTHONPATH")
    assert cli_env()["PYTHONPATH"] == str(REPO)
