"""What ``grpo-export`` reads, one tensor at a time: a checkpoint's model tensors (gathered
``model.pt`` memory-mapped, or the ``model.*`` entries of a DCP directory, never the
optimizer's) and, for a LoRA run, the base model's safetensors; where the run's base model
and tokenizer are."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_hpc.config.schema import Config
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.export import plan as export_plan


class CheckpointTensors:
    """The model tensors of one checkpoint, listed without reading them and read one at a
    time: ``model.pt`` memory-mapped, or the ``model.*`` entries of a DCP directory (never
    its ``optim.*``), read in this process without a process group."""

    def __init__(self, ckpt: Path) -> None:
        from grpo_hpc.train.state.checkpoint import DCP_DIR, SHARDED, format_of

        self.ckpt, self.format = ckpt, format_of(ckpt)
        self.dcp_dir = ckpt / DCP_DIR
        if self.format == SHARDED:
            self._meta = self._dcp_entries()
        else:
            import torch

            model_pt = ckpt / "model.pt"
            self._sd = torch.load(model_pt, map_location="cpu", mmap=True, weights_only=True)
            self._meta = {k: (tuple(v.shape), v.dtype) for k, v in self._sd.items()}

    def _dcp_entries(self) -> dict[str, tuple[tuple[int, ...], Any]]:
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        meta = FileSystemReader(str(self.dcp_dir)).read_metadata()
        out = {}
        for key, md in meta.state_dict_metadata.items():
            if key.startswith("model.") and isinstance(md, TensorStorageMetadata):
                out[key[len("model.") :]] = (tuple(md.size), md.properties.dtype)
        return out

    def keys(self) -> list[str]:
        return list(self._meta)

    def shape(self, key: str) -> tuple[int, ...]:
        return self._meta[key][0]

    def read(self, key: str) -> Any:
        """One tensor on the CPU in its saved dtype."""
        if self.format != "sharded":
            return self._sd[key]
        import torch
        import torch.distributed.checkpoint as dcp

        shape, dtype = self._meta[key]
        target = {"model": {key: torch.empty(shape, dtype=dtype)}}
        with warnings.catch_warnings():  # "assuming ... a single process": that is the intent
            warnings.simplefilter("ignore", UserWarning)
            reader = dcp.FileSystemReader(str(self.dcp_dir))
            dcp.load(target, storage_reader=reader, no_dist=True)
        return target["model"][key]


class BaseWeights:
    """The safetensors weights of the run's base model directory, read one at a time."""

    def __init__(self, model_dir: Path) -> None:
        from safetensors import safe_open

        index = model_dir / export_plan.INDEX_FILE
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        elif (model_dir / export_plan.SINGLE_FILE).is_file():
            with safe_open(model_dir / export_plan.SINGLE_FILE, "pt") as f:
                weight_map = {k: export_plan.SINGLE_FILE for k in f.keys()}  # noqa: SIM118
        else:
            raise ConfigError(
                f"the LoRA run's base model {model_dir} has no safetensors weights: merging "
                "needs them (export the adapter alone with --adapter)"
            )
        self.dir, self.weight_map = model_dir, weight_map

    def keys(self) -> list[str]:
        return list(self.weight_map)

    def read(self, key: str) -> Any:
        from safetensors import safe_open

        with safe_open(self.dir / self.weight_map[key], "pt") as f:
            return f.get_tensor(key)

    def shape(self, key: str) -> tuple[int, ...]:
        from safetensors import safe_open

        with safe_open(self.dir / self.weight_map[key], "pt") as f:
            return tuple(f.get_slice(key).get_shape())

    def numel(self, key: str) -> int:
        n = 1
        for d in self.shape(key):
            n *= d
        return n


class StartTensors:
    """The model a run started from, read as an export reads a checkpoint: the run's model
    directory's safetensors (a LoRA run's base, without adapters: the start had none).
    What ``final/`` holds when the start beat every later evaluation."""

    format = "start"
    """The provenance's ``format``: no checkpoint, the run's model directory."""

    def __init__(self, base: Path) -> None:
        self.ckpt = base
        """Where the weights are read from (the provenance's ``checkpoint``)."""
        self.weights = BaseWeights(base)

    def keys(self) -> list[str]:
        return self.weights.keys()

    def shape(self, key: str) -> tuple[int, ...]:
        return self.weights.shape(key)

    def read(self, key: str) -> Any:
        """One tensor on the CPU in its saved dtype."""
        return self.weights.read(key)


# ----------------------------------------------------------------------- the run's model


@dataclass
class ExportSources:
    """What one export reads, opened once by the planning and read again by the writing."""

    cfg: Config
    """The run's resolved config."""
    ckpt: CheckpointTensors | StartTensors
    """The checkpoint's model tensors (or the start's: the run's model directory)."""
    base: Path
    """The model directory the run started from."""
    base_hub_id: str | None
    """The hub id ``base`` is the cached snapshot of; None for a local or built-in model."""
    tokenizer: Any
    """The run's tokenizer (with its chat template)."""
    hf_config: Any
    """The base model's transformers config."""


def base_model_dir(cfg: Config, paths: RunPaths) -> tuple[Path, str | None]:
    """The model directory the run was built from, and the hub id when that directory is a
    hub model's snapshot in the local cache (a ConfigError when it is gone)."""
    from grpo_hpc.train.setup import models

    name = cfg.model.name_or_path
    if name == "tiny":
        d = paths.tiny_model
        if not (d / "config.json").is_file():
            raise ConfigError(
                f"the run's tiny model directory {d} is missing: the run never started, "
                "or its directory was cleaned"
            )
        return d, None
    if name.startswith(models.RANDOM):
        raise ConfigError(
            f"model {name!r} is a random benchmark shape with no tokenizer: nothing to export"
        )
    d = models.materialize(cfg.model, paths.root, cfg.training.seed)
    if d.is_dir():
        return d, None
    try:  # a hub id: the snapshot in the local Hugging Face cache (or fetched, when online)
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(d))), name
    except Exception as e:  # noqa: BLE001 - any hub/cache failure is one line here
        raise ConfigError(
            f"cannot find the run's base model {name!r}: {str(e).splitlines()[0]} "
            f"(hf download {name} on a node with internet)"
        ) from None


def load_tokenizer(base: Path) -> Any:
    """The run's tokenizer (with its chat template); a ConfigError line when it is broken."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(base)
    except Exception as e:  # noqa: BLE001 - missing/broken tokenizer files: one line
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise ConfigError(
            f"cannot load the tokenizer of the run's model {base}: {first} (the export "
            "needs it; restore the model directory)"
        ) from None
