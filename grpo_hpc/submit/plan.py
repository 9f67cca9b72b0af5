"""A submission, planned once: everything grpo-submit decides before it writes or queues.

``plan_submission`` turns (config, overrides, profile, the model's ``config.json``) into a
:class:`SubmitPlan`: the resolved config, the memory verdict, every problem that refuses
the submission, the rendered setup lines and the executor's parameters. It reads (the
config YAML, the profile, the model's ``config.json``, the first rows of a data file) and
never writes. ``--dry-run`` prints the plan and refuses exactly when the submission would;
:func:`grpo_hpc.submit.job.carry_out` submits the same value without resolving anything
again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_hpc.config import validate
from grpo_hpc.config.load import build_config, normalize_overrides
from grpo_hpc.config.profiles import Profile, render_setup
from grpo_hpc.config.rollout_engine import EngineChoice
from grpo_hpc.config.schema import Config
from grpo_hpc.core import slurm as slurm_query
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.memory import plan as memory_plan
from grpo_hpc.node.launch import NodeContext, torchrun_command
from grpo_hpc.submit import preflight, scaling


@dataclass(frozen=True)
class SubmitPlan:
    """One submission, decided: what ``--dry-run`` prints and what the submission carries
    out."""

    paths: RunPaths
    """The run directory to create."""
    profile: Profile
    """The cluster profile, as loaded (stored in the run directory as ``profile.yaml``)."""
    config: Config
    """The resolved config: the profile applied, then any memory means the fit needed."""
    memory: memory_plan.Check
    """The memory verdict; ``memory.line`` is the ``memory:`` line both paths print."""
    problems: tuple[str, ...]
    """Why the submission is refused, one line each (empty: it goes ahead)."""
    setup: tuple[str, ...]
    """The profile's setup lines, rendered for this run (module loads, env exports)."""
    executor_params: dict[str, Any] = field(default_factory=dict)
    """submitit's AutoExecutor parameters."""
    rollout: EngineChoice | None = None
    """The rollout engine the job will decode with, and why (its ``rollout:`` line)."""

    @property
    def rollout_line(self) -> str:
        """The ``rollout:`` line both paths print (none when refused: the refusal says it)."""
        if self.rollout is None or self.rollout.refusal:
            return ""
        return self.rollout.line

    @property
    def placement_line(self) -> str:
        """Where generation runs, for an asynchronous run (none for a synchronous one), and
        its synchronous first steps if it has them (``algo.synchronous_steps``)."""
        line = self._placement()
        n = self.config.algo.synchronous_steps
        if line and n > 1:
            line += f"; its first {n} steps synchronous (algo.synchronous_steps={n})"
        return line

    def _placement(self) -> str:
        k = self.config.algo.max_staleness
        if not k:
            return ""
        ranks = self.profile.nodes * self.config.dist.nproc_per_node
        if self.config.rollout.placement == "split":
            return split_placement_line(self.config, self.profile, ranks)
        fsdp = ranks > 1 and self.config.dist.strategy == "fsdp"
        where = "one process" if ranks == 1 else f"each of {ranks} DDP processes"
        m = self.config.rollout.steps_per_generation
        if m > 1:
            where = f"each of {ranks} FSDP2 processes" if fsdp else where
            return (
                f"placement: {where}: the trainer generates {m} steps' batches in one rollout "
                f"with its current weights, each trained at its own step, at most {m - 1} "
                f"update(s) stale (rollout.steps_per_generation={m}; docs/async.md)"
            )
        copy = "a copy of the weights"
        if fsdp:  # each rank's copy is whole: its shards are gathered after each update
            where, copy = f"each of {ranks} FSDP2 processes", "a full copy of the weights"
        pool = self.config.rollout.partial_pool
        partial = f", the prompts of {pool} steps in flight, answers continued" if pool else ""
        return (
            f"placement: {where}: the trainer, and a generator thread on {copy}{partial}, "
            f"batches at most {k} update(s) stale (algo.max_staleness={k}; docs/async.md)"
        )

    @property
    def async_note(self) -> str:
        """The ``note:`` lines of an asynchronous run: what it gains on its GPUs, and what
        it lacks if it hands over its last step."""
        lines = (async_speed_note(self.config, self.profile), async_learning_note(self.config))
        return "\n".join(line for line in lines if line)

    @property
    def refused(self) -> bool:
        return bool(self.problems)


def async_speed_note(cfg: Config, profile: Profile) -> str:
    """A note for an asynchronous run whose generator thread shares each GPU with the
    update (the thread placement on a GPU profile): on one H100 and one H200 that gained
    1.0-1.2x a synchronous step, because the decode slowed by about the update's length
    while both ran (bench/results/LOG-speed.md, 2026-12-05); decoding more rows at once
    paid there instead (three steps' batches from one rollout: 1.53x on one H100,
    bench/results/longtail_amortize_h100_2026-12-05.md), so the note names that option
    first. Empty otherwise. Pure."""
    ro = cfg.rollout
    if not cfg.algo.max_staleness or ro.placement == "split" or ro.steps_per_generation > 1:
        return ""
    if profile.gpus_per_node <= 0:
        return ""
    return (
        "note: asynchronous beside the update on the same GPU: measured 1.0-1.2x a "
        "synchronous step on one H100 or H200 (the decode slows while the update runs; "
        "docs/async.md); rollout.steps_per_generation=M (with algo.max_staleness>=M-1) "
        "decodes M steps' rows at once, 1.53x at M=3 on one H100; rollout.placement=split "
        "gives generation GPUs of their own"
    )


def async_learning_note(cfg: Config) -> str:
    """A note for an asynchronous run without keep-best or the rescue, which the learning
    benchmark showed it needs: its last step learned worse than the synchronous step's
    (k = 1, grouped generation at M = 2 and 3, partial rollouts: 20 paired seeds each),
    while with a validation split keep-best and the rescue handed over as good a model
    (k = 1 and M = 3; docs/async.md, "What staleness costs in learning").
    Empty for a synchronous run or one that has both. Pure."""
    if not cfg.algo.max_staleness:
        return ""
    t = cfg.training
    missing = []
    if cfg.data.num_val <= 0:
        missing.append(("a validation split", "data.num_val=32"))
    if t.eval_every <= 0:
        missing.append(("evaluations", "training.eval_every=N"))
    if cfg.data.num_val > 0 and t.eval_every > 0 and t.final != "best":
        missing.append(("keep-best", "training.final=best"))
    if t.on_collapse != "rollback":
        missing.append(("the rescue", "training.on_collapse=rollback"))
    if not missing:
        return ""
    what = " and ".join(w for w, _ in missing)
    fix = " ".join(f for _, f in missing)
    return (
        f"note: asynchronous without {what}: on the learning benchmark its last step scored "
        f"below a synchronous run's, while keep-best with the rescue matched it "
        f"(docs/async.md); set {fix}"
    )


def split_placement_line(cfg: Config, profile: Profile, ranks: int) -> str:
    """The ``placement:`` line of a ``rollout.placement=split`` run: each role's ranks and
    its memory estimate where the profile names its GPUs' memory, and with several
    generators which serves which trainer (pure but for reading the model's config.json)."""
    g = cfg.rollout.generators
    t = ranks - g
    if t < 1:  # refused (config.validate.split_problem): the refusal says why
        return ""
    mem = memory_plan.split_memory(cfg, profile.nodes, profile.capability)
    known = mem is not None and profile.gpu_mem_gb is not None
    engine = f" (engine {mem.generator_gib:.1f} GiB)" if known else ""
    update = f" (update {mem.trainer_gib:.1f} GiB)" if known else ""
    k = cfg.algo.max_staleness
    per_node = cfg.dist.nproc_per_node if profile.nodes > 1 else 0
    trainers = _ranks("trainer", range(t), per_node)
    generators = _ranks("generator", range(t, ranks), per_node)
    served = f" (trainer r's: rank {t} + r % {g})" if g > 1 else ""  # config.roles.generator_of
    pool = cfg.rollout.partial_pool
    partial = (
        f"; each trainer's prompts of {pool} steps in flight, answers continued" if pool else ""
    )
    return (
        f"placement: split: {trainers}{update}, {generators}{engine}{served}{partial}; "
        f"batches at most {k} update(s) stale (algo.max_staleness={k}; docs/async.md)"
    )


def _ranks(role: str, ranks: range, per_node: int = 0) -> str:
    """``trainer rank 0``, ``generator ranks 1-2``; with ``per_node`` (a job of several
    nodes, ranks numbered node by node) where they land: ``trainer rank 0 on node 0``,
    ``trainer ranks 0-2 on nodes 0-1``."""
    name = f"{role} rank {ranks[0]}" if len(ranks) == 1 else f"{role} ranks {ranks[0]}-{ranks[-1]}"
    if not per_node:
        return name
    first, last = ranks[0] // per_node, ranks[-1] // per_node
    return f"{name} on node {first}" if first == last else f"{name} on nodes {first}-{last}"


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
    the training math unchanged are applied (grpo_hpc.memory.fit.MEANS)."""
    explicit = frozenset(o.partition("=")[0] for o in normalize_overrides(overrides or []))
    cfg = apply_profile(build_config(config_source, overrides), profile, run_name, explicit)
    # algo.micro_batch_tokens=auto, where it can be estimated here; else the trainer
    # decides it from its own GPU and model
    if profile.gpu_mem_gb is not None and memory_plan.model_shape(cfg.model) is not None:
        cfg = memory_plan.resolve_auto_tokens(
            cfg, profile.gpu_mem_gb, profile.nodes, profile.capability
        )
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


def template_context(paths: RunPaths) -> dict[str, Any]:
    """What a profile's setup lines may name: ``{{ run_name }}``, ``{{ run_dir }}``."""
    return {"run_name": paths.name, "run_dir": str(paths.root)}


def exists_problem(paths: RunPaths) -> list[str]:
    """A run directory of that name exists already: its one line, or none."""
    if not paths.root.exists():
        return []
    return [
        f"run {paths.name!r} already exists in {paths.root.parent}: choose another --name, "
        f"or continue it with --resume {paths.name}"
    ]


def plan_submission(
    paths: RunPaths,
    profile: Profile,
    config_source: str | None,
    overrides: list[str],
    force: bool = False,
    cache: Path | None = None,
) -> SubmitPlan:
    """The plan of a new run's first submission (reads, never writes). A run directory
    that exists, every preflight problem, and a run that does not fit the profile's GPUs
    (unless ``force``) are its problems, in the order a user would fix them."""
    cfg, chk = resolve(config_source, overrides, profile, paths.name)
    setup = render_setup(profile, template_context(paths))  # a template error: exit 2 here
    problems = exists_problem(paths) + preflight.check_all(cfg, profile, cache)
    rollout = preflight.rollout_choice(cfg, profile)
    if rollout.refusal:  # the trainer's own refusal at step 0, made before the job queues
        problems.append(rollout.refusal)
    trainers = validate.training_ranks(cfg, profile.nodes * cfg.dist.nproc_per_node)
    if rollout.engine and (why := validate.split_evaluation_problem(cfg, trainers, rollout.engine)):
        problems.append(why)  # the trainer's refusal at setup, from the same engine choice
    if chk.refusal and not force:
        problems.append(chk.refusal)
    return SubmitPlan(
        paths=paths,
        profile=profile,
        config=cfg,
        memory=chk,
        problems=tuple(problems),
        setup=tuple(setup),
        executor_params=executor_parameters(profile, paths.name, setup),
        rollout=rollout,
    )


def render_sbatch(plan: SubmitPlan) -> str:
    """The exact sbatch script submitit would write for this plan; needs no Slurm."""
    import submitit

    class _PreviewExecutor(submitit.SlurmExecutor):
        """submitit's Slurm executor minus its ``srun`` check, so that ``--dry-run`` renders
        the sbatch script on a machine with no Slurm installed (a laptop, CI). It never
        submits."""

        @classmethod
        def affinity(cls) -> int:
            return 1

    params = plan.executor_params
    inner = _PreviewExecutor(folder=plan.paths.submitit_dir / "%j")
    # AutoExecutor's translation for the slurm cluster: generic names are converted,
    # slurm_* keys pass through without their prefix.
    generic = submitit.AutoExecutor._valid_parameters()
    converted = inner._convert_parameters({k: v for k, v in params.items() if k in generic})
    converted |= {k[len("slurm_") :]: v for k, v in params.items() if k.startswith("slurm_")}
    inner.update_parameters(**converted)
    return inner._make_submission_file_text(inner._submitit_command_str, "dry-run")


def preview(plan: SubmitPlan) -> str:
    """The job of a plan as text: the sbatch script (Slurm profiles) and each node's
    torchrun command (the golden files in tests/golden are this text)."""
    profile, paths = plan.profile, plan.paths
    parts = []
    if profile.executor == "slurm":
        parts += ["# ---- sbatch script (written by submitit) ----", render_sbatch(plan)]
    else:
        parts += [f"# ---- local executor: no Slurm; runs on this machine in {paths.submitit_dir}"]
        env = sorted(profile.env.items())  # the trainer's environment (NodeLauncher.env)
        parts += [f"# environment (the profile's env): {k}={v}" for k, v in env]
    ctx = NodeContext(nnodes=profile.nodes, master_addr="$FIRST_NODE", job_id="$SLURM_JOB_ID")
    cmd = torchrun_command(str(paths.root), plan.config.dist.nproc_per_node, ctx)
    parts += [f"# ---- per node ({profile.nodes} node(s)): ----", " ".join(cmd)]
    return "\n".join(parts) + "\n"


def scaling_text(plan: SubmitPlan) -> str:
    """The ``scaling:`` line of a multi-node plan: the scaling model's step and
    communication share (grpo_hpc/submit/scaling.py); empty for one node."""
    p = plan.profile
    if p.nodes <= 1:
        return ""
    shape = memory_plan.model_shape(plan.config.model)
    params = shape.params if shape is not None else None
    return scaling.scaling_line(
        params, p.capability, p.gpus_requested, p.nodes, p.link_gbps, plan.config.dist.strategy
    )


def dry_run_text(plan: SubmitPlan) -> str:
    """What ``--dry-run`` prints: the job, the memory and rollout lines the submission
    prints, a multi-node plan's scaling estimate, and each problem that refuses it."""
    refused = [f"# refused at submission: {line}" for line in plan.problems]
    lines = (plan.memory.line, plan.rollout_line, plan.placement_line, plan.async_note)
    lines += (scaling_text(plan),)
    said = [line for line in lines if line] + refused
    return preview(plan) + "\n".join(said) + "\n"
