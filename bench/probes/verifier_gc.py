"""Does the math-verify worker pause to collect garbage it inherited from the trainer?

The question behind a real run's slow scoring: in real 2-GPU runs one rank sometimes scored
its 64 completions in 0.14-0.45 s instead of 0.01-0.03 s, and the other rank waited. The
worker (``grpo_hpc/train/rewards/verifier.py``) is forked from the trainer, so it inherits
every Python object the trainer had then, with automatic collection on. This probe builds
a trainer-sized heap (torch and transformers imported, ``--objects`` more), starts the
worker, judges ``--items`` GSM8K-style answers in batches of 64 through math-verify, and
reports each batch's time and the slowest single item (``VERIFIER.take_stats``).
``--no-freeze`` turns the worker's ``gc.freeze()`` into a no-op (the worker before the fix);
``--gc-log`` prints every collection in the worker over 50 ms.

    python -m bench.probes.verifier_gc [--no-freeze] [--gc-log]

The answer (CPU test machine, 2 cores, Python 3.11, 806k objects in the parent,
2026-11-27, two runs each): without the freeze, one item in the run took 307-316 ms, the
worker logging a generation-2 collection of 302-309 ms, and the slowest later batch took
438-462 ms; with it the slowest item took 31-49 ms, no collection reached 50 ms, and the
slowest batch took 248-253 ms. Batch medians 138-143 ms either way.
"""

from __future__ import annotations

import argparse
import gc
import random
import time


def jobs(n: int, seed: int = 0) -> list[tuple[str, str, bool]]:
    """Answers in the forms math-verify settles (the pre-judge is bypassed here)."""
    rng = random.Random(seed)
    forms = ["\\boxed{%d}", "$%d.00", "%d%%", "\\frac{%d}{4}", "%d dollars, as computed",
             "x = %d", "%d/3", "\\$%d"]  # fmt: skip
    out = []
    for i in range(n):
        k = rng.randint(1, 5000)
        symbolic = i % 3 == 0
        gold = f"\\frac{{{rng.randint(1, 99)}}}{{4}}" if symbolic else str(k)
        out.append((rng.choice(forms) % k, gold, symbolic))
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--objects", type=int, default=300_000, help="extra objects in the heap")
    p.add_argument("--items", type=int, default=6000)
    p.add_argument("--no-freeze", action="store_true", help="the worker as before the fix")
    p.add_argument("--gc-log", action="store_true", help="the worker's collections over 50 ms")
    args = p.parse_args()
    import torch  # noqa: F401  (the trainer's heap)
    import transformers  # noqa: F401

    heap = [{"a": [i, str(i)]} for i in range(args.objects)]
    from grpo_hpc.train.rewards import verifier

    if args.no_freeze:
        gc.freeze = lambda: None  # the fork inherits the no-op
    if args.gc_log:
        real = verifier._worker_main

        def logged(conn, other):  # type: ignore[no-untyped-def]
            began: list[float] = []

            def cb(phase: str, info: dict) -> None:
                if phase == "start":
                    began[:] = [time.perf_counter()]
                elif (d := time.perf_counter() - began[0]) > 0.05:
                    print(f"  worker: gen{info['generation']} collection {d * 1e3:.0f} ms")

            gc.callbacks.append(cb)
            real(conn, other)

        verifier._worker_main = logged
    print(f"objects in the parent: {len(gc.get_objects())} ({len(heap)} added)")
    V = verifier.VERIFIER
    work = jobs(args.items)
    batches, slowest = [], []
    for k in range(0, len(work), 64):
        V.take_stats()
        t = time.perf_counter()
        V.judge(work[k : k + 64], 2.0)
        batches.append(time.perf_counter() - t)
        slowest.append(V.take_stats()[1])
    first, later = batches[0], sorted(batches[1:])  # the first starts the worker
    print(
        f"{'without' if args.no_freeze else 'with'} the freeze: first batch {first * 1e3:.0f} ms"
        f" (the worker starts); {len(later)} later batches of 64: median "
        f"{later[len(later) // 2] * 1e3:.1f} ms, max {later[-1] * 1e3:.1f} ms; slowest item "
        f"{max(slowest[1:]) * 1e3:.1f} ms; items over 100 ms in "
        f"{sum(s > 0.1 for s in slowest[1:])} batches"
    )


if __name__ == "__main__":
    main()
