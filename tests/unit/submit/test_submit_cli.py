"""grpo-submit as a user runs it: every bad input gives one line, exit 2, and no run dir."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from grpo_hpc.core.errors import ExitCode
from tests.conftest import run_cli


def submit(*args: str, env: dict | None = None):
    return run_cli("grpo_hpc.cli.submit:main", *args, env=env)


def _assert_one_line_error(result, logs: Path, fragment: str) -> None:
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("grpo-submit: error:"), result.stderr
    assert fragment in lines[0]
    assert not logs.exists() or not any(logs.iterdir()), "a run directory was left behind"


def _fake_bin(tmp: Path, **scripts: str) -> str:
    d = tmp / "bin"
    d.mkdir()
    for name, body in scripts.items():
        f = d / name
        f.write_text(f"#!/bin/sh\n{body}\n")  # /bin/sh by absolute path
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    return str(d)  # nothing else: the real Slurm tools must not be found


CASES = {
    "unknown profile": (["--profile", "nope", "--config", "tiny"], "known profiles are"),
    "unknown key": (
        ["--profile", "local", "--config", "tiny", "training.max_stepz=3"],
        "did you mean 'training.max_steps'",
    ),
    "wrong type": (
        ["--profile", "local", "--config", "tiny", "--training.max_steps=many"],
        "wrong value type",
    ),
    "unknown config": (["--profile", "local", "--config", "tinyy"], "built-in configs are"),
    "bad run name": (
        ["--profile", "local", "--config", "tiny", "--name", "a;rm -rf ~"],
        "invalid run name",
    ),
    "no profile": (["--config", "tiny"], "--profile is required"),
    "one completion per prompt": (
        ["--profile", "local", "--config", "tiny", "rollout.num_generations=0", "--dry-run"],
        "rollout.num_generations=0 must be at least 2",
    ),
    "negative validation split": (
        ["--profile", "local", "--config", "tiny", "data.num_val=-1", "--dry-run"],
        "data.num_val=-1 must be >= 0",
    ),
    "a metric math problems do not report": (
        ["--profile", "local", "--config", "tiny", "training.select_metric=pass@1", "--dry-run"],
        "training.select_metric=pass@1: this run's math problems report accuracy",
    ),
    "stray argument": (["--profile", "local", "oops"], "unrecognized argument"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input(case: str, logs_dir: Path) -> None:
    args, fragment = CASES[case]
    _assert_one_line_error(submit(*args), logs_dir, fragment)


def test_unreadable_yaml(tmp_path: Path, logs_dir: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: {temperature: [\n")
    result = submit("--profile", "local", "--config", str(bad))
    _assert_one_line_error(result, logs_dir, "is not valid YAML")


def test_missing_template(tmp_path: Path, logs_dir: Path) -> None:
    prof = tmp_path / "mine.yaml"
    prof.write_text("executor: local\ntemplate: gone.sh.j2\n")
    result = submit("--profile", str(prof), "--config", "tiny")
    _assert_one_line_error(result, logs_dir, "template 'gone.sh.j2' not found")


def test_slurm_tools_missing(tmp_path: Path, logs_dir: Path) -> None:
    env = {"PATH": _fake_bin(tmp_path)}  # no sbatch on PATH
    result = submit("--profile", "slurm-local", "--config", "tiny", env=env)
    _assert_one_line_error(result, logs_dir, "sbatch not found")
    assert "use --profile local" in result.stderr  # what to do instead


def test_dry_run_without_slurm_installed(tmp_path: Path, logs_dir: Path) -> None:
    env = {"PATH": _fake_bin(tmp_path)}  # a laptop or CI box: no srun, no sbatch
    # supercloud's nodes are offline: the model and data must be in the hub cache (preflight)
    for repo in ("models--Qwen--Qwen2.5-0.5B-Instruct", "datasets--openai--gsm8k"):
        snap = tmp_path / "hub" / repo / "snapshots" / "0"
        snap.mkdir(parents=True)
        (snap / "config.json").write_text("{}")
    env["HF_HUB_CACHE"] = str(tmp_path / "hub")
    args = ("--profile", "supercloud", "--config", "gsm8k", "--dry-run", "--name", "d")
    result = submit(*args, env=env)
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --gres=gpu:volta:2" in result.stdout and "\nsrun " in result.stdout
    assert "torch.distributed.run --nproc-per-node=2" in result.stdout
    assert not logs_dir.exists()


def test_srun_missing(tmp_path: Path, logs_dir: Path) -> None:
    env = {"PATH": _fake_bin(tmp_path, sbatch="exit 1")}  # sbatch but no srun
    result = submit("--profile", "slurm-local", "--config", "tiny", env=env)
    _assert_one_line_error(result, logs_dir, "srun not found")


def test_slurmctld_down(tmp_path: Path, logs_dir: Path) -> None:
    path = _fake_bin(
        tmp_path,
        sbatch="exit 1",
        srun="exit 1",
        sinfo='echo "sinfo: error: Unable to contact slurm controller" >&2; exit 1',
    )
    result = submit("--profile", "slurm-local", "--config", "tiny", env={"PATH": path})
    _assert_one_line_error(result, logs_dir, "Slurm is not reachable")


def test_existing_run_is_refused_and_untouched(logs_dir: Path) -> None:
    run = logs_dir / "taken"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("mine: true\n")
    result = submit("--profile", "local", "--config", "tiny", "--name", "taken")
    assert result.returncode == ExitCode.CONFIG_ERROR
    assert "already exists" in result.stderr and "--resume taken" in result.stderr
    assert (run / "config.yaml").read_text() == "mine: true\n"


def test_dry_run_submits_nothing(logs_dir: Path) -> None:
    result = submit("--profile", "supercloud", "--config", "tiny", "--dry-run", "--name", "d")
    assert result.returncode == 0
    assert "#SBATCH --gres=gpu:volta:2" in result.stdout
    assert "torch.distributed.run --nproc-per-node=2" in result.stdout
    assert not logs_dir.exists()


def test_help_has_examples() -> None:
    result = submit("--help")
    assert result.returncode == 0
    assert "examples:" in result.stdout and "exit codes:" in result.stdout


def test_list_profiles_puts_every_description_in_one_column() -> None:
    result = submit("--list-profiles")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    names = [line.split()[0] for line in lines]
    assert {"local", "supercloud", "h100x2", "slurm-local-2node"} <= set(names)
    starts = {
        len(line) - len(line[len(name) :].lstrip()) for line, name in zip(lines, names, strict=True)
    }
    assert len(starts) == 1, result.stdout  # the longest name no longer pushes its line out


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        ((), "ddp, bf16"),  # the h100x2 profile's
        (("dist.strategy=fsdp",), "fsdp, bf16"),
        (("--dist.precision=fp32",), "ddp, fp32"),
        (("dist.strategy=ddp", "dist.precision=fp32"), "ddp, fp32"),
    ],
)
def test_command_line_strategy_and_precision_win_over_the_profile(
    logs_dir: Path, overrides: tuple[str, ...], said: str
) -> None:
    """The profile fills dist.*; an explicit override of the strategy or the precision was
    dropped without a word before, and now decides (the memory line judges the run as given)."""
    args = ("--profile", "h100x2", "--config", "tiny", "--dry-run", "--name", "d", *overrides)
    result = submit(*args)
    assert result.returncode == 0, result.stderr
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("memory:"))
    assert f"fits; {said}" in line, line
    assert "torch.distributed.run --nproc-per-node=2" in result.stdout  # always the profile's
    assert not logs_dir.exists()


@pytest.mark.parametrize(
    ("profile", "compiled"),
    [("h100x2", True), ("supercloud", False)],  # gpu_capability 9.0 and 7.0
)
def test_memory_line_counts_compiled_layers_by_the_profiles_gpus(
    logs_dir: Path, profile: str, compiled: bool
) -> None:
    """fp16 with DDP: the trainer compiles its layers (auto) on an H100, not on a V100; the
    estimate follows the profile's gpu_capability, not a guess from the precision."""
    args = ("--profile", profile, "--config", "tiny", "--dry-run", "--name", "d")
    result = submit(*args, "dist.strategy=ddp", "dist.precision=fp16")
    assert result.returncode == 0, result.stderr
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("memory:"))
    assert ("compiled layers" in line) is compiled, line
    assert not logs_dir.exists()
