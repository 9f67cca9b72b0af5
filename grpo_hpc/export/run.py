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
:mod:`grpo_hpc.export.plan`; what it reads is :mod:`grpo_hpc.export.sources`'s, the
writing :mod:`grpo_hpc.export.write`'s. This module plans, and is the command line.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from grpo_hpc.config.load import load_resolved
from grpo_hpc.core.best import BestRecord, best_path, read_best, unreadable
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.core.manifest import verify_checkpoint
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState, read_progress
from grpo_hpc.export import plan as export_plan
from grpo_hpc.export.plan import ExportOptions, ExportPlan, TensorSpec
from grpo_hpc.export.sources import (
    BaseWeights,
    CheckpointTensors,
    ExportSources,
    StartTensors,
    base_model_dir,
    load_tokenizer,
)
from grpo_hpc.export.write import write_export

# ----------------------------------------------------------------------- planning


def is_start(step: int | None, all_steps: list[int]) -> bool:
    """Whether ``step`` asks for the model the run started from: step 0, which has no
    checkpoint of its own (pure)."""
    return step == 0 and 0 not in all_steps


def _resolve(paths: RunPaths, opts: ExportOptions, dry_run: bool) -> tuple[int, ExportSources]:
    if not paths.config.is_file():
        raise ConfigError(f"{paths.root} is not a run directory (no config.yaml)")
    cfg = load_resolved(paths.config)
    if is_start(opts.step, paths.checkpoint_steps(complete_only=False)):
        return 0, _start_sources(cfg, paths, opts)
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
    base, hub_id, tokenizer, hf_config = _base(cfg, paths)
    try:
        tensors = CheckpointTensors(paths.checkpoint(step))
    except Exception as e:  # noqa: BLE001 - an unreadable checkpoint is one line
        raise ConfigError(
            f"cannot read checkpoint step-{step} of {paths.name}: {type(e).__name__}: "
            f"{(str(e).splitlines() or [''])[0]} (grpo-ckpt verify {paths.name})"
        ) from None
    return step, ExportSources(cfg, tensors, base, hub_id, tokenizer, hf_config)


def _start_sources(cfg: Any, paths: RunPaths, opts: ExportOptions) -> ExportSources:
    """What an export of the start reads: the run's model directory (a LoRA run's base,
    without adapters: the start had none)."""
    if opts.adapter:
        raise ConfigError("--adapter: the start (step 0) has no adapter; export it without")
    base, hub_id, tokenizer, hf_config = _base(cfg, paths)
    return ExportSources(cfg, StartTensors(base), base, hub_id, tokenizer, hf_config)


def _base(cfg: Any, paths: RunPaths) -> tuple[Any, Any, Any, Any]:
    """The run's base model directory, its hub id, tokenizer and config (one line when its
    config.json cannot be read)."""
    base, hub_id = base_model_dir(cfg, paths)
    tokenizer = load_tokenizer(base)
    from transformers import AutoConfig

    try:
        hf_config = AutoConfig.from_pretrained(base)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"cannot read {base}/config.json: {str(e).splitlines()[0]}") from None
    return base, hub_id, tokenizer, hf_config


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
    if src.cfg.model.lora_rank and not isinstance(src.ckpt, StartTensors):
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


def link_final(paths: RunPaths, exported: Path, to: Path | None = None) -> bool:
    """Give a finished run its ``final/`` (or ``to``) from an export of the same weights
    (hard links, a copy across filesystems), when it has none yet. True when it wrote one."""
    to = to or paths.final
    if to.exists():
        return False
    tmp = to.with_name(f".{to.name}.tmp-{os.getpid()}")
    try:
        shutil.copytree(exported, tmp, copy_function=_link_or_copy)
        tmp.rename(to)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    return True


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def final_steps(
    mode: str, best: BestRecord | None, last: int, complete: list[int]
) -> tuple[int, int | None]:
    """(the step ``final/`` holds, the step ``last/`` holds or None for no ``last/``):
    pure. ``training.final=best`` with a recorded model to hand over that is there: it in
    ``final/`` (step 0: the start, the run's own model directory, when it beat every later
    evaluation), the last step beside it (the same step when they are one); otherwise
    (``last``, no evaluation, its checkpoint gone) ``final/`` is the last step's model, as
    without keep-best."""
    if mode != "best" or best is None:
        return last, None
    if best.step in complete and best.checkpoint:
        return best.step, last
    if best.step == 0 and not best.checkpoint and last > 0:  # the start scored best
        return 0, last
    return last, None


def chosen_final_step(paths: RunPaths) -> int | None:
    """The step a finished run's ``final/`` holds (or would hold), else None."""
    last = final_step(paths)
    if last is None:
        return None
    mode = load_resolved(paths.config).training.final
    return final_steps(mode, read_best(paths.root), last, paths.checkpoint_steps())[0]


def export_final(paths: RunPaths, step: int) -> str:
    """The trainer's call after its final checkpoint (``step``) verified, and grpo-export
    RUN's for a finished run: ``final/`` (the best model, training.final=best) and ``last/``
    beside it. Returns what it wrote, in words."""
    mode = load_resolved(paths.config).training.final
    best = read_best(paths.root)
    final, last = final_steps(mode, best, step, paths.checkpoint_steps())
    # The last step's checkpoint was verified by the trainer; the best's is verified here
    # (the start has none: it is the run's model directory, read again).
    export_run(paths, paths.final, ExportOptions(step=final, force=True, verified=final == step))
    if last is None:
        if mode == "best" and unreadable(paths.root):
            return (
                f"{paths.final} (step {final}, the last: {best_path(paths.root)} is "
                "unreadable, so no evaluation chose another)"
            )
        return f"{paths.final} (step {final}, the last)"
    if last == final:  # the same weights: hard links, no second export
        shutil.rmtree(paths.last, ignore_errors=True)
        link_final(paths, paths.final, paths.last)
    else:
        export_run(paths, paths.last, ExportOptions(step=last, force=True, verified=True))
    assert best is not None
    return f"{paths.final} ({best.why()}); the last step's ({last}) in {paths.last}"


# ----------------------------------------------------------------------- command line
