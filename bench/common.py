"""Shared by the benchmarks: model shapes, the random model builder, environment facts,
completion-length summaries and the result writer (``bench/results/<name>.json``).

A shape is a name of ``SHAPES`` (the Qwen2.5 dimensions as a random Llama, as every earlier
result measured them) or of a published config under ``bench/shapes/<name>/config.json``
(every model family of docs/models.md: random weights of that very architecture, as the
trainer's ``random:`` loader builds them)."""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

SHAPES = {
    # hidden, layers, heads, kv_heads, intermediate, vocab
    "smollm2-135m": (576, 30, 9, 3, 1536, 49152),
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151936),
    "qwen2.5-1.5b": (1536, 28, 12, 2, 8960, 151936),
    "qwen2.5-3b": (2048, 36, 16, 2, 11008, 151936),
    "qwen2.5-7b": (3584, 28, 28, 4, 18944, 152064),
    "tiny": (64, 2, 4, 2, 128, 1024),
}
SHAPES_DIR = Path(__file__).parent / "shapes"


def shape_names() -> list[str]:
    """Every shape a benchmark's ``--shape`` takes: ``SHAPES`` and each bench/shapes dir."""
    return sorted(set(SHAPES) | {p.parent.name for p in SHAPES_DIR.glob("*/config.json")})


def shape_dir(shape: str) -> Path | None:
    """``bench/shapes/<shape>`` for a published config outside ``SHAPES``, else None (a
    ``SHAPES`` name keeps its random Llama, so that earlier results stay comparable)."""
    if shape in SHAPES:
        return None
    d = SHAPES_DIR / shape
    if not (d / "config.json").is_file():
        raise ValueError(f"unknown shape {shape!r}: not in SHAPES nor {d}/config.json")
    return d


def build_model(out: Path, shape: str) -> None:
    """A randomly initialised Llama of ``shape`` with a WordLevel tokenizer over its whole
    vocabulary (weights do not change the cost; a random model almost never emits EOS,
    so completions run to the length cap: the worst case). A bench/shapes name: random
    weights of its config.json, saved (fp32) with the char tokenizer."""
    from grpo_hpc.train.setup.models import LlamaShape, save_random_llama

    d = shape_dir(shape)
    if d is not None:
        save_random_config(out, d)
        return
    h, n_layers, heads, kv, inter, vocab = SHAPES[shape]
    save_random_llama(out, LlamaShape(h, n_layers, heads, kv, inter), seed=0, vocab_size=vocab)


def save_random_config(out: Path, config_dir: Path) -> None:
    """Save the trainer's ``random:<config_dir>`` model (fp32, initialised on the GPU when
    there is one: seconds at 8B) and its char tokenizer to ``out``, atomically, for the
    programs that load a directory (TRL, a child ``grpo_step``)."""
    import torch

    from grpo_hpc.train.setup.models import RANDOM, load_model_and_tokenizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, tok = load_model_and_tokenizer(Path(f"{RANDOM}{config_dir}"), "sdpa", device)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    del model
    tmp.rename(out)


def untiny_overrides() -> list[str]:
    """The project's defaults for what ``configs/tiny.yaml`` sets for its CPU smoke runs
    (4 rows per micro-batch, no recompute, one CPU thread). A GPU benchmark that starts
    from the ``tiny`` preset adds these, so that it measures the step a user gets (the
    first GPU step profile missed them and measured 16 micro-batches without recompute)."""
    from grpo_hpc.config.schema import AlgoConfig, ModelConfig, TrainingConfig

    algo, model = AlgoConfig(), ModelConfig()
    return [
        f"algo.micro_batch_size={algo.micro_batch_size}",
        f"model.gradient_checkpointing={str(model.gradient_checkpointing).lower()}",
        f"training.num_threads={TrainingConfig().num_threads}",
    ]


def env_info() -> dict:
    import torch
    import transformers

    cuda = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
        "gpus": torch.cuda.device_count() if cuda else 0,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "date": datetime.date.today().isoformat(),
    }


def length_summary(steps: list[dict], length_key: str, cut_key: str) -> dict:
    """Mean completion length and share cut at the cap over every logged step (pure).
    The warm-up step counts too: lengths are not timed, and more completions make a
    steadier mean. Keys are the logger's own (TRL and grpo_hpc name them differently)."""
    rows = [s for s in steps if length_key in s and cut_key in s]
    if not rows:
        return {"mean_length": None, "cut_share": None, "steps": 0}
    return {
        "mean_length": sum(s[length_key] for s in rows) / len(rows),
        "cut_share": sum(s[cut_key] for s in rows) / len(rows),
        "steps": len(rows),
    }


def write_result(result: dict, out: Path | None) -> None:
    text = json.dumps(result, indent=2)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(text + "\n")
        tmp.rename(out)


TORCHRUN_REPORT = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
"""The line where torchrun's own failure report starts, after everything its ranks wrote."""


def why_failed(stderr: str, progress_line: str | None = None, keep: int = 2500) -> str:
    """What a failed torchrun run's stderr says about the cause: the trainer's own record
    (``progress_line``, e.g. its state, exit code and reason), the end of what the ranks
    wrote before torchrun's report (the trainer's traceback, where it raised), and the
    report's exit-code lines (a signal shows there: ``exitcode: -9``). The report's tail
    alone, which is what the last characters of stderr hold, names no cause."""
    before, found, report = stderr.partition(TORCHRUN_REPORT)
    if found:  # the agent's own traceback, raising the report, is not the cause either
        agent = before.rfind("Traceback (most recent call last):")
        if agent >= 0 and "torch/distributed/run.py" in before[agent:]:
            before = before[:agent]
    codes = [line.strip() for line in report.splitlines() if "exitcode" in line]
    parts = [progress_line] if progress_line else []
    parts.append(before.rstrip()[-keep:])
    parts += codes
    return "\n".join(p for p in parts if p)
