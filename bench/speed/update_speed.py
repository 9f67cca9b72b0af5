"""Benchmark: the GRPO update (forward + backward over every micro-batch, optimizer step)
on a random model of a real shape, with the fused LM-head log-probs, the same packed
(``algo.packing``: each micro-batch one sequence, no padding) and the plain path that
materialises [tokens, vocab] logits; prints a kernel profile of the first.

MFU = 6 * N * tokens / time / peak, with N the parameter count (embedding included,
tied head counted once), tokens the padded training tokens, and peak the dense bf16
rate of the GPU (989 TFLOP/s for an H100 SXM; also the measured 8k matmul rate).

    python -m bench.speed.update_speed --shape qwen2.5-0.5b --out bench/results/update_speed.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.common import SHAPES, build_model, env_info, write_result
from grpo_hpc.config.schema import AlgoConfig
from grpo_hpc.train.algo import logp_head, update
from grpo_hpc.train.algo.loss import selective_log_softmax, token_entropy
from grpo_hpc.train.algo.optimization import autocast_factory
from grpo_hpc.train.algo.packing import use_packed_attention, varlen_kernel
from grpo_hpc.train.distributed.dist import DistInfo
from grpo_hpc.train.rollout.engines import RolloutBatch
from grpo_hpc.train.setup.models import (
    compile_layers,
    enable_checkpointing,
    load_model_and_tokenizer,
)

PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "V100": 125e12}


def plain_logp(model, mb, with_entropy=False):  # noqa: ANN001, ANN201
    """The path before the fused head: full logits, gathered, log-softmaxed in chunks."""
    b = mb.batch
    ids, mask, start = update.right_align(
        b.input_ids[mb.rows], b.attention_mask[mb.rows], b.prompt_len, b.pad_token_id
    )
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    c = b.input_ids.shape[1] - b.prompt_len
    pos = (start.unsqueeze(1) - 1 + torch.arange(c, device=ids.device)).unsqueeze(-1)
    logits = logits.gather(1, pos.expand(-1, -1, logits.shape[-1])).float()
    logp = selective_log_softmax(logits, b.input_ids[mb.rows, b.prompt_len :])
    return logp, token_entropy(logits.detach()) if with_entropy else None


def fake_batch(  # noqa: ANN201
    rows: int,
    prompt: int,
    new: int,
    vocab: int,
    device,
    ragged: bool = False,  # noqa: ANN001
):
    """Full completions, or with ``ragged`` lengths uniform in [new/8, new] (mean ~0.56 of
    the cap, as SmolLM2's 300 of 512 tokens on GSM8K); prompts left-padded by 0..7."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, vocab, (rows, prompt + new), generator=g)
    mask = torch.ones_like(ids)
    lengths = torch.randint(max(1, new // 8), new + 1, (rows,), generator=g) if ragged else None
    cmask = torch.ones(rows, new, dtype=torch.long)
    for r in range(rows):  # left padding of 0..7 tokens, as a real prompt batch has
        mask[r, : r % 8] = 0
        ids[r, : r % 8] = 0
        if lengths is not None:
            cmask[r, lengths[r] :] = 0
            mask[r, prompt + lengths[r] :] = 0
            ids[r, prompt + lengths[r] :] = 0
    return RolloutBatch(ids.to(device), mask.to(device), cmask.to(device), prompt, [])


def measured_peak() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    return 2 * 8192**3 * 10 / (time.perf_counter() - t)


def run_update(model, opt, mbs, algo, new, cache: bool = False) -> float:  # noqa: ANN001
    torch.cuda.synchronize()
    t = time.perf_counter()
    autocast = autocast_factory("cuda", torch.bfloat16, cache=cache)  # the trainer's: no cache
    update.accumulate(model, mbs, algo, DistInfo(device=torch.device("cuda")), new, None, autocast)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--prompt", type=int, default=30)
    p.add_argument("--max-new", type=int, default=256)
    p.add_argument("--micro-tokens", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--grad-ckpt", action="store_true", help="checkpoint every decoder layer")
    p.add_argument(
        "--ckpt-every", type=int, default=0, help="checkpoint one layer in N (0: --grad-ckpt's)"
    )
    p.add_argument(
        "--paths",
        nargs="+",
        choices=["fused", "packed", "plain"],
        default=["fused", "packed", "plain"],
    )
    p.add_argument("--ragged", action="store_true", help="completion lengths of a real policy")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--compile", action="store_true", help="dist.compile: compiled layers")
    p.add_argument(
        "--autocast-cache",
        action="store_true",
        help="the update's autocast keeps its cast cache (the trainer's did before 2026-11-25)",
    )
    p.add_argument(
        "--compile-head",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --compile, also the fused head's chunk arithmetic (as dist.compile does)",
    )
    p.add_argument(
        "--cpp-wrapper",
        action="store_true",
        help="with --compile, Inductor's C++ wrapper instead of its Python one (fewer host "
        "microseconds a kernel launch)",
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if args.cpp_wrapper:
        import torch._inductor.config as inductor_config

        inductor_config.cpp_wrapper = True
    with tempfile.TemporaryDirectory() as d:
        build_model(Path(d) / "m", args.shape)
        model, _ = load_model_and_tokenizer(Path(d) / "m", "sdpa", torch.device("cuda"))
    use_packed_attention(model)  # plain SDPA except in the packed path's forwards
    if args.grad_ckpt or args.ckpt_every:
        enable_checkpointing(model, args.ckpt_every or 1)
    if args.compile:
        compile_layers(model)
        if args.compile_head:
            logp_head.compile_chunks()
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    vocab = model.config.vocab_size
    batch = fake_batch(args.rows, args.prompt, args.max_new, vocab, "cuda", args.ragged)
    tokens = args.rows * (args.prompt + args.max_new)
    real = int(batch.attention_mask.sum())  # what packing computes; mfu_real counts these
    adv = torch.randn(args.rows)  # on the host, as the trainer has them
    peak_meas = measured_peak()
    gpu = torch.cuda.get_device_name(0)
    peak = next((v for k, v in PEAK_BF16.items() if k in gpu), peak_meas)
    fused_path = update.completion_logp
    runs = []
    for path in args.paths:
        update.completion_logp = plain_logp if path == "plain" else fused_path
        packed = path == "packed"
        for budget in args.micro_tokens:
            algo = AlgoConfig(micro_batch_size=args.rows, micro_batch_tokens=budget, packing=packed)
            mbs = update.split(batch, list(range(args.rows)), adv, args.rows, budget, packed)
            run_update(model, opt, mbs, algo, args.max_new, args.autocast_cache)  # warm-up
            torch.cuda.reset_peak_memory_stats()
            times = [
                run_update(model, opt, mbs, algo, args.max_new, args.autocast_cache)
                for _ in range(args.reps)
            ]
            t = statistics.median(times)
            r = {
                "path": path,
                "micro_tokens": budget,
                "micro_batches": len(mbs),
                "s_per_update": t,
                "s_min": min(times),
                "s_max": max(times),
                "tok_per_s": tokens / t,
                "mfu": 6 * n_params * tokens / t / peak,
                "mfu_real": 6 * n_params * real / t / peak,
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            }
            runs.append(r)
            print(r, flush=True)
    # The profile is of the first path named (and the first budget).
    update.completion_logp = plain_logp if args.paths[0] == "plain" else fused_path
    packed = args.paths[0] == "packed"
    budget = args.micro_tokens[0]
    algo = AlgoConfig(micro_batch_size=args.rows, micro_batch_tokens=budget, packing=packed)
    mbs = update.split(batch, list(range(args.rows)), adv, args.rows, budget, packed)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        run_update(model, opt, mbs, algo, args.max_new, args.autocast_cache)
    table = prof.key_averages().table(
        sort_by="cuda_time_total", row_limit=25, max_name_column_width=60
    )
    print(table)
    result = {
        "benchmark": "update_speed",
        "config": vars(args) | {"out": str(args.out) if args.out else None},
        "params": n_params,
        "tokens_per_update": tokens,
        "real_tokens_per_update": real,
        "peak_flops_used": peak,
        "measured_matmul_flops": peak_meas,
        "runs": runs,
        "packed_attention": "varlen flash" if varlen_kernel() else "SDPA per row",
        "env": env_info(),
    }
    write_result(result, args.out)
    if args.out:
        args.out.with_suffix(".profile.txt").write_text(table)


if __name__ == "__main__":
    main()
