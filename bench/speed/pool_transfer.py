"""What a partial-rollout pool costs to hand over (``rollout.partial_pool``): a split run's
trainer sends its pool with each request and its generator sends it back with the batch
(docs/async.md, "In the split placement"), and every checkpoint saves it. This times each
step of one hand-over on the host: ``PartialPool.state_dict``, ``torch.save`` to bytes (what
``split.send_obj`` sends), ``torch.load``, ``load_state_dict``; as the pool packs its rows
(bytes) and, for comparison, as plain lists (``dataclasses.asdict``, before packing).

    python -m bench.speed.pool_transfer --rows 128 --tokens 4096 --repeats 5 \
        --out bench/results/pool_transfer_cpu_2026-12-05.json

A full pool at a cap: ``--rows`` = P steps' rows of one trainer (P x prompts x G), each with
``--tokens`` tokens so far (the worst case: every row one token short of the cap). Medians
over ``--repeats``. CPU only; no GPU is involved in the hand-over but the wire under NCCL.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from grpo_hpc.train.rollout.partial import Flight, PartialPool

G = 8
"""Rows a group: the flights are groups of G rows."""


def make_pool(rows: int, tokens: int, seed: int = 0) -> PartialPool:
    """A pool of ``rows`` rows (groups of ``G``), each with ``tokens`` tokens and their
    log-probs (float32 values, as the engines report them)."""
    rng = random.Random(seed)
    flights = []
    for i in range(rows // G):
        ids = [[rng.randrange(150_000) for _ in range(tokens)] for _ in range(G)]
        logp = torch.rand(G, tokens).mul(-5).tolist()  # float32 values
        flights.append(Flight(i, list(range(300)), ids, logp, [False] * G, 0, 0, i, [1] * G))
    return PartialPool(2, 2, flights, len(flights))


def _lists(pool: PartialPool) -> dict[str, Any]:
    """The state as plain lists (the pool's format before its rows were packed)."""
    return {"flights": [dataclasses.asdict(f) for f in pool.flights], "drawn": pool.drawn}


def one(pool: PartialPool, packed: bool) -> dict[str, float]:
    """One hand-over's seconds per part, and the bytes sent."""
    t0 = time.perf_counter()
    state = pool.state_dict() if packed else _lists(pool)
    t1 = time.perf_counter()
    buf = io.BytesIO()
    torch.save(state, buf)
    t2 = time.perf_counter()
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    t3 = time.perf_counter()
    into = PartialPool(2, 2)
    into.load_state_dict(back)
    t4 = time.perf_counter()
    assert into.flights == pool.flights, "the pool did not come back whole"
    return {
        "state_dict_s": t1 - t0,
        "save_s": t2 - t1,
        "load_s": t3 - t2,
        "restore_s": t4 - t3,
        "total_s": t4 - t0,
        "megabytes": len(buf.getvalue()) / 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: python -m bench.speed.pool_transfer --rows 128 --tokens 4096",
    )
    ap.add_argument("--rows", type=int, default=128, help="rows in the pool (groups of 8)")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens so far, every row")
    ap.add_argument("--repeats", type=int, default=5, help="hand-overs timed (median)")
    ap.add_argument("--out", type=Path, help="write the results here (JSON)")
    args = ap.parse_args(argv)
    pool = make_pool(args.rows, args.tokens)
    result: dict[str, Any] = {
        "rows": args.rows,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
        "command": "python -m bench.speed.pool_transfer "
        f"--rows {args.rows} --tokens {args.tokens} --repeats {args.repeats}",
    }
    for name, packed in (("packed", True), ("lists", False)):
        runs = [one(pool, packed) for _ in range(args.repeats)]
        result[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        m = result[name]
        print(
            f"{name:6s}: state_dict {m['state_dict_s']:.3f} s, save {m['save_s']:.3f} s, "
            f"load {m['load_s']:.3f} s, restore {m['restore_s']:.3f} s: "
            f"{m['total_s']:.3f} s a hand-over, {m['megabytes']:.1f} MB"
        )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
