"""The ladder's rows as the estimator plans them: the shapes and budgets, each row's
memory settings, and the estimator's plan on one GPU and on the budget's 2-GPU profile
(``python -m bench.memory.ladder``, :mod:`bench.memory.ladder`)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from pathlib import Path

from bench.common import env_info

HERE = Path(__file__).resolve().parents[1]
"""bench/"""
SHAPES_DIR = HERE / "shapes"
SHAPES = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b")
"""The ladder's default rows: the shapes its committed results and the estimator's
calibration hold (bench/results/ladder_h100_2026-11-26.json)."""
FAMILY_SHAPES = (
    "qwen3-1.7b",
    "llama-3.2-1b",
    "llama-3.2-3b",
    "gemma-3-1b",
    "phi-4-mini",
    "olmo-2-1b",
    "smollm3-3b",
    "ministral-8b",
)
"""One shape per supported model family between 1B and 4B (Mistral's smallest published one is
Ministral 8B: the rows the estimator says cannot fit are recorded so, not run), for the
estimate-against-measured rows of docs/models.md: ``--shapes families``. Not measured yet."""
BUDGETS = {
    # name: (precision, cap GiB, 2-GPU profile)
    "h100": ("bf16", 80.0, "h100x2"),
    "supercloud": ("fp16", 32.0, "supercloud"),
}
MODES = ("full", "lora")
LORA_RANK = 16
PEAK_FLOPS = 989e12
"""H100/H200 SXM dense bf16/fp16 tensor-core peak (the fp16 rows run on the same chips)."""
DECODE_BW = {"H100": (2.99e12, "measured copy bandwidth, bench/results/LOG.md"),
             "H200": (4.8e12, "nominal HBM3e bandwidth, not measured here")}  # fmt: skip
"""Memory bandwidth behind the decode roofline, by chip (the row's device name)."""


@functools.cache
def decode_bw() -> tuple[float, str]:
    """(bytes/s, where the figure comes from) for this machine's GPU."""
    device = env_info()["device"]
    return next((v for k, v in DECODE_BW.items() if k in device), DECODE_BW["H100"])


def load_shape(name: str):  # noqa: ANN201
    from grpo_hpc.memory import estimate as memory

    config = json.loads((SHAPES_DIR / name / "config.json").read_text())
    return memory.ModelShape.from_config(config)


@functools.cache
def prompt_tokens(vocab: int) -> int:
    """Longest prompt of the first step, as the trainer builds it (char tokenizer)."""
    from grpo_hpc.config.schema import DataConfig
    from grpo_hpc.tasks import problems as data
    from grpo_hpc.train.setup.models import char_tokenizer

    tok = char_tokenizer(vocab)
    problems = data.arithmetic_problems(64, DataConfig(), 0)
    return max(len(tok(data.prompt_text(tok, p["question"])).input_ids) for p in problems)


@functools.cache
def _capability(device: str) -> tuple[int, int]:
    """The compute capability the rows' decisions are made for: the GPU's, or the one
    ``GRPO_HPC_EMULATE_GPU`` emulates (the trainer asks the same function); (0, 0) on a CPU."""
    if device != "cuda":
        return (0, 0)
    import torch

    from grpo_hpc.train.distributed import gpu

    return gpu.capability(torch.device("cuda"))


def settings(args: argparse.Namespace, budget: str, mode: str, prompt: int, ranks: int = 1):  # noqa: ANN201
    """A row's memory settings before the plan: as the trainer will resolve ``dist.compile``
    (``auto``) on the GPU the ladder runs on. The supercloud budget caps an H100 at a V100's
    32 GiB but keeps the H100's kernels, so its full-parameter rows run compiled and packed
    where a V100 would run eager (grpo-submit's estimate for that profile assumes eager
    layers, which keep more for backward: the safe side), unless the ladder runs under
    ``GRPO_HPC_EMULATE_GPU=7.0:32``: then the plan and the trainer both decide as for a
    V100 (eager, unpacked)."""
    from grpo_hpc.config import speed
    from grpo_hpc.memory import estimate as memory

    precision = "fp32" if args.device == "cpu" else BUDGETS[budget][0]
    where = speed.Where(
        cuda=args.device == "cuda",
        capability=_capability(args.device),
        precision=precision,
        lora=mode == "lora",
        varlen=True,
    )
    return memory.Settings(
        compiled_layers=speed.compile_on(speed.AUTO, where),
        ranks=ranks,
        strategy="ddp",
        precision=precision,
        rows=args.prompts * args.G,
        prompt_tokens=prompt,
        max_new_tokens=args.max_new,
        micro_batch_size=args.prompts * args.G,
        micro_batch_tokens=args.micro_tokens,
        lora_rank=LORA_RANK if mode == "lora" else 0,
    )


def estimates(args: argparse.Namespace, name: str, budget: str, mode: str) -> dict:
    """The estimator's plan for one GPU under the cap, and for the budget's 2-GPU profile."""
    from grpo_hpc.config.profiles import load_profile
    from grpo_hpc.memory import fit as memory_fit

    shape = load_shape(name)
    prompt = prompt_tokens(shape.vocab)
    cap = BUDGETS[budget][1]
    one = memory_fit.fit(shape, settings(args, budget, mode, prompt), cap)
    prof = load_profile(BUDGETS[budget][2])
    two_s = settings(args, budget, mode, prompt, ranks=2)
    two = memory_fit.fit(
        shape, dataclasses.replace(two_s, strategy=prof.strategy), cap, prof.allow_cpu_offload
    )

    def view(p: memory_fit.Plan) -> dict:
        e = p.estimate
        return {
            "fits": p.fits,
            "settings": p.settings.describe(),
            "changed": list(p.changed),
            "peak_gib": round(e.peak_gib, 2),
            "total_gib": round(e.total_gib, 2),
            "phase": e.peak_phase,
            "breakdown_gib": e.breakdown(),
        }

    return {"prompt_tokens": prompt, 1: one, 2: two, "gpu1": view(one), "gpu2": view(two)}
