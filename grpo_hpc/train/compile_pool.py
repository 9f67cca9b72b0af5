"""Inductor's compile workers ended at a step boundary, not by Inductor's idle timer.

``torch.compile`` builds its Triton kernels in a pool of subprocesses (one per core:
``torch._inductor.config.compile_threads``). Inductor ends that pool's workers itself once
it has been idle for ``quiesce_async_compile_time`` (60 s, checked every 30 s): 60-90 s
after the last compilation, whatever the training process is doing then. On a 2x H100
node that is 32 workers per rank. In five of six real 2-GPU runs of issue 38 (SmolLM2 on
GSM8K, compiled in step 1), one step 54-76 s after the first had rank 0 generating
0.4-0.8 s longer than any other step (``bench/results/h100x2_issue38_s16.md``);
``bench/probes/compile_quiesce.py`` times a launch loop across that moment.

Here the trainer ends the pool at the end of any step after which one exists (a step that
compiled, or an evaluation that did), the same point on every rank, and waits for it: the
cost lands in a step that is slow already. A later compilation starts a new pool.
"""

from __future__ import annotations

import sys
import time


def end_compile_workers() -> float | None:
    """End Inductor's compile pool if one is running; the seconds it took, None if none."""
    async_compile = sys.modules.get("torch._inductor.async_compile")
    if async_compile is None or not getattr(async_compile, "_pool_set", None):
        return None  # never compiled with workers (eager, CPU-only, compile_threads=1)
    t = time.monotonic()
    async_compile.shutdown_compile_workers()
    return time.monotonic() - t
