"""Writing a planned export (:class:`~grpo_hpc.export.plan.ExportPlan`): the tensors
streamed in plan order (a LoRA run's merged on the fly), cast and written a shard at a
time, then config, generation config, tokenizer, the run's config and the provenance file;
all of it into a temporary sibling of OUT that is renamed into place.

The planning and the command line are :mod:`grpo_hpc.export.run`'s; this module decides
nothing, it writes what the plan says.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from grpo_hpc import __version__
from grpo_hpc.config.load import to_yaml
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.core.manifest import read_manifest
from grpo_hpc.export import plan as export_plan
from grpo_hpc.export.plan import PROVENANCE, RUN_CONFIG, ExportPlan
from grpo_hpc.export.sources import BaseWeights, ExportSources


def _tensors(plan: ExportPlan, src: ExportSources) -> Iterator[tuple[str, Any]]:
    """(name, tensor in the export dtype) in plan order, one read at a time."""
    import torch

    dtype = getattr(torch, plan.dtype)
    if plan.kind == "full":
        by_name = {export_plan.hf_name(k): k for k in src.ckpt.keys()}
        for shard in plan.shards:
            for t in shard:
                yield t.name, src.ckpt.read(by_name[t.name]).to(dtype).contiguous()
        return
    pairs, others = export_plan.lora_pairs(src.ckpt.keys())
    if plan.kind == "lora-adapter":
        by_name = {export_plan.adapter_key(k): k for p in pairs for k in (p.a_key, p.b_key)}
        for shard in plan.shards:
            for t in shard:
                yield t.name, src.ckpt.read(by_name[t.name]).to(dtype).contiguous()
        return
    lora = src.cfg.model
    scale = export_plan.lora_scaling(lora.lora_rank, lora.lora_alpha)
    by_weight = {f"{p.module}.weight": p for p in pairs}
    overrides = {export_plan.hf_name(k): k for k in others}  # trained non-LoRA weights
    base = BaseWeights(src.base)
    for shard in plan.shards:
        for t in shard:
            w = src.ckpt.read(overrides[t.name]) if t.name in overrides else base.read(t.name)
            pair = by_weight.get(t.name)
            if pair is not None:
                a = src.ckpt.read(pair.a_key).float()
                b = src.ckpt.read(pair.b_key).float()
                w = w.float() + scale * (b @ a)
            yield t.name, w.to(dtype).contiguous()


def _write_weights(plan: ExportPlan, src: ExportSources, tmp: Path) -> None:
    from safetensors.torch import save_file

    stream = _tensors(plan, src)
    for name, shard in zip(plan.files, plan.shards, strict=True):
        tensors = dict(next(stream) for _ in shard)
        save_file(tensors, str(tmp / name), metadata={"format": "pt"})
        del tensors  # one shard in memory at a time
    if len(plan.files) > 1:
        index = export_plan.index_json(plan.shards, plan.files)
        (tmp / export_plan.INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def _write_metadata(plan: ExportPlan, src: ExportSources, tmp: Path) -> None:
    cfg = src.cfg
    if plan.kind == "lora-adapter":
        from peft import LoraConfig

        LoraConfig(
            r=cfg.model.lora_rank,
            lora_alpha=cfg.model.lora_alpha,
            target_modules=list(cfg.model.lora_target_modules),
            task_type="CAUSAL_LM",
            base_model_name_or_path=export_plan.adapter_base(src.base, src.base_hub_id),
        ).save_pretrained(str(tmp))
    else:
        from transformers import GenerationConfig

        hf_config = src.hf_config
        hf_config.dtype = plan.dtype
        hf_config.save_pretrained(tmp)
        try:
            gen = GenerationConfig.from_pretrained(src.base)
        except OSError:
            gen = GenerationConfig.from_model_config(hf_config)
        gen.max_new_tokens = cfg.rollout.max_new_tokens  # the length the run trained for
        gen.save_pretrained(tmp)
    src.tokenizer.save_pretrained(tmp)
    (tmp / RUN_CONFIG).write_text(to_yaml(cfg), encoding="utf-8")
    provenance = {
        "run": plan.run,
        "step": plan.step,
        "checkpoint": str(plan.checkpoint),
        "format": plan.format,
        "kind": plan.kind,
        "dtype": plan.dtype,
        # The processes that saved it: grpo-eval replays their held-out batches.
        "world_size": (read_manifest(plan.checkpoint) or {}).get("world_size"),
        "base_model": cfg.model.name_or_path,
        "grpo_hpc_version": __version__,
        "time": time.time(),
    }
    (tmp / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")


def write_export(plan: ExportPlan, src: ExportSources, force: bool) -> Path:
    """Write the plan into a temporary sibling of OUT, then rename it into place (the old
    OUT, with ``force``, is moved aside first and deleted after)."""
    out = plan.out
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _write_weights(plan, src, tmp)
        _write_metadata(plan, src, tmp)
        if out.exists():
            if not force:  # appeared while we wrote
                raise ConfigError(f"{out} exists: pass --force to replace it")
            out.rename(old)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not out.exists():
            old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return out
