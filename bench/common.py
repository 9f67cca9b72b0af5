"""Shared by the benchmarks: model shapes, the random model builder, environment facts,
completion-length summaries and the result writer (``bench/results/<name>.json``)."""

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


def build_model(out: Path, shape: str) -> None:
    """A randomly initialised Llama of ``shape`` with a WordLevel tokenizer over its whole
    vocabulary (weights do not change the cost; a random model almost never emits EOS,
    so completions run to the length cap: the worst case)."""
    from grpo_hpc.train.setup.models import LlamaShape, save_random_llama

    h, n_layers, heads, kv, inter, vocab = SHAPES[shape]
    save_random_llama(out, LlamaShape(h, n_layers, heads, kv, inter), seed=0, vocab_size=vocab)


def untiny_overrides() -> list[str]:
    """The project's defaults for what ``configs/tiny.yaml`` sets for its CPU smoke runs
    (4 rows per micro-batch, no recompute, one CPU thread). A GPU benchmark that starts
    from the ``tiny`` preset adds these, so that it measures the step a user gets (the
    first issue-24 profile missed them and measured 16 micro-batches without recompute)."""
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
