"""Is each engine's sampler unbiased? A check that needs no knowledge of its internals.

For tokens drawn from ``p_T = softmax(z / T)``, the expected log-probability of the drawn
token, given its prefix, is minus the entropy of ``p_T`` there: ``E[log p_T(x) + H(p_T)] = 0``
at every position. So the mean of ``D_t = log p_T(x_t) + H_t`` over all sampled tokens,
with ``log p_T`` and ``H`` computed by a plain fp32 forward of the policy, is 0 up to its
standard error for a correct sampler; a sampler that draws too many unlikely tokens gives
a negative mean, one that is too greedy a positive one. The engine's own low precision
adds about minus its KL to the trainer (~1e-3 in bf16), far below what a wrong sampler
gives.

Each engine samples the same prompts (the learning benchmark's two-term word problems)
``--rows`` times over; also reported: the mean log-prob of the drawn tokens under the raw
policy (T = 1) and the share of drawn tokens with ``p_T < 1e-4``, against the share the
distribution itself puts there (its expected value).

``--eos TEXT`` makes a frequent token end a completion (e.g. ``.``), so that rows finish at
many different steps and the native engine compacts its batch again and again: a row
continued from another row's cache or state would draw tokens that are unlikely in its
own context, and show as a large negative ``D``.

The stop token gets its own check: the number of rows that stopped against the sum of
``p_T(stop)`` over every position the rows reached (its expectation for a correct
sampler), as a z-score. ``native_fp32`` is the native engine with fp32 weights and cache.

    python -m bench.probes.sampler_check --out bench/results/archive/h100_sampler_check.json   # GPU
    python -m bench.probes.sampler_check --rows 8 --prompts 2 --engines native_eager hf  # CPU
"""

from __future__ import annotations

import argparse
import copy
import json
import math
from pathlib import Path

import torch

from grpo_hpc.config.schema import DataConfig, ModelConfig
from grpo_hpc.tasks import problems as data
from grpo_hpc.train.algo.logp_head import Scoring
from grpo_hpc.train.algo.update import MicroBatch, completion_logp
from grpo_hpc.train.rollout.engines import HFEngine
from grpo_hpc.train.rollout.native.engine import NativeEngine
from grpo_hpc.train.setup import models

SYSTEM = "Solve it. End with the line 'Answer: <number>'."  # configs/demo.yaml's
TAIL = 1e-4


def build(name: str, model: torch.nn.Module, tok: object, args: argparse.Namespace) -> object:
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    common = (model, tok, args.max_new, args.temperature, 1.0, 3600)
    if name == "hf":
        autocast = (lambda: torch.autocast("cuda", dtype=dtype)) if cuda else None
        return HFEngine(*common, **({"autocast": autocast} if autocast else {}))
    graphs = name in ("native", "native_fp32")
    if name == "native_fp32":
        dtype = torch.float32
    return NativeEngine(*common, dtype=dtype, use_graphs=graphs, compile=graphs)


def tail_and_eos(
    model: torch.nn.Module, mb: MicroBatch, t: float, eos: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, C] each: the probability mass of tokens with ``p_T < TAIL``, and ``p_T`` of
    the stop token, at each completion position (a full fp32 forward; small models only)."""
    b, tail, stop = mb.batch, [], []
    for lo in range(0, b.input_ids.shape[0], 32):  # [32, L, vocab] fp32 at a time
        ids, am = b.input_ids[lo : lo + 32], b.attention_mask[lo : lo + 32]
        pos = (am.cumsum(-1) - 1).clamp(min=0)  # left-padded rows: positions from 0 at text
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=am, position_ids=pos).logits.float()
        p = torch.softmax(logits[:, b.prompt_len - 1 : -1] / t, -1)
        tail.append((p * (p < TAIL)).sum(-1))
        stop.append(p[..., eos])
    return torch.cat(tail), torch.cat(stop)


def check(name: str, model: torch.nn.Module, tok: object, prompts: list[str], args) -> dict:
    if args.eos:
        tok = copy.deepcopy(tok)
        tok.eos_token = args.eos
    engine = build(name, model, tok, args)
    torch.manual_seed(args.seed)
    engine.generate(prompts[:1], 2)  # warm-up: compile, capture
    batch = engine.generate(prompts, args.rows)
    rows = batch.input_ids.shape[0]
    mb = MicroBatch(batch, torch.arange(rows), torch.zeros(rows))
    with torch.no_grad():
        lp_t, ent_t = completion_logp(model, mb, True, Scoring(args.temperature))
        lp_1, _ = completion_logp(model, mb, False, Scoring(1.0))
    mask = batch.completion_mask.bool()
    d = (lp_t + ent_t)[mask].double()
    tail_drawn = (lp_t[mask].exp() < TAIL).double().mean().item()
    tail, p_eos = tail_and_eos(model, mb, args.temperature, tok.eos_token_id)
    tail_expected = tail[mask].double().mean().item()
    # Each position a row reaches draws the stop token with probability p_eos there, so
    # the count of rows that stopped has mean sum(p_eos) and variance sum(p(1 - p)) over
    # the positions reached: an engine that under-draws the stop token (its own rounding
    # of that one logit) finishes fewer rows than this, whatever D says.
    h = p_eos[mask].double()
    by_pos = engine_gap_by_position(batch, lp_1, mask)
    eos_drawn = float(batch.finished.sum()) if batch.finished is not None else float("nan")
    n = int(mask.sum())
    return {
        "engine": name,
        "tokens": n,
        "D_mean": d.mean().item(),
        "D_se": (d.std() / math.sqrt(n)).item(),
        "logp_T1_mean": lp_1[mask].double().mean().item(),
        "entropy_T_mean": ent_t[mask].double().mean().item(),
        "tail_drawn": tail_drawn,
        "tail_expected": tail_expected,
        "mean_length": batch.completion_mask.sum(1).float().mean().item(),
        "finished": batch.finished.float().mean().item() if batch.finished is not None else None,
        "compactions": getattr(engine, "stats", {}).get("compactions"),
        "eos_drawn": eos_drawn,
        "eos_expected": h.sum().item(),
        "eos_z": (eos_drawn - h.sum().item()) / math.sqrt((h * (1 - h)).sum().item()),
        "engine_gap_by_position": by_pos,
    }


def engine_gap_by_position(batch: object, lp_1: torch.Tensor, mask: torch.Tensor) -> dict:
    """Mean |engine log-prob - fp32 scorer log-prob| (T = 1) of the drawn tokens at the
    first completion position, positions 1-7 and 8 on (native engine only: it reports its
    log-probs). The first token comes from the prefill of the left-padded prompts, the rest
    from decode steps: a mismatch confined to one of them hides in an average over all."""
    if batch.sampled_logp is None:
        return {}
    gap = (batch.sampled_logp.float() - lp_1.float()).abs()
    out = {}
    for name, lo, hi in (("0", 0, 1), ("1-7", 1, 8), ("8+", 8, gap.shape[1])):
        m = mask[:, lo:hi]
        out[name] = gap[:, lo:hi][m].double().mean().item() if m.any() else None
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--engines", nargs="+", default=["native", "native_eager", "native_fp32", "hf"])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--rows", type=int, default=64, help="completions per prompt")
    p.add_argument("--max-new", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eos", default="", help="a token that ends completions (e.g. '.')")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    path = models.materialize(ModelConfig(name_or_path=models.SMOLLM2), Path("."), 0)
    model, tok = models.load_model_and_tokenizer(path, "sdpa", device)
    model.eval()
    cfg = DataConfig(source="arithmetic", min_terms=2, max_terms=2, max_operand=20)
    problems = data.arithmetic_problems(args.prompts, cfg, args.seed)
    prompts = [data.prompt_text(tok, q["question"], SYSTEM) for q in problems]
    results = []
    for name in args.engines:
        r = check(name, model, tok, prompts, args)
        results.append(r)
        print(
            f"{name:13} D {r['D_mean']:+.4f} ± {r['D_se']:.4f}  logp(T=1) {r['logp_T1_mean']:.3f}"
            f"  tail drawn {r['tail_drawn']:.4f} expected {r['tail_expected']:.4f}"
            f"  length {r['mean_length']:.1f}  stops {r['eos_drawn']:.0f} expected"
            f" {r['eos_expected']:.1f} (z {r['eos_z']:+.2f})  ({r['tokens']} tokens,"
            f" {r['compactions']} compactions)",
            flush=True,
        )
    if args.out:
        env = {"torch": torch.__version__, "device": str(device)}
        if device.type == "cuda":
            env["gpu"] = torch.cuda.get_device_name()
        args.out.write_text(
            json.dumps(
                {"config": vars(args) | {"out": None}, "env": env, "results": results}, indent=1
            )
        )


if __name__ == "__main__":
    main()
