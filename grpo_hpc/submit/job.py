"""Carrying out a submission: the run directory, the job through submitit, jobs.jsonl.

What to submit is decided before, once, in :mod:`grpo_hpc.submit.plan`; here a plan is
refused when it has problems (before anything is written), and a failed submission removes
the directory it created: bad input never leaves a half-made run behind. Resubmissions
(the monitor, ``grpo-submit --resume``) submit the run's stored config and profile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import shutil
import time
from dataclasses import dataclass
from typing import Any

import submitit
import yaml

from grpo_hpc.config.load import load_resolved, to_yaml
from grpo_hpc.config.profiles import (
    Profile,
    load_run_profile,
    profile_to_dict,
    render_setup,
    template_file,
)
from grpo_hpc.config.schema import Config
from grpo_hpc.core import slurm as slurm_query
from grpo_hpc.core.errors import ConfigError, GrpoError
from grpo_hpc.core.fsutil import append_jsonl, atomic_write_text, read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.node.launch import NodeLauncher
from grpo_hpc.submit import preflight
from grpo_hpc.submit.plan import (
    SubmitPlan,
    executor_parameters,
    exists_problem,
    plan_submission,
    template_context,
)

SUBMISSION_ERRORS = (
    submitit.core.utils.FailedJobError,  # sbatch refused: its stderr (seen on the test cluster)
    submitit.core.utils.FailedSubmissionError,  # sbatch's output named no job id
    OSError,
)
"""What a refused submission raises through submitit: one line (``submission failed: <sbatch's
last line>``) for grpo-submit, a retry for grpo-monitor (tests/integration/
test_resume_intent_slurm.py has sbatch of the test cluster refuse a partition)."""


def make_executor(profile: Profile, paths: RunPaths, params: dict[str, Any]) -> submitit.Executor:
    cluster = "local" if profile.executor == "local" else "slurm"
    executor = submitit.AutoExecutor(folder=paths.submitit_dir / "%j", cluster=cluster)
    executor.update_parameters(**params)
    return executor


@dataclass
class SubmitResult:
    job_id: str
    attempt: int
    job: submitit.Job
    memory_line: str = ""
    """The ``memory:`` verdict of a new run (empty for resubmissions)."""


def next_attempt(paths: RunPaths) -> int:
    return len(read_jsonl(paths.jobs))


def submit_attempt(
    paths: RunPaths,
    profile: Profile,
    cfg: Config,
    params: dict[str, Any],
    reason: str,
    short_of: int | None = None,
) -> SubmitResult:
    """Submit one attempt of an existing run directory with these executor parameters and
    record it in jobs.jsonl (the caller has checked that Slurm answers); ``short_of``: the
    profile's node count, where this attempt runs on fewer (``profile.nodes``)."""
    executor = make_executor(profile, paths, params)
    local_env = dict(profile.env) if profile.executor == "local" else {}  # Slurm: setup lines
    launcher = NodeLauncher(str(paths.root), cfg.dist.nproc_per_node, local_env)
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):  # submitit prints sbatch's refusal there too
            job = executor.submit(launcher)
    except SUBMISSION_ERRORS as e:
        first = str(e).strip().splitlines()
        raise GrpoError(f"submission failed: {first[-1] if first else e}") from None
    attempt = record_job(paths, str(job.job_id), profile, reason, short_of)
    return SubmitResult(str(job.job_id), attempt, job)


def record_job(
    paths: RunPaths, job_id: str, profile: Profile, reason: str, short_of: int | None = None
) -> int:
    """Append a submitted job to jobs.jsonl (with ``short_of``, the profile's node count,
    when it runs on fewer nodes); returns its attempt number."""
    attempt = next_attempt(paths)
    short = {} if short_of is None else {"short_of": short_of}
    append_jsonl(
        paths.jobs,
        {
            "job_id": job_id,
            "attempt": attempt,
            "submitted_at": time.time(),
            "reason": reason,
            "profile": profile.name,
            "executor": profile.executor,
            "nodes": profile.nodes,
            **short,
        },
    )
    return attempt


def attempt_nodes(full: int, asked: int | None) -> tuple[int, int | None]:
    """``(nodes, short_of)`` of an attempt's jobs.jsonl record (pure): the ``asked`` nodes
    where the attempt was submitted on a count of its own (the monitor's, after a node was
    lost: grpo_hpc/monitor/nodes.py), else the profile's ``full``; ``short_of`` is ``full``
    where that is fewer, else None.

    ====================  ==================  =====================
    asked                 nodes               short_of
    ====================  ==================  =====================
    None (the profile's)  full                None
    fewer than full       asked               full
    full (a grow)         full                None
    ====================  ==================  =====================
    """
    nodes = full if asked is None else asked
    return nodes, (full if nodes < full else None)


def adopt(paths: RunPaths, job_id: str, reason: str, nodes: int | None = None) -> None:
    """Record a job that was submitted for this run but never made it into jobs.jsonl
    (its submitter was killed between sbatch and the write), on the ``nodes`` it was
    submitted on (the intent's: fewer than the profile's after a node loss)."""
    profile = load_run_profile(paths)
    count, short_of = attempt_nodes(profile.nodes, nodes)
    record_job(paths, job_id, dataclasses.replace(profile, nodes=count), reason, short_of)


def write_run(plan: SubmitPlan) -> None:
    """The run directory of a plan (config.yaml + profile.yaml), created atomically: a
    temporary directory renamed into place."""
    paths = plan.paths
    if paths.root.exists():
        raise ConfigError(exists_problem(paths)[0])
    tmp = paths.root.with_name(f".{paths.name}.creating")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    atomic_write_text(tmp / paths.config.name, to_yaml(plan.config))
    atomic_write_text(tmp / paths.profile.name, yaml.safe_dump(profile_to_dict(plan.profile)))
    # the setup template beside the stored profile: a resubmission renders the same setup
    # wherever the profile came from (a user's folder, a copy since deleted or edited)
    source = template_file(plan.profile)
    if source is not None:
        (tmp / plan.profile.template).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, tmp / plan.profile.template)
    tmp.rename(paths.root)


def carry_out(plan: SubmitPlan) -> SubmitResult:
    """Submit a plan as planned: refused when it has problems (exit 2, nothing written);
    else the run directory, then its first attempt; the directory is removed again when the
    submission fails."""
    preflight.refuse(list(plan.problems))
    if plan.profile.executor == "slurm":
        slurm_query.check_available()  # before the directory: nothing to undo
    write_run(plan)
    try:
        result = submit_attempt(
            plan.paths, plan.profile, plan.config, plan.executor_params, "initial submission"
        )
        return dataclasses.replace(result, memory_line=plan.memory.line)
    except BaseException:
        shutil.rmtree(plan.paths.root, ignore_errors=True)
        raise


def create_run(
    paths: RunPaths,
    profile: Profile,
    config_source: str | None,
    overrides: list[str],
    force: bool = False,
) -> SubmitPlan:
    """A run directory without a submission, for tests and benchmarks that start the trainer
    themselves: planned as grpo-submit plans it, refused only where the memory does not fit
    (unless ``force``). Preflight problems are not refused here, so that a test can give the
    trainer inputs the trainer must refuse itself."""
    plan = plan_submission(paths, profile, config_source, overrides, force)
    if plan.memory.refusal and not force:
        raise ConfigError(plan.memory.refusal)
    write_run(plan)
    return plan


def resubmit(paths: RunPaths, reason: str, nodes: int | None = None) -> SubmitResult:
    """Submit the next attempt of an existing run with its stored config and profile;
    ``nodes``: on this many nodes instead of the profile's (the monitor, after a node was
    lost: grpo_hpc/monitor/nodes.py), recorded in jobs.jsonl."""
    if not paths.config.is_file():
        raise ConfigError(f"{paths.root} is not a run directory (no config.yaml)")
    profile = load_run_profile(paths)
    count, short_of = attempt_nodes(profile.nodes, nodes)
    profile = dataclasses.replace(profile, nodes=count)
    # the torch the job would run, checked again (it may have changed since submission):
    # refused in one line, which the monitor records and stops on (a configuration error)
    preflight.refuse(preflight.torch_problems(profile))
    if profile.executor == "slurm":
        slurm_query.check_available()
    setup = render_setup(profile, template_context(paths))
    params = executor_parameters(profile, paths.name, setup)
    return submit_attempt(paths, profile, load_resolved(paths.config), params, reason, short_of)


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
