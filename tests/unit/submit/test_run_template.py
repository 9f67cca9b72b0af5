"""A run keeps its profile's setup template beside its stored profile: the monitor's
resubmission renders the same setup lines after the user's profile folder is gone (the GPU
fault campaign's step-0 stall trials stopped with "template not found" before this)."""

from __future__ import annotations

import shutil
from pathlib import Path

from grpo_hpc.config.profiles import load_profile, load_run_profile, render_setup
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.submit.job import create_run
from grpo_hpc.submit.plan import template_context


def test_resubmission_renders_the_setup_of_a_profile_folder_since_deleted(tmp_path: Path) -> None:
    mine = tmp_path / "my-profiles"
    mine.mkdir()
    (mine / "node.yaml").write_text(
        "description: my node\nexecutor: local\ntemplate: my-setup.sh.j2\n"
        "env:\n  NCCL_NVLS_ENABLE: '0'\n"
    )
    (mine / "my-setup.sh.j2").write_text("echo setting up {{ run_name }}\nexport A=1\n")
    paths = RunPaths.for_run("run", tmp_path / "logs")
    plan = create_run(paths, load_profile(str(mine / "node.yaml")), "tiny", [])
    first = render_setup(plan.profile, template_context(paths))
    assert first == ["echo setting up run", "export A=1"]

    shutil.rmtree(mine)  # the user's folder is gone (or edited) before a resubmission
    again = render_setup(load_run_profile(paths), template_context(paths))
    assert again == first
    assert (paths.root / "my-setup.sh.j2").read_text().startswith("echo setting up")


def test_a_built_in_template_is_kept_too(tmp_path: Path) -> None:
    paths = RunPaths.for_run("run", tmp_path / "logs")
    plan = create_run(paths, load_profile("local"), "tiny", [])
    assert (paths.root / plan.profile.template).is_file()
    ctx = template_context(paths)
    assert render_setup(load_run_profile(paths), ctx) == render_setup(plan.profile, ctx)
