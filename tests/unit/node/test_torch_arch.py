"""The installed torch against a profile's GPUs (grpo_hpc.node.torch_build): the rule on
recorded arch lists, and grpo-submit refusing a torch without kernels for supercloud's V100s
(torch 2.11+cu128 has none for compute capability 7.0)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from grpo_hpc.core.errors import ExitCode
from grpo_hpc.node import torch_build
from grpo_hpc.node.torch_build import TorchBuild, arch_problem, note, runs_on
from tests.conftest import run_cli

# Recorded arch lists (torch.cuda.get_arch_list()). The cu12x/cu13x lists are written from
# PyTorch's published CUDA support matrix (RELEASE.md; RFC pytorch/pytorch#172352, PR
# #175253 for 2.11, #182849 for 2.12, #197555 for 2.12-2.14), not read from a wheel: no CUDA
# wheel is installed here, so the exact strings (e.g. whether a build lists sm_100 or
# sm_100a) are unverified; the architectures are the matrix's.
# cu128, 2.11 on: "Turing(7.5), Ampere(8.0, 8.6), Hopper(9.0), Blackwell(10.0, 12.0)".
CU128_2_11 = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")
# cu126, 2.11-2.14: "Maxwell(5.0), Pascal(6.0), Volta(7.0), Turing(7.5), Ampere(8.0, 8.6),
# Hopper(9.0)".
CU126 = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")
# cu130, 2.11 on: "... Blackwell(10.0, 12.0+PTX)", "+PTX available on linux builds only".
CU130 = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120")
# The CPU torch installed here (constraints-cpu.txt): torch 2.13.0+cpu,
# torch.version.cuda None, torch.cuda.get_arch_list() [] (read on this machine).
CPU_2_13 = TorchBuild("2.13.0+cpu", None, ())
V100_INSTALL = 'pip install "torch<2.15" --index-url https://download.pytorch.org/whl/cu126'
V100, T4, A100, H100 = (7, 0), (7, 5), (8, 0), (9, 0)


@pytest.mark.parametrize(
    ("arch_list", "capability", "runs"),
    [
        (CU128_2_11, V100, False),  # no sm_70 kernels: a V100 cannot run it
        (CU128_2_11, A100, True),
        (CU128_2_11, H100, True),
        (CU126, V100, True),
        (CU126, H100, True),
        (CU130, V100, False),  # PTX for 12.0 cannot be compiled down for an older GPU
        (("compute_70",), V100, True),  # PTX is JIT-compiled for its own or a newer GPU
        (("compute_70",), H100, True),
        (("compute_75",), V100, False),
        (("sm_75",), V100, False),  # cubins run within a major, only on a newer minor
        (("sm_75",), T4, True),
        (("sm_70",), T4, True),
        (("sm_80",), H100, False),  # never across a major
        (("sm_90a",), H100, True),  # arch-specific: that GPU exactly
        (("sm_90a",), (10, 0), False),
        ((), V100, False),
    ],
)
def test_runs_on(arch_list: tuple[str, ...], capability: tuple[int, int], runs: bool) -> None:
    assert runs_on(arch_list, capability) is runs


def test_refusal_names_the_build_and_the_fix() -> None:
    line = arch_problem(TorchBuild("2.11.0+cu128", "12.8", CU128_2_11), V100, "supercloud")
    assert line is not None and "\n" not in line
    assert "compute capability 7.0" in line and "2.11.0+cu128" in line
    assert V100_INSTALL in line
    assert arch_problem(TorchBuild("2.11.0+cu126", "12.6", CU126), V100, "supercloud") is None
    assert arch_problem(TorchBuild("2.14.0+cu130", "13.0", CU130), V100, "supercloud")
    assert arch_problem(TorchBuild("2.11.0+cu128", "12.8", CU128_2_11), H100, "h") is None


def test_the_fix_fits_the_gpu() -> None:
    """cu126 (pinned below 2.15, its last release line) only where nothing newer has
    kernels: Turing and newer take PyPI's build; before Maxwell no published build will do."""
    assert "whl/cu126" in torch_build.fix_for(V100)
    assert "whl/cu126" in torch_build.fix_for((6, 0))
    assert torch_build.fix_for(T4).endswith("pip install torch")
    assert torch_build.fix_for(H100).endswith("pip install torch")
    assert "from source" in torch_build.fix_for((3, 7))


def test_a_cpu_build_is_refused_for_a_gpu_profile() -> None:
    """The job runs the Python grpo-submit runs in: a CPU torch here is the GPU nodes'."""
    line = arch_problem(CPU_2_13, V100, "supercloud")
    assert line is not None and "\n" not in line
    assert "2.13.0+cpu is a CPU-only build" in line and "whl/cu126" in line
    assert arch_problem(CPU_2_13, H100, "h100x2").endswith("pip install torch")
    assert note(CPU_2_13) is None  # refused, not noted
    # an older CUDA torch lists nothing without a GPU: not checked, and said so
    assert arch_problem(TorchBuild("2.4.0+cu121", "12.1", ()), V100, "supercloud") is None
    assert note(TorchBuild("2.4.0+cu121", "12.1", ())) is not None
    assert note(TorchBuild("2.11.0+cu126", "12.6", CU126)) is None


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="no torch installed")
def test_the_installed_torch_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the stand-in (tests/conftest.py), the shell reads this machine's torch: on
    CI, a CPU build, which supercloud refuses."""
    monkeypatch.delenv(torch_build.ARCH_LIST_ENV)
    build = torch_build.installed_build()
    assert build is not None
    import torch

    assert build.version == torch.__version__ and build.cuda == torch.version.cuda
    if build.cuda is None:
        assert arch_problem(build, V100, "supercloud") is not None


def test_override_is_read_instead_of_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(torch_build.ARCH_LIST_ENV, "sm_70, sm_80")
    monkeypatch.delenv(torch_build.CUDA_ENV)
    build = torch_build.installed_build()
    assert build is not None and build.arch_list == ("sm_70", "sm_80") and build.cuda == "12.8"
    monkeypatch.setenv(torch_build.ARCH_LIST_ENV, "")
    monkeypatch.setenv(torch_build.CUDA_ENV, "")  # empty: a CPU build
    assert torch_build.installed_build() == TorchBuild(
        f"from ${torch_build.ARCH_LIST_ENV}", None, (), overridden=True
    )


FAKE_TORCH = """
from . import version
__version__ = version.__version__
class cuda:  # a torch before pytorch/pytorch#180356 on a GPU-less login node
    @staticmethod
    def get_arch_list():
        return []
class _C:
    @staticmethod
    def _cuda_getArchFlags():
        return "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120"
"""


def test_older_torch_on_a_login_node_is_read_underneath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch 2.11+cu128's get_arch_list() is [] without a GPU: the shell reads the flags
    beneath it, so a torch without V100 kernels is still refused on a GPU-less login node."""
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.11.0+cu128'\ncuda: Optional[str] = '12.8'\n"
    )
    (pkg / "__init__.py").write_text(FAKE_TORCH)
    monkeypatch.delenv(torch_build.ARCH_LIST_ENV, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    # the fake stands in for torch during this test only: setitem's undo restores a real
    # torch imported before, or removes the fake
    for name in {"torch", "torch.version", *(m for m in sys.modules if m.startswith("torch."))}:
        monkeypatch.setitem(sys.modules, name, None)
        del sys.modules[name]
    build = torch_build.installed_build()
    assert build == TorchBuild("2.11.0+cu128", "12.8", CU128_2_11)
    assert arch_problem(build, V100, "supercloud") is not None


def submit(logs: Path, arch_list: str, cuda: str = "12.8", profile: str = "supercloud"):
    """The real grpo-submit --dry-run, with the test-only stand-in for torch's arch list."""
    env = {
        torch_build.ARCH_LIST_ENV: arch_list,
        torch_build.CUDA_ENV: cuda,
        "GRPO_HPC_LOGS": str(logs),
    }
    args = ("--profile", profile, "--config", "tiny", "--dry-run", "--name", "d")
    return run_cli("grpo_hpc.cli.submit:main", *args, env=env)


def test_dry_run_refuses_a_torch_without_sm70(logs_dir: Path) -> None:
    result = submit(logs_dir, "sm_80 sm_90")
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stderr
    refused = [ln for ln in result.stdout.splitlines() if ln.startswith("# refused")]
    assert len(refused) == 1 and "compute capability 7.0" in refused[0], result.stdout
    assert "whl/cu126" in refused[0]
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("grpo-submit: error: profile 'supercloud'")
    assert not logs_dir.exists() or not any(logs_dir.iterdir()), "a run directory was left"


def test_dry_run_accepts_a_torch_with_sm70(logs_dir: Path) -> None:
    result = submit(logs_dir, "sm_70 sm_80")
    assert result.returncode == ExitCode.OK, result.stdout + result.stderr
    assert "# refused" not in result.stdout
    # the stand-in list passes, and says it was the stand-in, not the installed torch
    assert "torch: checked against $GRPO_HPC_TORCH_ARCH_LIST=sm_70 sm_80" in result.stdout


def test_dry_run_refuses_a_cpu_torch(logs_dir: Path) -> None:
    result = submit(logs_dir, "", cuda="")
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stderr
    refused = [ln for ln in result.stdout.splitlines() if ln.startswith("# refused")]
    assert len(refused) == 1 and "CPU-only build" in refused[0], result.stdout
    assert V100_INSTALL in refused[0]


def test_local_profile_is_not_checked(logs_dir: Path) -> None:
    """A profile that names no GPU capability runs on whatever torch is here."""
    result = submit(logs_dir, "", cuda="", profile="local")
    assert result.returncode == ExitCode.OK, result.stdout + result.stderr
    assert "# refused" not in result.stdout and "torch:" not in result.stdout
