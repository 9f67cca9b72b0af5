"""Where the torch check runs and what it says: a ROCm build named as one, a stand-in arch
list never silent, GPUs asked through ``gres`` checked, ``--resume`` and the monitor's
resubmissions checked again, and ``torch_check: job`` (the job's torch is not the login
node's) checked by the job itself, whose refusal the monitor stops on."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from grpo_hpc.config.profiles import profile_from_dict
from grpo_hpc.core.errors import ConfigError, ExitCode
from grpo_hpc.core.fsutil import read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState, read_progress
from grpo_hpc.monitor.attempts import start_next_attempt
from grpo_hpc.node import torch_build
from grpo_hpc.node.job_torch import check_job_torch, job_problem
from grpo_hpc.node.torch_build import TorchBuild, arch_problem
from grpo_hpc.submit.job import create_run
from tests.conftest import run_cli

V100 = (7, 0)
CU128_2_11 = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")
"""torch 2.11+cu128's architectures (tests/unit/node/test_torch_arch.py): no Volta."""
V100_LOCAL = {
    "executor": "local",
    "gpus_per_node": 1,
    "gpu_capability": 7.0,
    "precision": "fp32",
    "time_min": 60,
    "signal_lead_s": 30,
}
"""A one-V100 profile (its runs are made here; none is started: each is refused first)."""


def test_a_rocm_build_is_named_a_rocm_build_not_cpu_only() -> None:
    """A ROCm torch's ``torch.version.cuda`` is None like a CPU build's; its
    ``torch.version.hip`` says what it is."""
    rocm = TorchBuild("2.9.0+rocm6.4", None, (), hip="6.4.43482")
    line = arch_problem(rocm, V100, "supercloud")
    assert line is not None and "a ROCm (HIP 6.4.43482) build" in line
    assert "CPU-only" not in line
    assert "CPU-only" in (arch_problem(TorchBuild("2.13.0+cpu", None, ()), V100, "s") or "")


def test_a_rocm_build_is_read_from_torch_version_py(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch/version.py of a ROCm wheel: ``cuda = None``, ``hip = '6.4...'`` (no import)."""
    import sys

    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "version.py").write_text(
        "__version__ = '2.9.0+rocm6.4'\ncuda = None\nhip = '6.4.43482'\n"
    )
    (pkg / "__init__.py").write_text("raise ImportError('not to be imported')\n")
    monkeypatch.delenv(torch_build.ARCH_LIST_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in {"torch", *(m for m in sys.modules if m.startswith("torch."))}:
        monkeypatch.setitem(sys.modules, name, None)
        del sys.modules[name]
    build = torch_build.installed_build()
    assert build == TorchBuild("2.9.0+rocm6.4", None, (), hip="6.4.43482")


def _profile_file(tmp_path: Path, **fields: object) -> Path:
    base = {"executor": "slurm", "precision": "fp32", "time_min": 60, "signal_lead_s": 30}
    path = tmp_path / "v100.yaml"
    path.write_text(yaml.safe_dump({**base, **fields}))
    return path


def _dry_run(logs: Path, profile: Path, arch_list: str) -> object:
    env = {torch_build.ARCH_LIST_ENV: arch_list, torch_build.CUDA_ENV: "12.8"}
    args = ("--profile", str(profile), "--config", "tiny", "--dry-run", "--name", "d")
    return run_cli("grpo_hpc.cli.submit:main", *args, "--logs", str(logs), env=env)


def test_a_stand_in_arch_list_is_said_on_the_line_the_check_prints(
    tmp_path: Path,
) -> None:
    """A leftover ``$GRPO_HPC_TORCH_ARCH_LIST`` replaces the installed torch in the check:
    a check it passes says so, it never passes silently."""
    profile = _profile_file(tmp_path, gpus_per_node=1, gpu_capability=7.0)
    result = _dry_run(tmp_path / "logs", profile, "sm_70 sm_80")
    assert result.returncode == 0, result.stdout + result.stderr
    said = [ln for ln in result.stdout.splitlines() if ln.startswith("torch:")]
    assert said == [
        "torch: checked against $GRPO_HPC_TORCH_ARCH_LIST=sm_70 sm_80 (CUDA 12.8), not the "
        "installed torch: unset it to check that one"
    ]


def test_gpus_asked_through_gres_only_are_checked(tmp_path: Path) -> None:
    """``gres: gpu:volta:2`` and no ``gpus_per_node``: the job asks for GPUs all the same,
    so the torch is checked against the profile's capability."""
    assert profile_from_dict({"gres": "gpu:volta:2"}, "p").gpus_requested == 2
    assert profile_from_dict({"gres": "gpu"}, "p").gpus_requested == 1
    assert profile_from_dict({"gres": "nvme:1"}, "p").gpus_requested == 0
    profile = _profile_file(tmp_path, gres="gpu:volta:2", gpu_capability=7.0)
    result = _dry_run(tmp_path / "logs", profile, " ".join(CU128_2_11))
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout + result.stderr
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and "compute capability 7.0" in errors[0]


def test_torch_check_job_leaves_the_login_nodes_torch_alone_and_says_so(tmp_path: Path) -> None:
    """A profile whose modules load another torch in the job says ``torch_check: job``:
    the login node's torch (here one without Volta) is not refused."""
    profile = _profile_file(tmp_path, gpus_per_node=1, gpu_capability=7.0, torch_check="job")
    result = _dry_run(tmp_path / "logs", profile, " ".join(CU128_2_11))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "torch: not checked here (profile 'v100' has torch_check: job)" in result.stdout
    with pytest.raises(ConfigError, match="torch_check must be submit or job"):
        profile_from_dict({"torch_check": "nowhere"}, "p")


def _v100_run(tmp_path: Path, **fields: object) -> RunPaths:
    paths = RunPaths(tmp_path / "runs" / "r")
    create_run(paths, profile_from_dict({**V100_LOCAL, **fields}, "v100"), "tiny", [])
    return paths


def test_the_job_checks_its_own_torch_and_the_monitor_stops_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``torch_check: job``: the job's torch without kernels for its GPUs ends the attempt
    before torchrun, exit code 2 in progress.json with this job's id: the monitor's
    configuration error, never resubmitted."""
    from grpo_hpc.core.runs import JobView
    from grpo_hpc.monitor.decision import ActionKind, FailureClass, RunHistory, decide

    profile = profile_from_dict({**V100_LOCAL, "torch_check": "job"}, "v100")
    assert job_problem(profile, TorchBuild("2.11.0+cu126", "12.6", ("sm_70",))) is None
    cu128 = TorchBuild("2.11.0+cu128", "12.8", CU128_2_11)
    assert "checked in the job" in (job_problem(profile, cu128) or "")
    assert job_problem(profile_from_dict(V100_LOCAL, "v100"), cu128) is None  # grpo-submit's

    paths = _v100_run(tmp_path, torch_check="job")
    monkeypatch.setenv(torch_build.ARCH_LIST_ENV, " ".join(CU128_2_11))
    with pytest.raises(ConfigError, match="compute capability 7.0") as e:
        check_job_torch(paths, "4242")
    assert "\n" not in str(e.value)
    rec = read_progress(paths.progress)
    assert rec is not None and rec.state is TrainState.FAILED and rec.job_id == "4242"
    assert rec.exit_code == ExitCode.CONFIG_ERROR
    job = JobView(job_id="4242", state="FAILED")
    action = decide(rec, job, RunHistory(), now=rec.heartbeat + 1)
    assert action.kind is ActionKind.STOP and action.failure_class is FailureClass.CONFIG_ERROR


def test_a_resubmission_checks_the_torch_again_and_records_the_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The torch under a run may change between attempts: the monitor's resubmission (and
    ``--resume``, through the same start_next_attempt) refuses in one line, recorded as
    the intent's error, which the monitor stops on (a configuration error)."""
    paths = _v100_run(tmp_path, executor="slurm")  # nothing could start here even if let through
    monkeypatch.setenv(torch_build.ARCH_LIST_ENV, " ".join(CU128_2_11))
    with pytest.raises(ConfigError, match="compute capability 7.0") as e:
        start_next_attempt(paths, "time limit")
    assert len(str(e.value).splitlines()) == 1
    errors = [ev for ev in read_jsonl(paths.events) if ev.get("phase") == "error"]
    assert len(errors) == 1 and errors[0]["error"] == str(e.value)
    assert not read_jsonl(paths.jobs)  # nothing submitted
