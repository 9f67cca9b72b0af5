"""grpo-export: a run's checkpoint as a Hugging Face model directory.

``grpo-export RUN OUT`` writes what ``AutoModelForCausalLM.from_pretrained``, vLLM,
lm-evaluation-harness or a colleague loads: ``model.safetensors`` (sharded above
``--max-shard-size`` with ``model.safetensors.index.json``, as save_pretrained does),
``config.json``, ``generation_config.json``, the tokenizer with its chat template, and
two files of ours: ``grpo_export.json`` (run, step, checkpoint, dtype) and
``grpo_hpc_config.yaml`` (the run's resolved config, so that ``grpo-eval`` judges the
export with the run's reward settings).

It reads gathered (``model.pt``) and DCP-sharded (``dcp/``) checkpoints alike, in one
process without a GPU, and never the optimizer state: tensors are streamed one at a time
(``model.pt`` memory-mapped; DCP read tensor by tensor), cast, and written a shard at a
time, so the host memory it needs is about one shard plus one tensor. A LoRA run's
checkpoint holds only the adapters: the merged model is the run's base weights plus
``(alpha/r) * B @ A`` (``--adapter`` writes the PEFT adapter alone). The directory is
built in a temporary sibling and renamed; a checkpoint that fails ``grpo-ckpt verify`` is
refused. The decisions (which step, which dtype, shards, names) are pure functions in
:mod:`grpo_hpc.export_plan`; what it reads is :mod:`grpo_hpc.export_sources`'s, the
writing :mod:`grpo_hpc.export_write`'s. This module plans, and is the command line.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from grpo_hpc import export_plan
from grpo_hpc.cli_common import EXIT_CODES_HELP, Parser, run_cli
from grpo_hpc.config_load import load_resolved
from grpo_hpc.errors import ConfigError, ExitCode
from grpo_hpc.export_plan import ExportOptions, ExportPlan, TensorSpec, fmt_bytes, read_provenance
from grpo_hpc.export_sources import (
    BaseWeights,
    CheckpointTensors,
    ExportSources,
    base_model_dir,
    load_tokenizer,
)
from grpo_hpc.export_write import write_export
from grpo_hpc.manifest import verify_checkpoint
from grpo_hpc.paths import RunPaths, logs_root
from grpo_hpc.progress import TrainState, read_progress

# ----------------------------------------------------------------------- planning


def _resolve(paths: RunPaths, opts: ExportOptions, dry_run: bool) -> tuple[int, ExportSources]:
    if not paths.config.is_file():
        raise ConfigError(f"{paths.root} is not a run directory (no config.yaml)")
    cfg = load_resolved(paths.config)
    try:
        step = export_plan.choose_step(
            opts.step, paths.checkpoint_steps(complete_only=False), paths.checkpoint_steps()
        )
    except ValueError as e:
        raise ConfigError(f"run {paths.name} {e} (grpo-ckpt list {paths.name})") from None
    if not opts.verified and not dry_run:  # before reading a byte of it
        problems = verify_checkpoint(paths.checkpoint(step))
        if problems:
            raise ConfigError(
                f"checkpoint step-{step} of {paths.name} fails verification "
                f"({'; '.join(problems[:3])}): not exporting it (grpo-ckpt verify {paths.name})"
            )
    if opts.adapter and not cfg.model.lora_rank:
        raise ConfigError(f"--adapter: run {paths.name} trained all weights, not a LoRA adapter")
    base = base_model_dir(cfg, paths)
    tokenizer = load_tokenizer(base)
    from transformers import AutoConfig

    try:
        hf_config = AutoConfig.from_pretrained(base)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"cannot read {base}/config.json: {str(e).splitlines()[0]}") from None
    try:
        tensors = CheckpointTensors(paths.checkpoint(step))
    except Exception as e:  # noqa: BLE001 - an unreadable checkpoint is one line
        raise ConfigError(
            f"cannot read checkpoint step-{step} of {paths.name}: {type(e).__name__}: "
            f"{(str(e).splitlines() or [''])[0]} (grpo-ckpt verify {paths.name})"
        ) from None
    return step, ExportSources(cfg, tensors, base, tokenizer, hf_config)


def _tie(hf_config: Any) -> bool:
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    return bool(getattr(text, "tie_word_embeddings", False) or hf_config.tie_word_embeddings)


def plan_export(
    paths: RunPaths, out: Path, opts: ExportOptions, dry_run: bool = False
) -> tuple[ExportPlan, ExportSources]:
    """Resolve the step, verify the checkpoint (not for a dry run), find the base model and
    list the tensors; refuse bad input (ConfigError)."""
    step, src = _resolve(paths, opts, dry_run)
    dtype = export_plan.export_dtype(opts.dtype, src.cfg.dist.precision)
    numel = {k: _prod(src.ckpt.shape(k)) for k in src.ckpt.keys()}
    tied = export_plan.tied_keys(_tie(src.hf_config))
    if src.cfg.model.lora_rank:
        try:
            pairs, _ = export_plan.lora_pairs(src.ckpt.keys())
        except ValueError as e:
            raise ConfigError(f"checkpoint step-{step} of {paths.name}: {e}") from None
        if not pairs:
            raise ConfigError(f"checkpoint step-{step} of {paths.name} holds no LoRA weights")
        if opts.adapter:
            kind = "lora-adapter"
            keys = [(export_plan.adapter_key(k), k) for p in pairs for k in (p.a_key, p.b_key)]
            specs = [TensorSpec(name, numel[k], dtype) for name, k in keys]
        else:
            kind, base = "lora-merged", BaseWeights(src.base)
            specs = [TensorSpec(k, base.numel(k), dtype) for k in base.keys() if k not in tied]
    else:
        kind = "full"
        names = [k for k in src.ckpt.keys() if export_plan.hf_name(k) not in tied]
        specs = [TensorSpec(export_plan.hf_name(k), numel[k], dtype) for k in names]
    single = export_plan.ADAPTER_FILE if kind == "lora-adapter" else export_plan.SINGLE_FILE
    shards = export_plan.plan_shards(specs, opts.max_shard_bytes)
    files = export_plan.shard_file_names(len(shards), single)
    plan = ExportPlan(paths.name, step, src.ckpt.ckpt, src.ckpt.format, src.base, out, dtype, kind)
    plan.shards, plan.files = shards, files
    return plan, src


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def check_out(out: Path, force: bool) -> None:
    """OUT must not exist (unless ``force``) and its parent must be writable."""
    if out.exists() and not force:
        raise ConfigError(f"{out} exists: choose another directory or pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file: give a directory path for the export")
    parent = out.parent
    if not parent.is_dir():
        raise ConfigError(f"{parent} does not exist: create it first (OUT's parent directory)")


def export_run(paths: RunPaths, out: Path, opts: ExportOptions) -> ExportPlan:
    """Plan, verify and write one export; ConfigError (one line, nothing written) on bad
    input."""
    out = out.resolve()
    check_out(out, opts.force)
    plan, src = plan_export(paths, out, opts)
    write_export(plan, src, opts.force)
    return plan


def final_step(paths: RunPaths) -> int | None:
    """The step of a finished run's final weights, else None."""
    rec = read_progress(paths.progress)
    if rec is None or rec.state is not TrainState.FINISHED:
        return None
    return rec.step if rec.step in paths.checkpoint_steps() else None


def link_final(paths: RunPaths, exported: Path) -> bool:
    """Give a finished run its ``final/`` from an export of its final weights (hard links,
    a copy across filesystems), when it has none yet. True when it wrote one."""
    if paths.final.exists():
        return False
    tmp = paths.final.with_name(f".{paths.final.name}.tmp-{os.getpid()}")
    try:
        shutil.copytree(exported, tmp, copy_function=_link_or_copy)
        tmp.rename(paths.final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    return True


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def export_final(paths: RunPaths, step: int) -> Path:
    """The trainer's call after its final checkpoint verified: ``logs/<run>/final/``."""
    opts = ExportOptions(step=step, force=True, verified=True)
    export_run(paths, paths.final, opts)
    return paths.final


# ----------------------------------------------------------------------- command line

EXAMPLES = """examples:
  grpo-export demo-a                      # where the finished run's final/ is (written if missing)
  grpo-export demo-a exported/demo-a      # newest complete checkpoint -> a HF directory
  grpo-export gsm8k-a out/ --step 200 --dtype bf16 --max-shard-size 2GB
  grpo-export lora-a out/adapter --adapter   # a LoRA run's PEFT adapter alone
  grpo-export gsm8k-a out/ --dry-run      # what would be written, and how big

The result loads with AutoModelForCausalLM.from_pretrained(OUT) and
AutoTokenizer.from_pretrained(OUT) (chat template included); grpo-eval OUT scores it.
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
    p.add_argument("--step", type=int, help="checkpoint step (default: newest complete)")
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
    from grpo_hpc.runs import resolve_run

    paths = resolve_run(args.run, logs_root(args.logs, must_exist=False))
    try:
        max_shard = export_plan.parse_size(args.max_shard_size)
    except ValueError as e:
        raise ConfigError(f"--max-shard-size: {e}") from None
    opts = ExportOptions(args.step, args.dtype, args.adapter, max_shard, args.force)
    out = args.out
    if out is None:
        if args.step is not None or args.adapter or args.dtype:
            raise ConfigError("give OUT: final/ holds the final weights in the run's dtype only")
        step = final_step(paths)
        if step is None:
            raise ConfigError(
                f"run {paths.name} has not finished: give OUT to export its newest checkpoint"
            )
        if paths.final.exists() and not args.force:
            prov = read_provenance(paths.final) or {}
            print(f"final model of {paths.name} (step {prov.get('step', '?')}): {paths.final}")
            return ExitCode.OK
        out, opts = paths.final, ExportOptions(step, force=args.force)
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
    if plan.kind != "lora-adapter" and opts.dtype is None and plan.step == final_step(paths):
        if link_final(paths, plan.out):
            print(f"also the run's final model: {paths.final}")
    return ExitCode.OK


def main(argv: list[str] | None = None) -> int:
    """Console entry point ``grpo-export``."""
    return run_cli("grpo-export", lambda: _export(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
