"""The job's own torch check, for a profile whose job loads another torch than the login
node's (``torch_check: job``: its ``modules:`` or setup lines put a cluster torch on the
path). grpo-submit cannot see that torch; the job can, before torchrun starts: the same
rule (grpo_hpc.node.torch_build.arch_problem) on the torch it imports. A torch without
kernels for the profile's GPUs ends the attempt with one line and exit code 2
(CONFIG_ERROR) in progress.json, which the monitor stops on instead of resubmitting into
the same failure (grpo_hpc.monitor.decision)."""

from __future__ import annotations

from grpo_hpc.config.profiles import Profile, load_run_profile
from grpo_hpc.core.errors import ConfigError, ExitCode
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import ProgressRecord, TrainState, read_progress, write_progress
from grpo_hpc.node import torch_build


def job_problem(profile: Profile, build: torch_build.TorchBuild | None) -> str | None:
    """The one line that ends the job, or None (pure): only for ``torch_check: job`` with
    a capability named; the job's torch is checked against it as grpo-submit checks its
    own, the line saying it was the job's."""
    capability = profile.capability
    if profile.torch_check != "job" or capability is None or build is None:
        return None
    problem = torch_build.arch_problem(build, capability, profile.name)
    return None if problem is None else f"{problem} (checked in the job: torch_check: job)"


def check_job_torch(paths: RunPaths, job_id: str) -> None:
    """Run in the job before torchrun: on a problem, record it in progress.json as the
    trainer records a configuration error (FAILED, exit code 2, this job's id) and raise
    ConfigError."""
    if not paths.profile.is_file():
        return
    profile = load_run_profile(paths)
    if profile.torch_check != "job" or profile.capability is None:
        return  # the torch is not imported for nothing
    problem = job_problem(profile, torch_build.installed_build())
    if problem is None:
        return
    prev = read_progress(paths.progress)
    rec = ProgressRecord(
        run=paths.name,
        attempt=prev.attempt if prev is not None else 0,
        job_id=job_id,
        state=TrainState.FAILED,
        step=prev.step if prev is not None else 0,
        max_steps=prev.max_steps if prev is not None else 0,
        exit_code=int(ExitCode.CONFIG_ERROR),
        reason=problem,
    )
    write_progress(paths.progress, rec)
    raise ConfigError(problem)
