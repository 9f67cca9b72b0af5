"""``grpo-submit``: create a run from a config and a cluster profile, and submit it."""

from __future__ import annotations

import sys
import time

from grpo_hpc.cli.common import EXIT_CODES_HELP, Parser, run_cli
from grpo_hpc.config.load import builtin_configs, normalize_overrides
from grpo_hpc.config.profiles import known_profiles, load_profile
from grpo_hpc.core.errors import ConfigError, ExitCode
from grpo_hpc.core.paths import RunPaths, logs_root
from grpo_hpc.core.progress import read_progress
from grpo_hpc.submit import preflight
from grpo_hpc.submit.plan import dry_run_text, plan_submission

SUBMIT_EXAMPLES = """examples:
  grpo-submit --profile local --config demo            # train SmolLM2-135M on this machine
  grpo-submit --profile local --config code            # SmolLM2-135M on HumanEval, pass@1
  grpo-submit --profile supercloud --config gsm8k --dry-run
  grpo-submit --profile my-4node.yaml --config gsm8k --dry-run   # nodes: 4: a scaling: line too
  grpo-submit --profile h100x2 --config gsm8k training.max_steps=500 --name gsm8k-a
  grpo-submit --profile slurm-local --config tiny --wait --rollout.temperature=0.7
  grpo-submit --profile h100x2 --config gsm8k algo.max_staleness=1 --dry-run   # overlapped
  grpo-submit --profile h100x2 --config gsm8k algo.max_staleness=2 rollout.partial_pool=2 \
      rollout.placement=split --dry-run   # a generator GPU; long answers continued
  grpo-submit --resume gsm8k-a                          # next attempt of an existing run
  grpo-submit --resume gsm8k-a --from-step 200          # go back to checkpoint 200
  grpo-submit --profile supercloud --config gsm8k --watch   # and start a monitor for it
  grpo-submit --list-profiles

overrides: any config key as section.key=value or --section.key=value; dist.* comes
from the profile, but dist.strategy and dist.precision given here win over it (bf16 is
refused before queueing on a profile whose gpu_capability is below 8.0, e.g. supercloud)
"""


def _parser() -> Parser:
    p = Parser(
        prog="grpo-submit",
        description="Create a GRPO run (logs/<run>/) and submit it as a torchrun job.",
        epilog=SUBMIT_EXAMPLES + "\n" + EXIT_CODES_HELP,
    )
    p.add_argument("--profile", help="cluster profile name or path to a profile YAML")
    p.add_argument(
        "--config", help=f"built-in config ({', '.join(builtin_configs())}) or a YAML path"
    )
    p.add_argument("--name", help="run name (default: <config>-<date>-<time>)")
    p.add_argument("--logs", help="runs directory (default: $GRPO_HPC_LOGS or ./logs)")
    p.add_argument("--resume", metavar="RUN", help="submit the next attempt of an existing run")
    p.add_argument(
        "--from-step",
        type=int,
        metavar="N",
        help="with --resume: restart from checkpoint N (newer ones are set aside, not deleted)",
    )
    p.add_argument("--watch", action="store_true", help="start grpo-monitor for this run")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the job, its memory estimate (several nodes: the scaling model's step) only",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="submit even when the estimated GPU memory exceeds the profile's gpu_mem_gb",
    )
    p.add_argument("--wait", action="store_true", help="wait for the job and show progress")
    p.add_argument("--no-wait", action="store_true", help="do not wait (local profile waits)")
    p.add_argument("--list-profiles", action="store_true", help="list known profiles and exit")
    return p


def _split_args(argv: list[str]) -> tuple[object, list[str]]:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    bad = [a for a in rest if "=" not in a]
    if bad:
        parser.error(f"unrecognized argument {bad[0]!r}")
    return args, rest


def _default_name(config: str | None) -> str:
    stem = (config or "run").rsplit("/", 1)[-1].removesuffix(".yaml").removesuffix(".yml")
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def _submit(argv: list[str]) -> int:
    from grpo_hpc.submit import job as submit

    args, overrides = _split_args(argv)
    if args.list_profiles:
        names = known_profiles()
        width = max(map(len, names), default=0)
        for name in names:  # the descriptions in one column, however long a name
            print(f"{name:{width}s}  {load_profile(name).description}")
        return ExitCode.OK
    overrides = normalize_overrides(overrides)
    root = logs_root(args.logs)
    if args.resume:
        return _resume(args, overrides, root)
    if args.from_step is not None:
        raise ConfigError("--from-step goes with --resume: e.g. --resume gsm8k-a --from-step 200")
    if not args.profile:
        raise ConfigError("--profile is required: e.g. --profile local (see --list-profiles)")
    paths = RunPaths.for_run(args.name or _default_name(args.config), root.resolve())
    plan = plan_submission(paths, load_profile(args.profile), args.config, overrides, args.force)
    # where the installed torch's GPU architectures could not be checked (no torch found,
    # a CUDA torch that lists none), say so rather than pass silently
    torch_note = preflight.torch_note(plan.profile)
    if args.dry_run:  # the plan as the submission would carry it out, and its verdict
        sys.stdout.write(dry_run_text(plan))
        if torch_note:
            print(torch_note)
        preflight.refuse(list(plan.problems))  # exit 2, as the submission would
        return ExitCode.OK
    result = submit.carry_out(plan)
    print(result.memory_line)
    if torch_note:
        print(torch_note)
    for line in (plan.rollout_line, plan.placement_line, plan.async_note):
        if line:
            print(line)
    executor = plan.profile.executor
    print(f"submitted run {paths.name}: job {result.job_id} ({executor}), dir {paths.root}")
    if args.watch:
        _start_monitor(paths)
    wait = args.wait or (executor == "local" and not args.no_wait)
    return _wait(paths, result) if wait else ExitCode.OK


def _resume(args, overrides: list[str], root) -> int:  # noqa: ANN001
    from grpo_hpc.monitor.attempts import start_next_attempt

    paths = RunPaths.for_run(args.resume, root.resolve())
    if not paths.config.is_file():
        raise ConfigError(
            f"no run {args.resume!r} in {root}: check the name (grpo-status lists runs)"
        )
    if overrides:
        raise ConfigError("--resume continues a run with its stored config: drop the overrides")
    preflight.refuse(preflight.check_run(paths))  # inputs may have moved since submission
    started = start_next_attempt(paths, "manual --resume", from_step=args.from_step)
    if started.how == "adopted":
        print(
            f"adopted job {started.job_id}: an earlier submission of {paths.name} was killed "
            "before it recorded the job; not submitting again"
        )
        return ExitCode.OK
    if args.from_step is not None:
        aside = started.set_aside or "none"
        print(f"resuming from checkpoint {args.from_step}; set aside: {aside}")
    print(f"resubmitted run {paths.name}: job {started.job_id}, attempt {started.attempt}")
    if args.watch:
        _start_monitor(paths)
    return _wait(paths, started) if args.wait else ExitCode.OK


def _start_monitor(paths: RunPaths) -> None:
    """A detached ``grpo-monitor RUN`` (survives this shell; log in the run directory)."""
    import subprocess

    log = open(paths.root / "monitor.log", "ab")  # noqa: SIM115 - handed to the child
    cmd = [
        sys.executable,
        "-m",
        "grpo_hpc.cli.monitor",
        paths.name,
        "--logs",
        str(paths.root.parent),
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
    print(f"monitor started (pid {proc.pid}); log: {paths.root / 'monitor.log'}")


def _wait(paths: RunPaths, result) -> int:  # noqa: ANN001
    """Wait for the job with a live progress bar (a line per step when not a terminal)."""
    from grpo_hpc.status.live import follow

    follow(paths, result.job.done)
    rec = read_progress(paths.progress)
    if rec is not None and rec.exit_code is not None:
        code = int(rec.exit_code)
    else:
        code = ExitCode.CRASH  # the trainer never recorded an outcome
    training = f"{rec.state.value} at step {rec.step}/{rec.max_steps}" if rec else "no progress"
    why = f" ({rec.reason})" if rec is not None and rec.reason else ""
    # submitit reports done before Slurm's accounting leaves RUNNING: the training
    # outcome comes from progress.json, not from the job state.
    print(f"job {result.job_id} ended: training {training}{why}")
    name = ExitCode(code).name.lower() if code in {int(e) for e in ExitCode} else "unknown"
    print(f"exit code {code} ({name}); run directory {paths.root}")
    return code


def main(argv: list[str] | None = None) -> int:
    return run_cli("grpo-submit", lambda: _submit(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
