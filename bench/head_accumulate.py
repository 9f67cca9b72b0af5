"""Benchmark: the LM head's weight-gradient sum over chunks, one GEMM against two passes.

At a real shape (Qwen2.5-3B's tied head: vocabulary 151,936, hidden 2,048; 1,024-token
chunks) times, on a CUDA GPU, ``acc += a @ b`` done as a bf16 product plus an fp32 add
(the head before 2026-11-25, late) and as one GEMM accumulating in its epilogue
(``logp_head.accumulate_product``), then the whole head (``linear_logp`` forward and
backward under bf16 autocast) as the trainer runs it for one micro-batch.

    python bench/head_accumulate.py --out bench/results/h100_head_accumulate.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import env_info, write_result  # noqa: E402

from grpo_hpc.train.algo import logp_head  # noqa: E402


def _ms(fn, reps: int) -> float:  # noqa: ANN001
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--chunk", type=int, default=logp_head.DEFAULT_CHUNK_TOKENS)
    p.add_argument("--tokens", type=int, default=8192, help="completion tokens of a micro-batch")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("head_accumulate.py needs a CUDA GPU")
    dev = torch.device("cuda")
    acc = torch.zeros(args.vocab, args.hidden, device=dev)
    d = torch.randn(args.chunk, args.vocab, device=dev).bfloat16()
    hc = torch.randn(args.chunk, args.hidden, device=dev).bfloat16()
    two_pass = _ms(lambda: acc.add_(d.T @ hc), args.reps)
    one_gemm = _ms(lambda: logp_head.accumulate_product(acc, d.T, hc), args.reps)
    h = torch.randn(args.tokens, args.hidden, device=dev, requires_grad=True)
    w = (0.02 * torch.randn(args.vocab, args.hidden, device=dev)).requires_grad_()
    ids = torch.randint(0, args.vocab, (args.tokens,), device=dev)

    def head() -> None:
        with torch.autocast("cuda", torch.bfloat16):
            logp, _ = logp_head.linear_logp(h, w, ids, args.chunk)
        logp.sum().backward()

    fused_head = _ms(head, max(3, args.reps // 4))
    fused = logp_head.accumulate_product
    logp_head.accumulate_product = lambda a, x, y: a.add_(x @ y)  # the two-pass head
    try:
        two_pass_head = _ms(head, max(3, args.reps // 4))
    finally:
        logp_head.accumulate_product = fused
    result = {
        "benchmark": "head_accumulate",
        "config": vars(args) | {"out": str(args.out)},
        "fused_path_taken": logp_head._gemm_accumulates(acc, d),
        "per_chunk_ms": {"product_then_add": two_pass, "one_gemm": one_gemm},
        "head_fwd_bwd_ms": {"product_then_add": two_pass_head, "one_gemm": fused_head},
        "env": env_info(),
    }
    print(result)
    write_result(result, args.out)


if __name__ == "__main__":
    main()
