"""Render a run's job from its profile and submit it through submitit.

Everything that can fail (config, profile, template, Slurm reachability) is checked
*before* the run directory is created, and a failed submission removes the
directory it created: bad input never leaves a half-made run behind.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass
from typing import Any

import submitit
import yaml

from grpo_hpc.config.load import build_config, load_resolved, normalize_overrides, to_yaml
from grpo_hpc.config.profiles import Profile, load_profile, profile_from_dict, render_setup
from grpo_hpc.config.schema import Config
from grpo_hpc.core import slurm as slurm_query
from grpo_hpc.core.errors import ConfigError, GrpoError
from grpo_hpc.core.fsutil import append_jsonl, atomic_write_text, read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.memory import plan as memory_plan
from grpo_hpc.submit.launch import NodeContext, NodeLauncher, torchrun_command


def apply_profile(
    cfg: Config, profile: Profile, run_name: str, explicit: frozenset[str] = frozenset()
) -> Config:
    """The resolved config: the profile decides how to run (pure), except for
    ``dist.strategy`` and ``dist.precision`` when ``explicit`` (the command line's override
    keys) names them: the profile's value there is the cluster's default, not a fact of its
    hardware like the processes per node."""
    cfg = dataclasses.replace(cfg, run_name=run_name)
    cfg.dist = dataclasses.replace(
        cfg.dist,
        strategy=cfg.dist.strategy if "dist.strategy" in explicit else profile.strategy,
        precision=cfg.dist.precision if "dist.precision" in explicit else profile.precision,
        nproc_per_node=profile.procs_per_node,
        compile=True if profile.compile else cfg.dist.compile,
    )
    if cfg.model.attn_implementation == "auto":
        cfg.model = dataclasses.replace(cfg.model, attn_implementation=profile.attn_implementation)
    return cfg


def resolve(
    config_source: str | None, overrides: list[str], profile: Profile, run_name: str
) -> tuple[Config, memory_plan.Check]:
    """The resolved config and its memory verdict: the profile decides how to run, and when
    the run does not fit the profile's GPUs as given, the cheapest memory means that leave
    the training math unchanged are applied (grpo_hpc.memory.estimate.MEANS)."""
    explicit = frozenset(o.partition("=")[0] for o in normalize_overrides(overrides or []))
    cfg = apply_profile(build_config(config_source, overrides), profile, run_name, explicit)
    chk = memory_plan.check(cfg, profile)
    if chk.plan is not None and chk.plan.changed:
        cfg = memory_plan.apply_settings(cfg, chk.plan.settings)
    return cfg, chk


def executor_parameters(profile: Profile, run_name: str, setup: list[str]) -> dict[str, Any]:
    """submitit AutoExecutor parameters for a profile (pure)."""
    params: dict[str, Any] = {
        "name": slurm_query.job_name(run_name),
        "timeout_min": profile.time_min,
        "nodes": profile.nodes,
        "tasks_per_node": 1,  # one task per node; it launches torchrun for that node
        "cpus_per_task": profile.cpus_per_task,
    }
    if profile.executor == "local":
        # submitit's LocalExecutor sets CUDA_VISIBLE_DEVICES from this: without it the job
        # sees no GPU at all.
        params["gpus_per_node"] = profile.gpus_per_node
        return params
    if profile.mem_gb is not None:
        params["mem_gb"] = profile.mem_gb
    gres = profile.gres_value
    if gres:
        params["slurm_gres"] = gres
    params["slurm_signal_delay_s"] = profile.signal_lead_s
    params["slurm_setup"] = setup
    extra = {"requeue": True, **profile.sbatch_extra}
    params["slurm_additional_parameters"] = extra
    for key in ("partition", "account", "qos"):
        value = getattr(profile, key)
        if value:
            params[f"slurm_{key}"] = value
    return params


def make_executor(profile: Profile, paths: RunPaths, setup: list[str]) -> submitit.Executor:
    cluster = "local" if profile.executor == "local" else "slurm"
    executor = submitit.AutoExecutor(folder=paths.submitit_dir / "%j", cluster=cluster)
    executor.update_parameters(**executor_parameters(profile, paths.name, setup))
    return executor


class _SlurmPreviewExecutor(submitit.SlurmExecutor):
    """submitit's Slurm executor minus its ``srun`` check, so that ``--dry-run`` renders the
    sbatch script on a machine with no Slurm installed (a laptop, CI). It never submits."""

    @classmethod
    def affinity(cls) -> int:
        return 1


def render_sbatch(profile: Profile, paths: RunPaths, setup: list[str]) -> str:
    """The exact sbatch script submitit would write for this run; needs no Slurm."""
    params = executor_parameters(profile, paths.name, setup)
    inner = _SlurmPreviewExecutor(folder=paths.submitit_dir / "%j")
    # AutoExecutor's translation for the slurm cluster: generic names are converted,
    # slurm_* keys pass through without their prefix.
    generic = submitit.AutoExecutor._valid_parameters()
    converted = inner._convert_parameters({k: v for k, v in params.items() if k in generic})
    converted |= {k[len("slurm_") :]: v for k, v in params.items() if k.startswith("slurm_")}
    inner.update_parameters(**converted)
    return inner._make_submission_file_text(inner._submitit_command_str, "dry-run")


def preview(profile: Profile, paths: RunPaths) -> str:
    """What --dry-run prints: sbatch script (Slurm profiles) and the torchrun command."""
    setup = render_setup(profile, _template_context(paths))
    parts = []
    if profile.executor == "slurm":
        sbatch = render_sbatch(profile, paths, setup)
        parts += ["# ---- sbatch script (written by submitit) ----", sbatch]
    else:
        parts += [f"# ---- local executor: no Slurm; runs on this machine in {paths.submitit_dir}"]
    ctx = NodeContext(nnodes=profile.nodes, master_addr="$FIRST_NODE", job_id="$SLURM_JOB_ID")
    cmd = torchrun_command(str(paths.root), profile.procs_per_node, ctx)
    parts += [f"# ---- per node ({profile.nodes} node(s)): ----", " ".join(cmd)]
    return "\n".join(parts) + "\n"


def _template_context(paths: RunPaths) -> dict[str, Any]:
    return {"run_name": paths.name, "run_dir": str(paths.root)}


@dataclass
class SubmitResult:
    job_id: str
    attempt: int
    job: submitit.Job
    memory_line: str = ""
    """The ``memory:`` verdict of a new run (empty for resubmissions)."""


def next_attempt(paths: RunPaths) -> int:
    return len(read_jsonl(paths.jobs))


def submit_run(paths: RunPaths, profile: Profile, reason: str) -> SubmitResult:
    """Submit one attempt of an existing run directory and record it in jobs.jsonl."""
    setup = render_setup(profile, _template_context(paths))
    if profile.executor == "slurm":
        slurm_query.check_available()
    cfg = load_resolved(paths.config)
    executor = make_executor(profile, paths, setup)
    launcher = NodeLauncher(str(paths.root), cfg.dist.nproc_per_node)
    try:
        job = executor.submit(launcher)
    except (submitit.core.utils.FailedSubmissionError, OSError) as e:
        first = str(e).strip().splitlines()
        raise GrpoError(f"submission failed: {first[-1] if first else e}") from None
    attempt = record_job(paths, str(job.job_id), profile, reason)
    return SubmitResult(str(job.job_id), attempt, job)


def record_job(paths: RunPaths, job_id: str, profile: Profile, reason: str) -> int:
    """Append a submitted job to jobs.jsonl; returns its attempt number."""
    attempt = next_attempt(paths)
    append_jsonl(
        paths.jobs,
        {
            "job_id": job_id,
            "attempt": attempt,
            "submitted_at": time.time(),
            "reason": reason,
            "profile": profile.name,
            "executor": profile.executor,
        },
    )
    return attempt


def adopt(paths: RunPaths, job_id: str, reason: str) -> None:
    """Record a job that was submitted for this run but never made it into jobs.jsonl
    (its submitter was killed between sbatch and the write)."""
    record_job(paths, job_id, load_run_profile(paths), reason)


def create_run(
    paths: RunPaths,
    profile: Profile,
    config_source: str | None,
    overrides: list[str],
    force: bool = False,
) -> tuple[Config, memory_plan.Check]:
    """Validate everything, then write the run directory (config + profile), atomically.

    Raises before touching the disk when anything is wrong, including a run whose estimated
    peak GPU memory exceeds the profile's ``gpu_mem_gb`` (unless ``force``).
    """
    if paths.root.exists():
        raise ConfigError(
            f"run {paths.name!r} already exists in {paths.root.parent}: choose another --name, "
            f"or continue it with --resume {paths.name}"
        )
    cfg, chk = resolve(config_source, overrides, profile, paths.name)
    if chk.refusal and not force:
        raise ConfigError(chk.refusal)
    render_setup(profile, _template_context(paths))  # template errors before any write
    if profile.executor == "slurm":
        slurm_query.check_available()
    tmp = paths.root.with_name(f".{paths.name}.creating")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    atomic_write_text(tmp / paths.config.name, to_yaml(cfg))
    atomic_write_text(tmp / paths.profile.name, yaml.safe_dump(_profile_dict(profile)))
    tmp.rename(paths.root)
    return cfg, chk


def _profile_dict(profile: Profile) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(profile).items() if k != "path"}


def load_run_profile(paths: RunPaths) -> Profile:
    """The profile stored in the run directory (what every resubmission uses)."""
    from grpo_hpc.config.load import load_yaml_mapping

    data = load_yaml_mapping(paths.profile, what="run profile")
    return profile_from_dict(data, name=str(data.pop("name", "run")), path=None)


def resubmit(paths: RunPaths, reason: str) -> SubmitResult:
    """Submit the next attempt of an existing run with its stored profile."""
    if not paths.config.is_file():
        raise ConfigError(f"{paths.root} is not a run directory (no config.yaml)")
    return submit_run(paths, load_run_profile(paths), reason)


def new_run(
    paths: RunPaths,
    profile_name: str,
    config_source: str | None,
    overrides: list[str],
    force: bool = False,
) -> SubmitResult:
    """Create the run directory and submit its first attempt; undo the directory on failure."""
    profile = load_profile(profile_name)
    _, chk = create_run(paths, profile, config_source, overrides, force)
    try:
        result = submit_run(paths, profile, reason="initial submission")
        return dataclasses.replace(result, memory_line=chk.line)
    except BaseException:
        shutil.rmtree(paths.root, ignore_errors=True)
        raise


def rewind(paths: RunPaths, step: int) -> list[int]:
    """Make checkpoint ``step`` the newest complete one: newer checkpoints are renamed to
    ``checkpoints/.set-aside-<time>-step-N`` (kept, but invisible to resume)."""
    complete = paths.checkpoint_steps()
    if step not in complete:
        listed = ", ".join(map(str, complete)) or "none"
        raise ConfigError(
            f"run {paths.name!r} has no complete checkpoint at step {step} (complete: {listed})"
        )
    newer = [s for s in paths.checkpoint_steps(complete_only=False) if s > step]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for s in newer:
        paths.checkpoint(s).rename(paths.checkpoints / f".set-aside-{stamp}-step-{s}")
    return newer
