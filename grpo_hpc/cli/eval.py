"""``grpo-eval``: the command line (argparse, examples, exit codes); the work is in
:mod:`grpo_hpc.evaluate.local`."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from grpo_hpc.cli.common import EXIT_CODES_HELP, Parser, run_cli
from grpo_hpc.core.errors import ConfigError, ExitCode, GrpoError
from grpo_hpc.core.fsutil import atomic_write_json
from grpo_hpc.core.paths import RunPaths, logs_root
from grpo_hpc.evaluate.local import RUN_DATA, EvalOptions, data_slug, evaluate, summary_line
from grpo_hpc.evaluate.target import refuse_missing_model_dir, resolve_target

EXAMPLES = """examples:
  grpo-eval demo-a                         # the run's newest checkpoint on its held-out problems
  grpo-eval logs/demo-a/final --data arithmetic --num 32
  grpo-eval gsm8k-a --step 200 --data gsm8k:test --num 200 --out gsm8k-200.json
  grpo-eval out/hf --data gsm8k:test --samples 8     # pass@1..8 of 8 sampled completions
  grpo-eval out/hf --data mine.jsonl       # GSM8K format: question, answer ending '#### N'

Judged by the run's reward settings (its config.yaml, or the grpo_hpc_config.yaml an export
carries); a model that is not ours gets the defaults. Greedy unless --samples. The native
engine generates on a GPU, HF generate on a CPU. --profile local (the default) runs here;
a Slurm profile submits the same evaluation as a one-node job and waits for it (--no-wait:
submit and return), e.g.

  grpo-eval gsm8k-a --profile supercloud --data gsm8k:test --out /home/me/gsm8k-a.json
"""


def _parser() -> Parser:
    p = Parser(
        prog="grpo-eval",
        description="Score a run's checkpoint or a Hugging Face model directory on a data set.",
        epilog=EXAMPLES + "\n" + EXIT_CODES_HELP,
    )
    p.add_argument("model", metavar="MODEL_OR_RUN", help="model directory, run name or run path")
    p.add_argument("--step", type=int, help="a run's checkpoint step (default: newest)")
    p.add_argument(
        "--data",
        help="gsm8k:test, gsm8k:train, arithmetic, run, or PATH.jsonl "
        "(default: a run's held-out problems, else gsm8k:test)",
    )
    p.add_argument("--num", type=int, metavar="K", help="score the first K problems only")
    p.add_argument(
        "--samples", type=int, default=0, metavar="k", help="k sampled completions each: pass@k"
    )
    p.add_argument("--max-new-tokens", type=int, help="default: the run's, else 512")
    p.add_argument("--batch-size", type=int, help="rows per generate call (default: a rollout's)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (with --samples)")
    p.add_argument("--out", type=Path, help="result JSON (default: ./eval-<model>-<data>.json)")
    p.add_argument(
        "--profile",
        default="local",
        help="where to run: local (here, the default) or a Slurm profile (a one-node job)",
    )
    p.add_argument("--no-wait", action="store_true", help="with a Slurm profile: submit and return")
    p.add_argument("--logs", type=Path, help="runs directory (default: $GRPO_HPC_LOGS or ./logs)")
    return p


def _check(args: Any) -> None:
    for name in ("num", "max_new_tokens", "batch_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.samples < 0:
        raise ConfigError(f"--samples must be >= 0, got {args.samples}")


def _model_for_job(name: str, logs: Path | None) -> str:
    """MODEL_OR_RUN as an absolute path the compute node can open: checked here, on the
    login node, so that a typo is one line now, not a failed job later."""
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return str(path.resolve())
    from grpo_hpc.core.runs import resolve_run

    refuse_missing_model_dir(name)
    paths: RunPaths = resolve_run(name, logs_root(logs))
    if not paths.config.is_file():
        raise ConfigError(f"{name!r} is neither a model directory (config.json) nor a run")
    return str(paths.root.resolve())


def _submit(argv: list[str], args: Any) -> int:
    """``--profile`` names a cluster: the evaluation runs there as one job."""
    from grpo_hpc.config.profiles import load_profile
    from grpo_hpc.evaluate import job as eval_submit

    profile = load_profile(args.profile)  # an unknown profile is its own one-line error
    model = _model_for_job(args.model, args.logs)
    out = args.out or Path(f"eval-{data_slug(args.model)}-{data_slug(args.data or 'run')}.json")
    job = [model if a == args.model else a for a in argv]
    return eval_submit.submit(job, profile, out, wait=not args.no_wait, run_job=run_job)


def _eval(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    _check(args)
    if args.profile != "local":
        return _submit(argv, args)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # ours is the one bar
    with tempfile.TemporaryDirectory(prefix="grpo-eval-") as scratch:
        target = resolve_target(args.model, args.step, args.logs, Path(scratch))
        opts = EvalOptions(
            args.data, args.num, args.samples, args.max_new_tokens, args.batch_size, args.seed
        )
        spec = opts.data or (RUN_DATA if target.cfg is not None else "gsm8k:test")
        out = args.out or Path(f"eval-{data_slug(target.label)}-{data_slug(spec)}.json")
        if out.exists() and out.is_dir():
            raise ConfigError(f"--out {out} is a directory: give a file path")
        result = evaluate(target, opts)
    atomic_write_json(out, result)
    print(summary_line(result, out))
    return ExitCode.OK


def main(argv: list[str] | None = None) -> int:
    """Console entry point ``grpo-eval``."""
    return run_cli("grpo-eval", lambda: _eval(sys.argv[1:] if argv is None else argv))


def run_job(argv: list[str]) -> int:
    """What the compute node runs (pickled by submitit): grpo-eval, locally."""
    code = main(argv)
    if code != ExitCode.OK:
        raise GrpoError(f"grpo-eval exited {code} on the compute node (see the job's log)")
    return code


if __name__ == "__main__":
    sys.exit(main())
