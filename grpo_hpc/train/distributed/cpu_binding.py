"""``dist.bind_cpus``: each rank of a node on a share of the job's CPUs of its own.

A small model's update is bound by the host: one thread launches the forward, autograd's
device thread the backward, and the step waits for them. The real 2-GPU runs had slow
updates whose CPU seconds grew with their time, on a VM host whose cores ran a fixed piece
of work 2-3x slower from one moment to the next (bench/results/weak_scaling_h100x4_2026-11-27.md).
Whether a rank that keeps cores of its own, apart from the other ranks' threads, steps
more steadily is what this option is for: off by default, to be measured.

The share is taken when the trainer starts, before torch loads, so every thread and
process a rank starts later inherits it (torch's, NCCL's, the math-verify worker). Shares
are whole physical cores where the kernel reports SMT siblings, split as evenly as the
cores allow; with fewer cores than ranks, logical CPUs; with fewer CPUs than ranks, no
binding at all. The decision is pure (:func:`share`); :func:`bind` reads this machine's
CPUs and applies it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

SIBLINGS = "/sys/devices/system/cpu/cpu{}/topology/thread_siblings_list"


def parse_cpu_list(text: str) -> list[int]:
    """The kernel's CPU list format (``0-3,8,10-11``) as CPU numbers (pure)."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def cpu_list(cpus: Sequence[int]) -> str:
    """CPU numbers in the kernel's list format, runs joined (pure): ``0-3,8``."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def cores(cpus: Sequence[int], siblings: Mapping[int, Sequence[int]]) -> list[list[int]]:
    """``cpus`` grouped by physical core (pure): each CPU with its SMT siblings that are also
    in ``cpus``, cores in order of their first CPU. A CPU without sibling data is a core."""
    allowed, seen, out = set(cpus), set(), []
    for c in sorted(allowed):
        if c in seen:
            continue
        core = sorted({c} | (set(siblings.get(c, ())) & allowed))
        seen.update(core)
        out.append(core)
    return out


def share(
    cpus: Sequence[int], siblings: Mapping[int, Sequence[int]], local_rank: int, local_world: int
) -> list[int]:
    """The CPUs of ``local_rank`` among ``local_world`` ranks sharing ``cpus`` (pure):
    consecutive whole cores, split as evenly as they go (the first ranks take one more
    where they do not divide); logical CPUs when there are fewer cores than ranks; all of
    ``cpus`` when there are fewer CPUs than ranks (nothing to split)."""
    if local_world <= 1 or len(cpus) < local_world:
        return sorted(cpus)
    units = cores(cpus, siblings)
    if len(units) < local_world:
        units = [[c] for c in sorted(cpus)]
    base, extra = divmod(len(units), local_world)
    start = local_rank * base + min(local_rank, extra)
    mine = units[start : start + base + (1 if local_rank < extra else 0)]
    return [c for core in mine for c in core]


def _siblings(cpus: Sequence[int]) -> dict[int, list[int]]:
    out = {}
    for c in cpus:
        try:
            out[c] = parse_cpu_list(Path(SIBLINGS.format(c)).read_text())
        except (OSError, ValueError):
            continue  # no topology data (not Linux, a restricted /sys): the CPU is a core
    return out


def bind(enabled: bool) -> str | None:
    """``dist.bind_cpus``: move this process (its calling thread, and so every thread and
    child started after) to this local rank's share; the line to print, or None when off
    or when the platform cannot bind."""
    if not enabled or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    mine = share(allowed, _siblings(allowed), rank, world)
    os.sched_setaffinity(0, mine)
    return (
        f"[Dist] local rank {rank} of {world} bound to CPUs {cpu_list(mine)} "
        f"({len(mine)} of the job's {len(allowed)}: {cpu_list(allowed)})"
    )
