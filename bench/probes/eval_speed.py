"""Benchmark: held-out evaluation speed of the native engine on GSM8K test prompts.

Evaluation decodes many prompts of many lengths greedily, in chunks of a rollout's rows
(as ``Trainer.evaluate`` does). Per chunk this prints the seconds, the padded prompt
length, the completion lengths, and what the engine had to (re)build so far: KV caches
allocated, CUDA graphs captured, and dynamo graphs compiled. Variants show what each
engine setting costs:

    python -m bench.probes.eval_speed --model DIR --num 512 --chunk 128 --variant reserve
    python -m bench.probes.eval_speed --model DIR --variant grow      # cache sized per chunk

``reserve``: the cache is sized once for the longest prompt (what the trainer does);
``grow``: no reservation (the cache regrows when a chunk's prompts are longer);
``nocompile`` / ``nocompact``: ``reserve`` without torch.compile / row compaction.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from bench.common import env_info, write_result
from grpo_hpc.config.schema import DataConfig
from grpo_hpc.tasks.problems import load_problems, longest_prompt_tokens, prompt_text
from grpo_hpc.train.rollout.native.engine import NativeEngine
from grpo_hpc.train.setup.models import load_model_and_tokenizer

VARIANTS = {
    "reserve": {},
    "grow": {"reserve": False},
    "nocompile": {"compile": False},
    "nocompact": {"compact": False},
}


def compiled_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def run(args: argparse.Namespace) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model, tok = load_model_and_tokenizer(args.model, "sdpa", device)
    model.eval()
    _, test = load_problems(DataConfig(source="gsm8k", num_train=1, num_eval=args.num), seed=0)
    prompts = [prompt_text(tok, p["question"]) for p in test]
    opts = dict(VARIANTS[args.variant])
    reserve = opts.pop("reserve", True)
    longest = longest_prompt_tokens(tok, test) if reserve else 0
    engine = NativeEngine(
        model, tok, args.max_new, 1.0, 1.0, 3600, dtype=dtype, max_prompt_tokens=longest, **opts
    )
    chunks, t_all = [], time.perf_counter()
    for i in range(0, len(prompts), args.chunk):
        part = prompts[i : i + args.chunk]
        t = time.perf_counter()
        out = engine.generate(part, 1, greedy=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        lengths = out.completion_mask.sum(1).tolist()
        row = {
            "chunk": i // args.chunk,
            "s": round(time.perf_counter() - t, 2),
            "prompt_len": out.prompt_len,
            "mean_len": round(statistics.mean(lengths), 1),
            "max_len": max(lengths),
            **engine.totals,
            "compiled_graphs": compiled_graphs(),
        }
        print(json.dumps(row), flush=True)
        chunks.append(row)
    return {
        "benchmark": "eval_speed",
        "variant": args.variant,
        "model": str(args.model),
        "num": len(prompts),
        "chunk": args.chunk,
        "max_new": args.max_new,
        "reserved_prompt_tokens": longest,
        "total_s": round(time.perf_counter() - t_all, 1),
        "chunks": chunks,
        "env": env_info(),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", type=Path, required=True, help="a real model directory")
    p.add_argument("--num", type=int, default=512, help="GSM8K test prompts (default 512)")
    p.add_argument("--chunk", type=int, default=128, help="prompts per generate (default 128)")
    p.add_argument("--max-new", type=int, default=512)
    p.add_argument("--variant", choices=sorted(VARIANTS), default="reserve")
    p.add_argument("--out", type=Path, help="write the result JSON here")
    args = p.parse_args()
    result = run(args)
    print(f"{args.variant}: {result['total_s']} s for {result['num']} prompts")
    write_result(result, args.out)


if __name__ == "__main__":
    main()
