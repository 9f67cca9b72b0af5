"""Benchmark: rollout decode speed of each engine, its fraction of the memory roofline,
and the native engine's agreement with HF ``generate`` and with a plain forward pass.

Roofline (memory-bound decode): one decode step must read every weight once (the tied
embedding/LM head once) plus the K/V of every filled cache slot; so

    roofline tok/s = batch / ((weight_bytes + kv_bytes_per_step) / HBM bandwidth)

with kv_bytes_per_step averaged over the completion (prompt + t slots at step t) and the
bandwidth measured here (device-to-device copy, bytes read + written).

    python -m bench.decode --shape qwen2.5-0.5b --batch 64 256 --out bench/results/decode.json

Real lengths: ``--model DIR --prompts gsm8k`` decodes the real model on GSM8K questions
(the trainer's prompt, sampled at temperature 1): rows end at EOS at very different
steps. ``tok_per_s`` counts useful tokens (up to and including each row's EOS);
``row_steps`` is the decode work (rows in the batch, summed over steps). Engine
``native-nocompact`` is the same engine decoding every row to the end, so

    python -m bench.decode --model DIR --prompts gsm8k --batch 64 256 --max-new 512 \
        --engines native native-nocompact

shows finished-row compaction before and after in one run (same seeds: same tokens).

Model families (docs/models.md): ``--shape`` takes any bench/shapes name too (qwen3-1.7b,
llama-3.2-1b, gemma-3-1b, phi-4-mini, olmo-2-1b, smollm3-3b, ministral-8b, ...), and
``--shape-dir DIR`` any directory with a config.json (tests/fixtures/families/<family> for
a CPU dry run): random weights of that config built as the trainer's ``random:DIR`` loader
builds them, in the compute dtype (bf16 on a GPU), on the device. One run gives the
native engine's and HF ``generate``'s tok/s (``--hf-reps`` keeps HF's slow rollouts few)
and the bf16 agreement at full size:

    python -m bench.decode --shape qwen3-1.7b --batch 64 --max-new 256 --engines native hf \
        --hf-reps 1 --prompts 32 --agree-new 128 --out bench/results/x.json

``--init varied`` (the default for these shapes) re-draws the weights as the CPU family
test does (tests/unit/train/rollout/test_native_families.py): at HF's default init a
random model's greedy text is one token repeated, and agreement on it would prove little.
Every matrix ~ N(0, 0.3) (Gemma: 0.02, its embeddings are scaled by sqrt(hidden)), norm
weights ~ N(1, 0.3) (Gemma, which scales by 1 + w: N(0, 2)), the EOS row of the head zero
(no row ends early: every rollout runs to the cap). ``--init default`` keeps HF's init.
``--init scaled`` (what ``bench/gpu.sh families`` runs) is the same recipe with each
matrix's std times sqrt(64 / its input width): the recipe was drawn for the 64-wide
fixtures, and at full width it makes activations so large that bf16 itself is noise (on
an H100 at Qwen3-1.7B: HF's own bf16 forward off fp32 by ~3 logits with ``varied``,
~0.55 with ``scaled``; both give 125-128 distinct tokens in 128, ``default`` gave Qwen3-0.6B
3 distinct in 24 on the CPU).

Agreement: bench/decode/agreement.py (``agreement``, ``exact_check``), which says how a
first difference is judged (a near-tie, within bf16 error).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.common import build_model, env_info, shape_dir, shape_names, write_result
from bench.decode.agreement import agreement, agreement_line, vary_init
from grpo_hpc.config.schema import DataConfig
from grpo_hpc.tasks.problems import load_problems, prompt_text
from grpo_hpc.train.rollout.engines import HFEngine
from grpo_hpc.train.rollout.native.engine import NativeEngine
from grpo_hpc.train.rollout.native.forward import DecodeFns
from grpo_hpc.train.rollout.native.sampling import pick
from grpo_hpc.train.setup.models import RANDOM, load_model_and_tokenizer

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def hbm_bandwidth(device: torch.device) -> float:
    """Bytes/s of a large device-to-device copy (read + write counted)."""
    if device.type != "cuda":
        return float("nan")
    x = torch.empty(2**30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    return 2 * x.numel() * 10 / (time.perf_counter() - t)


def roofline(model: torch.nn.Module, batch: int, prompt: int, new: int, bw: float) -> float:
    """Sliding-window layers (``config.layer_types``) read at most a window of slots;
    ``head_dim`` is the config's where it sets one (Qwen3, Gemma 3)."""
    cfg = model.config
    weight_bytes = sum(p.numel() for p in model.parameters()) * 2  # bf16; tied head once
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    slots = prompt + new / 2
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    layer_slots = sum(
        min(slots, window) if t == "sliding_attention" and window else slots for t in types
    )
    kv_bytes = batch * 2 * cfg.num_key_value_heads * head_dim * 2 * layer_slots
    return batch / ((weight_bytes + kv_bytes) / bw)


ENGINES = {
    "native": {},
    "native-nocompact": {"compact": False},
    "native-eager": {"compile": False},
    "native-eagerpick": {},  # compiled layers, the token choice eager (uncompiled pick)
    "native-autotune": {},  # compiled with mode=max-autotune-no-cudagraphs (GEMM autotuning)
    "native-plainattn": {},  # compiled, attention by matrix products (no Triton kernel)
    "hf": {},
}


def make_engine(name: str, model, tok, max_new: int, dtype: torch.dtype):  # noqa: ANN001, ANN201
    """One engine of ``ENGINES`` (T = 1, top-p 1)."""
    if name == "hf":
        low = dtype != torch.float32
        dev = next(model.parameters()).device.type

        def autocast():  # noqa: ANN202
            return torch.autocast(dev, dtype=dtype, enabled=low)

        return HFEngine(model, tok, max_new, 1.0, 1.0, 3600, autocast=autocast)
    engine = NativeEngine(model, tok, max_new, 1.0, 1.0, 3600, dtype=dtype, **ENGINES[name])
    if name == "native-eagerpick":
        engine.fns = dataclasses.replace(engine.fns, pick=pick)
    if name == "native-autotune":
        engine.fns = DecodeFns.compiled(mode="max-autotune-no-cudagraphs")
    if name == "native-plainattn":
        engine.fns = DecodeFns.compiled(fused_attention=False)
    return engine


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_engine(engine, prompts: list[str], batch: int, reps: int, device) -> dict:  # noqa: ANN001
    """Median of ``reps`` rollouts after a warm-up; rollout ``r`` is seeded with ``r`` so
    that engines that sample alike produce the same completions."""
    g = batch // len(prompts)
    torch.manual_seed(1000)
    engine.generate(prompts, g)  # warm-up: graph capture, allocator
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, tokens, row_steps, lengths = [], [], [], []
    for r in range(reps):
        torch.manual_seed(r)
        t = time.perf_counter()
        out = engine.generate(prompts, g)
        sync(device)
        times.append(time.perf_counter() - t)
        tokens.append(out.num_tokens)
        lengths += out.completion_mask.sum(1).tolist()
        row_steps.append(getattr(engine, "stats", {}).get("row_steps"))
    med = statistics.median(times)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    return {
        "s_per_rollout": med,
        "tok_per_s": statistics.median(tokens) / med,
        "peak_gib": peak,
        "mean_len": statistics.mean(lengths),
        "max_len": max(lengths),
        "row_steps": row_steps,
        "s_all": times,
    }


def gsm8k_prompts(tok, n: int) -> list[str]:  # noqa: ANN001
    """The first ``n`` GSM8K training questions as the trainer prompts them."""
    train, _ = load_problems(DataConfig(source="gsm8k", num_train=n, num_eval=0), seed=0)
    return [prompt_text(tok, p["question"]) for p in train]


def load_shape(args: argparse.Namespace, d: str, device, dtype):  # noqa: ANN001, ANN201
    """The model and tokenizer ``args`` name: a real ``--model``, a bench/shapes config or
    ``--shape-dir`` (random, in ``dtype``, on ``device``; ``--init varied`` re-draws it),
    or a ``SHAPES`` Llama (built, saved, loaded in fp32 as before)."""
    config_dir = args.shape_dir or (None if args.model else shape_dir(args.shape))
    if config_dir is None:
        if args.model is None:
            build_model(Path(d) / "m", args.shape)
        return load_model_and_tokenizer(args.model or Path(d) / "m", "sdpa", device)
    model, tok = load_model_and_tokenizer(Path(f"{RANDOM}{config_dir}"), "sdpa", device, dtype)
    if args.init != "default":
        vary_init(model, tok.eos_token_id, scaled=args.init == "scaled")
    return model, tok


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shape", choices=shape_names(), default="qwen2.5-0.5b")
    p.add_argument(
        "--shape-dir", type=Path, help="random weights of DIR/config.json instead of --shape"
    )
    p.add_argument(
        "--init",
        choices=["varied", "scaled", "default"],
        default="varied",
        help="a config's random weights: the CPU family test's (tokens vary) or HF's init",
    )
    p.add_argument("--precision", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    p.add_argument(
        "--prompts",
        default="8",
        help="N synthetic prompts, or 'gsm8k' (GSM8K questions; --distinct of them)",
    )
    p.add_argument("--distinct", type=int, default=8, help="GSM8K prompts per rollout")
    p.add_argument("--max-new", type=int, default=256)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--hf-reps", type=int, help="timed HF generate rollouts (default --reps)")
    p.add_argument("--agree-new", type=int, default=64, help="greedy tokens compared")
    p.add_argument("--agree-rows", type=int, default=16, help="greedy rows compared")
    p.add_argument(
        "--engines",
        nargs="+",
        default=["native", "hf"],
        choices=list(ENGINES),
    )
    p.add_argument("--no-agreement", action="store_true", help="skip the agreement checks")
    p.add_argument("--model", type=Path, help="a real model directory instead of --shape")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = DTYPES[args.precision] if device.type == "cuda" else torch.float32
    with tempfile.TemporaryDirectory() as d:
        model, tok = load_shape(args, d, device, dtype)
    model.eval()
    random_config = args.shape_dir or (None if args.model else shape_dir(args.shape))
    if random_config is not None:
        params = sum(p.numel() for p in model.parameters()) / 1e9
        init = {
            "varied": "re-drawn as tests/unit/train/rollout/test_native_families.py does "
            "(tokens vary)",
            "scaled": "re-drawn as tests/unit/train/rollout/test_native_families.py does, "
            "each matrix's std times sqrt(64 / its input width) (tokens vary)",
            "default": "HF's default",
        }[args.init]
        print(
            f"model: random {model.config.model_type} of {random_config}/config.json, "
            f"{params:.2f}B parameters in {next(model.parameters()).dtype} on {device}; "
            f"init {init}",
            flush=True,
        )
    low = dtype != torch.float32

    def autocast():  # noqa: ANN202
        return torch.autocast(device.type, dtype=dtype, enabled=low)

    if args.prompts == "gsm8k":
        prompts = gsm8k_prompts(tok, args.distinct)
    else:
        prompts = [
            f"Question {i}: what is {7 * i} plus {3 * i + 1}?" for i in range(int(args.prompts))
        ]
    bw = hbm_bandwidth(device)
    engines = {name: make_engine(name, model, tok, args.max_new, dtype) for name in args.engines}
    plen = tok(prompts, return_tensors="pt", padding=True).input_ids.shape[1]
    rows = []
    for batch in args.batch:
        roof = roofline(model, batch, plen, args.max_new, bw)
        for name in args.engines:
            engine = engines[name]
            reps = args.hf_reps if name == "hf" and args.hf_reps else args.reps
            r = time_engine(engine, prompts, batch, reps, device)
            r |= {"engine": name, "batch": batch, "roofline_tok_per_s": roof}
            r["roofline_frac"] = r["tok_per_s"] / roof
            rows.append(r)
            print(json.dumps(r), flush=True)
    agree = None
    engines.clear()  # their packed weights and caches: room for the fp32 judge at 8B
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if not args.no_agreement:
        n = args.agree_new
        short = NativeEngine(model, tok, n, 1.0, 1.0, 3600, dtype=dtype)
        hf_short = HFEngine(model, tok, n, 1.0, 1.0, 3600, autocast=autocast)
        agree_prompts = (prompts * -(-args.agree_rows // len(prompts)))[: args.agree_rows]
        agree = agreement(model, tok, short, hf_short, agree_prompts, autocast, device)
        print(json.dumps(agree))
        print(agreement_line(agree), flush=True)
    result = {
        "benchmark": "decode",
        "config": vars(args)
        | {
            "out": str(args.out) if args.out else None,
            "model": str(args.model or ""),
            "shape_dir": str(random_config) if random_config else None,
            "model_type": model.config.model_type,
            "weights_dtype": str(next(model.parameters()).dtype),
            "prompt_len": plen,
        },
        "hbm_bytes_per_s": bw,
        "runs": rows,
        "agreement": agree,
        "env": env_info(),
    }
    write_result(result, args.out)
    print(
        f"{'engine':16} {'batch':>5} {'tok/s':>9} {'s/roll':>7} {'len':>6} {'roof%':>6} {'GiB':>5}"
    )
    for r in rows:
        peak = f"{r['peak_gib']:.1f}" if r["peak_gib"] is not None else "-"
        print(
            f"{r['engine']:16} {r['batch']:5d} {r['tok_per_s']:9.0f} {r['s_per_rollout']:7.2f} "
            f"{r['mean_len']:6.1f} {100 * r['roofline_frac']:6.1f} {peak:>5}"
        )


if __name__ == "__main__":
    main()
