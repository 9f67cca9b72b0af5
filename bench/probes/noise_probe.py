"""Are the native engine's random draws fresh at every decode step and every call?

A random Llama whose LM head is zeroed has exactly uniform next-token probabilities, so
sampled tokens must be i.i.d. uniform: consecutive tokens of a row agree with probability
1/V, and two calls give different completions. Noise that repeats across decode steps or
calls (a CUDA graph replaying the same random numbers) shows as runs of one token and as
identical calls, while every per-token marginal stays right.

    python -m bench.probes.noise_probe [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from grpo_hpc.train.rollout.native.engine import NativeEngine
from grpo_hpc.train.setup.models import LlamaShape, save_random_llama


def probe(engine: NativeEngine, rows: int) -> dict:
    a = engine.generate(["x"], rows)
    b = engine.generate(["x"], rows)
    ids = a.input_ids[:, a.prompt_len :]
    # Pairs of consecutive tokens both before the row's EOS (uniform draws include EOS).
    live = (a.completion_mask[:, 1:] * a.completion_mask[:, :-1]).bool()
    live &= ids[:, 1:] != engine.eos
    live &= ids[:, :-1] != engine.eos
    repeat = (ids[:, 1:] == ids[:, :-1])[live].float().mean().item()
    same_calls = (a.input_ids == b.input_ids).all(1).float().mean().item()
    distinct_rows = len({tuple(r) for r in ids.tolist()}) / rows
    return {
        "consecutive_equal": repeat,
        "rows_same_across_calls": same_calls,
        "distinct_rows": distinct_rows,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = Path(tempfile.mkdtemp()) / "m"
    save_random_llama(d, LlamaShape(64, 2, 4, 2, 128), seed=0)
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).cuda()
    with torch.no_grad():
        model.lm_head.weight.zero_()
    out = {"vocab": len(tok), "expected_consecutive_equal": 1 / len(tok)}
    for name, graphs, comp in (
        ("graphs+compile", True, True),
        ("graphs", True, False),
        ("eager", False, False),
    ):
        e = NativeEngine(
            model,
            tok,
            64,
            1.0,
            1.0,
            600,
            dtype=torch.bfloat16,
            use_graphs=graphs,
            compile=comp,
            compact=True,
        )
        out[name] = probe(e, 64)
        print(name, out[name], flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
