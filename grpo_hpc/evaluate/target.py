"""What grpo-eval scores and how it runs it: the model directory behind a name (a model
directory, or a run's checkpoint exported in fp32 into scratch), and the numerics its
trainer used (:func:`numerics_for`). Split from :mod:`grpo_hpc.evaluate.local`, which loads the
data, generates and judges."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_hpc.config.load import load_resolved
from grpo_hpc.config.schema import Config
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.core.paths import RunPaths, logs_root
from grpo_hpc.export.plan import RUN_CONFIG, ExportOptions, read_provenance


@dataclass
class Target:
    """The model to score and the settings it is judged with."""

    model_dir: Path
    """A Hugging Face directory."""
    label: str
    """How the result names it (run@step, or the directory)."""
    cfg: Config | None
    """The run's config (a run, or an export that carries grpo_hpc_config.yaml); None for
    a model that is not ours (defaults)."""
    run: str | None = None
    """Run name, when known."""
    step: int | None = None
    """Checkpoint step, when known."""
    world: int = 1
    """Processes of the attempt that saved the checkpoint: the trainer's evaluation split
    the held-out problems over them (its batches are replayed, see evaluate)."""


def refuse_missing_model_dir(name: str) -> None:
    """A MODEL_OR_RUN with a slash is a path (a model directory, or a run's directory): one
    that does not exist is said to be missing, rather than refused as no valid run name."""
    if "/" not in name or Path(name).expanduser().exists():
        return
    raise ConfigError(
        f"{name!r} does not exist: give a Hugging Face model directory (with config.json, "
        "e.g. what grpo-export wrote), a run's directory, or a run's name (grpo-status lists them)"
    )


def resolve_target(name: str, step: int | None, logs: Path | None, scratch: Path) -> Target:
    """A model directory, or a run whose checkpoint is exported into ``scratch`` (its
    final/ is used when it holds the step asked for)."""
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        if step is not None:
            raise ConfigError("--step is for a run: MODEL is a model directory already")
        cfg = load_resolved(path / RUN_CONFIG) if (path / RUN_CONFIG).is_file() else None
        prov = read_provenance(path) or {}
        if prov.get("kind") == "lora-adapter":
            raise ConfigError(f"{path} is a LoRA adapter alone: score the merged export")
        world = _world(prov, cfg)
        return Target(path.resolve(), str(path), cfg, prov.get("run"), prov.get("step"), world)
    from grpo_hpc.core.runs import resolve_run
    from grpo_hpc.export import run as export

    refuse_missing_model_dir(name)
    paths: RunPaths = resolve_run(name, logs_root(logs))
    if not paths.config.is_file():
        raise ConfigError(f"{name!r} is neither a model directory (config.json) nor a run")
    cfg = load_resolved(paths.config)
    prov = read_provenance(paths.final) or {}
    newest = paths.latest_checkpoint()
    # The trainer holds fp32 master weights (bf16/fp16 is autocast's compute dtype): a run
    # is scored from them, its final/ only when that is an fp32 export of the step asked for.
    if prov.get("step") is not None and prov.get("step") == (step or newest):
        if prov.get("dtype") == "float32":
            label = f"{paths.name}@{prov['step']}"
            return Target(paths.final, label, cfg, paths.name, prov["step"], _world(prov, cfg))
    out = scratch / "model"
    plan = export.export_run(paths, out, ExportOptions(step=step, dtype="fp32"))
    world = _world(read_provenance(out) or {}, cfg)
    return Target(out, f"{paths.name}@{plan.step}", cfg, paths.name, plan.step, world)


def _world(prov: dict[str, Any], cfg: Config | None) -> int:
    """The evaluating trainer's process count: the checkpoint's, as the export recorded it
    (an export written before it did: the run's processes per node)."""
    world = prov.get("world_size")
    if isinstance(world, int) and world >= 1:
        return world
    return cfg.dist.nproc_per_node if cfg is not None else 1


PRECISION_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class Numerics:
    """How the model is loaded and run (pure data; :func:`numerics_for` decides)."""

    device: str
    """cuda or cpu."""
    load_dtype: str
    """torch dtype name the weights are loaded in."""
    compute_dtype: str
    """The engine's dtype (its packed weights, activations, cache) and, when it is bf16 or
    fp16 on a GPU, autocast's (HF ``generate`` runs under it, as the trainer's does)."""
    engine: str
    """rollout.engine name (auto, native, hf)."""

    @property
    def autocast(self) -> bool:
        return self.device == "cuda" and self.compute_dtype != "float32"


def numerics_for(cfg: Config | None, cuda: bool) -> Numerics:
    """The trainer's numerics for a model of one of our runs: fp32 weights (its master
    copy; a bf16 export is upcast exactly; a LoRA run's in the compute dtype, as its base),
    the run's precision as the engine's dtype and autocast's, the run's rollout engine. A
    model that is not ours: bf16 on a GPU. On a CPU everything is fp32, as the trainer's is
    (it refuses bf16 without a GPU)."""
    engine = cfg.rollout.engine if cfg is not None else "auto"
    if not cuda:
        return Numerics("cpu", "float32", "float32", engine)
    if cfg is None:
        return Numerics("cuda", "bfloat16", "bfloat16", engine)
    compute = PRECISION_DTYPES[cfg.dist.precision]
    # A LoRA run's trainer holds its frozen base in the compute dtype (no fp32 master copy):
    # its merged model is loaded so too (norms as the trainer's; half the memory).
    return Numerics("cuda", compute if cfg.model.lora_rank else "float32", compute, engine)
