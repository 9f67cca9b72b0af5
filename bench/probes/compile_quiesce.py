"""Does Inductor's idle compile pool, shut down 60-90 s after the last compilation, stall a
process that is launching GPU work at that moment?

The question behind a real run's slow step 22: in five of six unprofiled 2-GPU runs, one step
54-76 s after the first step (whose compilation fills Inductor's subprocess pool) had rank
0 generating 0.4-0.8 s longer than usual. Inductor's pool has a timer
(``torch._inductor.config.quiesce_async_compile_time``, 60 s, checked every 30 s) that then
tells the pool's sidecar to end its worker processes (``compile_threads``, one per core).

This probe compiles a small function (which starts the pool), then for ``--seconds``
launches a burst of small kernels and synchronises, over and over, timing each burst, and
counts the pool's worker processes. It prints each second's slowest burst where it is over
3x the median, and when the worker count changes. ``--mode shutdown`` ends the pool
itself right after compiling (``shutdown_compile_workers``, what a trainer could do at a
step boundary), timed; ``--mode default`` leaves it to Inductor's timer.

The answer (one H100, 16 cores, ``TORCHINDUCTOR_COMPILE_THREADS=32``, torch 2.11,
2026-11-27,
``bench/results/archive/slurm_gsm8k_slow_steps_h100x2_2026-11-27/compile_quiesce_*.json``):
the 32 workers
ended at t=65 s; the slowest burst of the 100 s was 10.9 ms at t=70 s against a median of
2.8 ms. A stall of milliseconds, not the 0.4-0.8 s of step 22: not the cause as far as one
process shows. Ending the pool ourselves took 8.3 s. The trainer does neither.

    python -m bench.probes.compile_quiesce --mode default --seconds 100
    python -m bench.probes.compile_quiesce --mode shutdown --seconds 100 --out F.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch


def pool_workers() -> int:
    """Processes of Inductor's compile pool that descend from this one (sidecar included)."""
    me, children = os.getpid(), {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children[int(pid)] = (ppid, b"compile_worker" in cmd or b"subproc" in cmd)
    found, frontier = 0, {me}
    while frontier:
        nxt = {p for p, (pp, _) in children.items() if pp in frontier}
        found += sum(1 for p in nxt if children[p][1])
        frontier = nxt
    return found


def burst(x: torch.Tensor, launches: int) -> float:
    t = time.perf_counter()
    for _ in range(launches):
        x.mul_(1.0001).add_(1e-4)
    if x.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--mode", choices=("default", "shutdown"), default="default")
    p.add_argument("--seconds", type=float, default=100.0)
    p.add_argument("--launches", type=int, default=200, help="kernel pairs per burst")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"

    @torch.compile
    def f(a: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(a) * a.sum(-1, keepdim=True) + a.cos()

    f(torch.randn(64, 256, device=device))  # compiles: the pool starts and works
    out: dict = {
        "mode": args.mode,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "compile_threads": torch._inductor.config.compile_threads,
        "torch": torch.__version__,
        "workers_after_compile": pool_workers(),
    }
    if args.mode == "shutdown":
        from torch._inductor.async_compile import shutdown_compile_workers

        t = time.perf_counter()
        shutdown_compile_workers()
        out["shutdown_s"] = time.perf_counter() - t
    x = torch.zeros(1024, device=device)
    for _ in range(20):
        burst(x, args.launches)
    t0, times, workers, events = time.monotonic(), [], pool_workers(), []
    out["workers_at_start"] = workers
    last_check = t0
    while (now := time.monotonic()) - t0 < args.seconds:
        times.append((now - t0, burst(x, args.launches)))
        if now - last_check > 1.0:
            last_check, w = now, pool_workers()
            if w != workers:
                events.append({"t": round(now - t0, 1), "workers": w})
                print(f"t={now - t0:6.1f} s  pool workers {workers} -> {w}", flush=True)
                workers = w
    med = statistics.median(d for _, d in times)
    per_s: dict[int, float] = {}
    for t, d in times:
        per_s[int(t)] = max(per_s.get(int(t), 0.0), d)
    slow = {s: d for s, d in per_s.items() if d > 3 * med}
    for s, d in sorted(slow.items()):
        print(f"t={s:4d} s  slowest burst {d * 1e3:7.1f} ms (median {med * 1e3:.1f} ms)")
    worst_t, worst = max(times, key=lambda td: td[1])
    print(
        f"{args.mode}: {len(times)} bursts, median {med * 1e3:.1f} ms, worst "
        f"{worst * 1e3:.1f} ms at t={worst_t:.1f} s; shutdown {out.get('shutdown_s', 0):.2f} s"
    )
    out.update(
        median_ms=med * 1e3,
        worst_ms=worst * 1e3,
        worst_at_s=worst_t,
        slow_seconds={str(k): v * 1e3 for k, v in slow.items()},
        worker_events=events,
    )
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
