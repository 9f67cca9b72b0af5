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
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.common import SHAPES, build_model, env_info, write_result
from grpo_hpc.config.schema import DataConfig
from grpo_hpc.tasks.problems import load_problems, prompt_text
from grpo_hpc.train.algo.update import MicroBatch, completion_logp
from grpo_hpc.train.rollout.engines import HFEngine
from grpo_hpc.train.rollout.native.engine import NativeEngine
from grpo_hpc.train.rollout.native.forward import DecodeFns
from grpo_hpc.train.rollout.native.sampling import pick
from grpo_hpc.train.setup.models import load_model_and_tokenizer

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
    cfg = model.config
    weight_bytes = sum(p.numel() for p in model.parameters()) * 2  # bf16; tied head once
    kv_per_slot = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * 2
    kv_per_slot *= cfg.hidden_size // cfg.num_attention_heads
    kv_bytes = batch * kv_per_slot * (prompt + new / 2)
    return batch / ((weight_bytes + kv_bytes) / bw)


ENGINES = {
    "native": {},
    "native-nocompact": {"compact": False},
    "native-eager": {"compile": False},
    "native-eagerpick": {},  # compiled layers, the token choice eager (as before issue 24)
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


def agreement(model, tok, native, hf, prompts, autocast, device) -> dict:  # noqa: ANN001
    """Greedy: identical sequences vs HF, and whether every native greedy token is an
    argmax of a plain forward pass up to ``tol`` (bf16 near-ties may flip either way).
    Sampling: native log-probs vs the training forward's, on the native tokens."""
    a = hf.generate(prompts, 1, greedy=True)
    b = native.generate(prompts, 1, greedy=True)
    n = min(a.input_ids.shape[1], b.input_ids.shape[1])
    same = (a.input_ids[:, :n] == b.input_ids[:, :n]).all(1).float().mean().item()
    with torch.no_grad(), autocast():
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.float()
    p = b.prompt_len
    pred = logits[:, p - 1 : -1]
    chosen = pred.gather(-1, b.input_ids[:, p:, None])[..., 0]
    gap = (pred.max(-1).values - chosen)[b.completion_mask.bool()]
    s = native.generate(prompts, 4)
    mb = MicroBatch(s, torch.arange(s.input_ids.shape[0]), torch.zeros(s.input_ids.shape[0]))
    with torch.no_grad(), autocast():
        lp, _ = completion_logp(model, mb)
    m = s.completion_mask.bool()
    diff = (lp - s.sampled_logp)[m].abs()
    return {
        "greedy_identical_to_hf": same,
        "greedy_argmax_gap_max": gap.max().item(),
        "greedy_argmax_gap_mean": gap.mean().item(),
        "logp_absdiff_max": diff.max().item(),
        "logp_absdiff_mean": diff.mean().item(),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
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
        if args.model is None:
            build_model(Path(d) / "m", args.shape)
        model, tok = load_model_and_tokenizer(args.model or Path(d) / "m", "sdpa", device)
    model.eval()
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
            r = time_engine(engine, prompts, batch, args.reps, device)
            r |= {"engine": name, "batch": batch, "roofline_tok_per_s": roof}
            r["roofline_frac"] = r["tok_per_s"] / roof
            rows.append(r)
            print(json.dumps(r), flush=True)
    agree = None
    if not args.no_agreement:
        short = NativeEngine(model, tok, 64, 1.0, 1.0, 3600, dtype=dtype)
        hf_short = HFEngine(model, tok, 64, 1.0, 1.0, 3600, autocast=autocast)
        agree = agreement(model, tok, short, hf_short, prompts * 2, autocast, device)
        print(json.dumps(agree))
    result = {
        "benchmark": "decode",
        "config": vars(args)
        | {
            "out": str(args.out) if args.out else None,
            "model": str(args.model or ""),
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
