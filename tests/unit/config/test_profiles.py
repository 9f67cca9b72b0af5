"""Cluster profiles, their Jinja2 setup templates, and the sbatch each one renders."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from grpo_hpc.config.profiles import known_profiles, load_profile, render_setup
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.submit.plan import plan_submission, preview

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
GOLDEN_PROFILES = ("supercloud", "h100x2", "slurm-local", "slurm-local-2node", "local")
REGENERATE = "python -m tests.unit.config.test_profiles"
"""Rewrites tests/golden/<profile>.sbatch from the current code (run from the repository
root); review its diff before committing it. The tests only compare."""


def _normalized_preview(name: str) -> str:
    paths = RunPaths(Path("/RUNS/golden-run"))
    text = preview(plan_submission(paths, load_profile(name), "tiny", []))
    return text.replace(sys.executable, "<PYTHON>")


@pytest.mark.parametrize("name", GOLDEN_PROFILES)
def test_rendered_job_matches_golden(name: str) -> None:
    """The job each profile renders, against its golden (``REGENERATE`` rewrites them where a
    change is intended; this test never writes)."""
    golden = GOLDEN / f"{name}.sbatch"
    assert _normalized_preview(name) == golden.read_text(), (
        f"{golden} differs; if the change is intended: {REGENERATE}, and review the diff"
    )


@pytest.mark.parametrize("name", ["supercloud", "h100x2", "slurm-local"])
def test_golden_renders_without_slurm_installed(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun: submitit's own executor refuses
    assert shutil.which("srun") is None
    assert _normalized_preview(name) == (GOLDEN / f"{name}.sbatch").read_text()


def test_supercloud_is_v100_fp16_ddp() -> None:
    p = load_profile("supercloud")
    assert (p.precision, p.strategy, p.attn_implementation) == ("fp16", "ddp", "sdpa")
    text = _normalized_preview("supercloud")
    assert "#SBATCH --gres=gpu:volta:2" in text
    assert re.search(r"--nproc-per-node=2 .*-m grpo_hpc.train /RUNS/golden-run", text)


def test_h100_is_bf16_and_ddp_first() -> None:
    """DDP where the model fits replicated; the memory plan applies FSDP2 where it does not
    (tests/unit/memory/test_memory.py::test_dry_run_prints_the_memory_line)."""
    p = load_profile("h100x2")
    assert (p.precision, p.strategy, p.gres_value) == ("bf16", "ddp", "gpu:2")
    assert "export NCCL_DEBUG='WARN'" in _normalized_preview("h100x2")


def test_unknown_profile_lists_known() -> None:
    with pytest.raises(ConfigError, match="known profiles are .*supercloud"):
        load_profile("supercloudd")
    assert {"local", "slurm-local", "supercloud", "h100x2"} <= set(known_profiles())


def test_user_profile_dir_and_missing_template(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "mycluster.yaml").write_text("partition: gpu\ntemplate: nope.sh.j2\n")
    monkeypatch.setenv("GRPO_HPC_PROFILES", str(tmp_path))
    prof = load_profile("mycluster")
    assert prof.partition == "gpu"
    with pytest.raises(ConfigError, match="template 'nope.sh.j2' not found"):
        render_setup(prof, {"run_name": "r", "run_dir": "/x"})


def test_profile_bad_key_and_value(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("partitoin: gpu\n")
    with pytest.raises(ConfigError, match="unknown key"):
        load_profile(str(f))
    f.write_text("precision: fp8\n")
    with pytest.raises(ConfigError, match="precision must be"):
        load_profile(str(f))
    f.write_text("gpu_capability: 0\n")
    with pytest.raises(ConfigError, match="gpu_capability must be > 0"):
        load_profile(str(f))
    assert load_profile("supercloud").gpu_capability == 7.0
    assert load_profile("supercloud").capability == (7, 0)
    assert load_profile("h100x2").capability == (9, 0)
    assert load_profile("local").capability is None  # no GPUs


@pytest.mark.parametrize("key", ["gpu_capability", "gpu_mem_gb", "mem_gb"])
def test_a_quoted_number_is_refused_in_one_line(tmp_path: Path, key: str) -> None:
    f = tmp_path / "quoted.yaml"
    f.write_text(f'gpus_per_node: 1\n{key}: "7.0"\n')
    with pytest.raises(ConfigError) as e:
        load_profile(str(f))
    assert str(e.value).startswith(
        f"profile 'quoted': {key} must be a number, written unquoted ({key}: "
    ), e.value
    assert "not '7.0'" in str(e.value) and "\n" not in str(e.value)
    f.write_text(f"gpus_per_node: 1\n{key}: 7.0\n")
    assert getattr(load_profile(str(f)), key) == 7.0


def test_setup_values_are_quoted(tmp_path: Path) -> None:
    f = tmp_path / "q.yaml"
    f.write_text('env:\n  EVIL: "x\'; rm -rf / #"\n')
    lines = render_setup(load_profile(str(f)), {"run_name": "r", "run_dir": "/a b"})
    assert "export EVIL='x'\\''; rm -rf / #'" in lines


def test_local_executor_is_given_the_profiles_gpus() -> None:
    """submitit's LocalExecutor sets CUDA_VISIBLE_DEVICES from gpus_per_node: a local
    profile that did not pass it ran its bf16 job on the CPU (seen on an H100)."""
    import dataclasses

    from grpo_hpc.submit.plan import executor_parameters

    local = load_profile("local")
    assert executor_parameters(local, "r", [])["gpus_per_node"] == 0
    one = dataclasses.replace(local, gpus_per_node=1)
    assert executor_parameters(one, "r", [])["gpus_per_node"] == 1


def regenerate() -> None:
    """Write every profile's golden from the current code (:data:`REGENERATE`)."""
    for name in GOLDEN_PROFILES:
        (GOLDEN / f"{name}.sbatch").write_text(_normalized_preview(name))
        print(f"wrote {GOLDEN / f'{name}.sbatch'}")


if __name__ == "__main__":
    regenerate()
