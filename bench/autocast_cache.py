"""Benchmark: what autocast's cast cache costs the update, on the CPU (no GPU needed).

One update (two micro-batches, ``update.accumulate``) of a random SmolLM2-135M-shaped model
under bf16 autocast with gradient checkpointing, with the cache on (the trainer before
2026-11-25) and off (``optimization.autocast_factory(..., cache=False)``, the trainer's
update now), eager and with compiled decoder layers. Each variant runs in a fresh process
and reports its peak resident memory above the state before the update (weights and
gradients already allocated, as from the second micro-batch of a run on). Gradients are
compared bit for bit. The mechanism is autocast's, the same on a GPU, where the peak is
what the memory estimator predicts.

    python bench/autocast_cache.py --out bench/results/cpu_autocast_cache.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import build_model, env_info, write_result  # noqa: E402

from grpo_hpc.config.schema import AlgoConfig  # noqa: E402
from grpo_hpc.train.algo import update  # noqa: E402
from grpo_hpc.train.algo.optimization import autocast_factory  # noqa: E402
from grpo_hpc.train.dist import DistInfo  # noqa: E402
from grpo_hpc.train.models import (  # noqa: E402
    compile_layers,
    enable_checkpointing,
    load_model_and_tokenizer,
)

VARIANTS = {
    "eager, cache": (False, True),
    "eager, no cache": (False, False),
    "compiled, cache": (True, True),
    "compiled, no cache": (True, False),
}


def one_update(model_dir: Path, compiled: bool, cache: bool, grads_out: Path) -> dict:
    """In this process: the update, its peak RSS growth (MiB), the gradients saved."""
    from update_speed import fake_batch

    torch.manual_seed(0)
    model, _ = load_model_and_tokenizer(model_dir, "sdpa", torch.device("cpu"))
    enable_checkpointing(model, 1)
    if compiled:
        compile_layers(model)
    model.train()
    rows, prompt, new = 4, 16, 16
    batch = fake_batch(rows, prompt, new, model.config.vocab_size, "cpu")
    algo = AlgoConfig(micro_batch_size=2, micro_batch_tokens=4096, packing=False)
    mbs = update.split(batch, list(range(rows)), torch.randn(rows), 2, 4096, False)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    autocast = autocast_factory("cpu", torch.bfloat16, cache=cache)
    update.accumulate(model, mbs, algo, DistInfo(device=torch.device("cpu")), new, None, autocast)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    torch.save({n: p.grad for n, p in model.named_parameters()}, grads_out)
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2)
    return {"growth_mib": (peak - before) / 1024, "bf16_copy_mib": 2 * matrices / 2**20}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path)
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)  # model_dir compiled cache grads
    args = p.parse_args()
    if args.child:
        d, compiled, cache, grads = args.child
        print(json.dumps(one_update(Path(d), compiled == "1", cache == "1", Path(grads))))
        return
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        build_model(Path(tmp) / "m", "smollm2-135m")
        for name, (compiled, cache) in VARIANTS.items():
            grads = Path(tmp) / f"{name}.pt"
            cmd = [sys.executable, __file__, "--child", str(Path(tmp) / "m")]
            cmd += [str(int(compiled)), str(int(cache)), str(grads)]
            env = dict(os.environ, OMP_NUM_THREADS="1")
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            runs[name] = json.loads(out.stdout.strip().splitlines()[-1])
            print(name, runs[name], flush=True)
        same = {}
        for kind in ("eager", "compiled"):
            a = torch.load(Path(tmp) / f"{kind}, cache.pt")
            b = torch.load(Path(tmp) / f"{kind}, no cache.pt")
            same[kind] = all(torch.equal(a[n], b[n]) for n in a)
    result = {
        "benchmark": "autocast_cache",
        "command": "python bench/autocast_cache.py --out bench/results/cpu_autocast_cache.json",
        "what_ran": "one update of 2 micro-batches (4 rows of 16+16 tokens), SmolLM2-135M "
        "shape, random weights, bf16 autocast on the CPU, every layer checkpointed",
        "runs": runs,
        "gradients_bit_equal_cache_vs_no_cache": same,
        "env": env_info(),
    }
    print("gradients equal:", same)
    write_result(result, args.out)


if __name__ == "__main__":
    main()
