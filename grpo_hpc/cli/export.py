"""``grpo-export``: the command line (argparse, examples, exit codes); the work is in
:mod:`grpo_hpc.export.run`."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from grpo_hpc.cli.common import EXIT_CODES_HELP, Parser, run_cli
from grpo_hpc.core.best import best_path, read_best, unreadable
from grpo_hpc.core.errors import ConfigError, ExitCode
from grpo_hpc.core.paths import RunPaths, logs_root
from grpo_hpc.export import plan as export_plan
from grpo_hpc.export.plan import ExportOptions, fmt_bytes, read_provenance
from grpo_hpc.export.run import (
    check_out,
    chosen_final_step,
    export_final,
    export_run,
    final_step,
    link_final,
    plan_export,
)

EXAMPLES = """examples:
  grpo-export demo-a                      # where the finished run's final/ is (written if missing)
  grpo-export demo-a demo-a-hf            # newest complete checkpoint -> a HF directory
  grpo-export gsm8k-a out/ --step 200 --dtype bf16 --max-shard-size 2GB
  grpo-export gsm8k-a out/ --best         # the best evaluation's checkpoint (best.json)
  grpo-export lora-a lora-a-adapter --adapter   # a LoRA run's PEFT adapter alone
  grpo-export gsm8k-a out/ --dry-run      # what would be written, and how big

The result loads with AutoModelForCausalLM.from_pretrained(OUT) and
AutoTokenizer.from_pretrained(OUT) (chat template included); grpo-eval OUT scores it.
An --adapter export names its base in adapter_config.json as from_pretrained loads it:
a hub model's id, else the absolute directory the run's weights came from (tiny: the
run's tiny_model/; smollm2-135m: the converted GGUF), for PeftModel.from_pretrained.
A checkpoint that fails grpo-ckpt verify, an existing OUT (without --force), or a run
with no complete checkpoint is refused with one line and exit 2; nothing is written.
"""


def _parser() -> Parser:
    p = Parser(
        prog="grpo-export",
        description="Export a run's checkpoint as a Hugging Face model directory "
        "(safetensors, config, generation config, tokenizer and chat template).",
        epilog=EXAMPLES + "\n" + EXIT_CODES_HELP,
    )
    p.add_argument("run", metavar="RUN", help="run name (or run directory path)")
    p.add_argument(
        "out",
        metavar="OUT",
        nargs="?",
        type=Path,
        help="directory to create (default: the run's final/, for its final weights)",
    )
    p.add_argument(
        "--step",
        type=int,
        help="checkpoint step (default: newest complete; 0: the model the run started from)",
    )
    p.add_argument(
        "--best",
        action="store_true",
        help="keep-best's model to hand over so far (best.json; grpo-status shows it)",
    )
    p.add_argument(
        "--dtype",
        choices=sorted(export_plan.DTYPES),
        help="dtype written (default: the run's compute dtype, dist.precision)",
    )
    p.add_argument(
        "--adapter", action="store_true", help="LoRA runs: the PEFT adapter alone, not merged"
    )
    p.add_argument(
        "--max-shard-size",
        default="5GB",
        metavar="SIZE",
        help="largest safetensors file, e.g. 5GB, 500MB (default 5GB, like save_pretrained)",
    )
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--dry-run", action="store_true", help="say what would be written, and how big")
    p.add_argument("--logs", type=Path, help="runs directory (default: $GRPO_HPC_LOGS or ./logs)")
    return p


def _export(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from grpo_hpc.core.runs import resolve_run

    paths = resolve_run(args.run, logs_root(args.logs, must_exist=False))
    try:
        max_shard = export_plan.parse_size(args.max_shard_size)
    except ValueError as e:
        raise ConfigError(f"--max-shard-size: {e}") from None
    if args.best and args.step is not None:
        raise ConfigError("--best or --step, not both: --best is the best evaluation's step")
    if args.best and args.out is None:
        raise ConfigError(
            "give OUT for --best (a finished run's final/ is the best already, with "
            "training.final=best: grpo-export RUN says where)"
        )
    step = best_step(paths) if args.best else args.step
    opts = ExportOptions(step, args.dtype, args.adapter, max_shard, args.force)
    out = args.out
    if out is None:
        if args.step is not None or args.adapter or args.dtype:
            raise ConfigError("give OUT: final/ holds the final weights in the run's dtype only")
        last = final_step(paths)
        if last is None:
            raise ConfigError(
                f"run {paths.name} has not finished: give OUT to export its newest checkpoint"
            )
        if paths.final.exists() and not args.force:
            prov = read_provenance(paths.final) or {}
            print(f"final model of {paths.name} (step {prov.get('step', '?')}): {paths.final}")
            return ExitCode.OK
        print(f"final model of {paths.name}: {export_final(paths, last)}")
        return ExitCode.OK
    if args.dry_run:
        check_out(out.resolve(), opts.force)
        plan, _ = plan_export(paths, out.resolve(), opts, dry_run=True)
        print("\n".join(plan.describe()))
        return ExitCode.OK
    t0 = time.monotonic()
    plan = export_run(paths, out, opts)
    seconds = time.monotonic() - t0
    print(
        f"exported {plan.run} step {plan.step} ({plan.kind}, {plan.dtype}, "
        f"{fmt_bytes(plan.weight_bytes)} in {len(plan.files)} file(s), {seconds:.1f} s) "
        f"to {plan.out}"
    )
    final = chosen_final_step(paths)
    if plan.kind != "lora-adapter" and opts.dtype is None and plan.step == final:
        if link_final(paths, plan.out):
            print(f"also the run's final model: {paths.final}")
    return ExitCode.OK


def best_step(paths: RunPaths) -> int:
    """The step of the run's model to hand over (``--best``; 0: the start, which beat
    every later evaluation); ConfigError when there is none."""
    if unreadable(paths.root):
        raise ConfigError(
            f"{best_path(paths.root)} is unreadable (not a keep-best record): the run's next "
            "evaluation rewrites it; meanwhile export --step N (grpo-ckpt list "
            f"{paths.name})"
        )
    best = read_best(paths.root)
    if best is None:
        raise ConfigError(
            f"run {paths.name} has no best checkpoint (no evaluation recorded: "
            "training.eval_every and data.num_val choose one): export --step N or the "
            "newest checkpoint"
        )
    return best.step


def main(argv: list[str] | None = None) -> int:
    """Console entry point ``grpo-export``."""
    return run_cli("grpo-export", lambda: _export(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
