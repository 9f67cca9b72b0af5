"""A few training steps under ``torch.profiler`` (``training.profile_steps``): where a real
run's step goes, per rank, with the run's own shapes.

A benchmark profiles a fixed step (bench/speed/profile_step.py); a user's run has its own
lengths, packing, collectives and host. Steps ``profile_from`` .. ``profile_from +
profile_steps - 1`` run under the profiler on every rank (CPU activity, and CUDA where the
rank has a GPU); after the last one each rank writes two files to ``torch_profile/``:

- ``rank<R>-steps<A>-<B>.json``: the Chrome trace (open in Perfetto or chrome://tracing);
- ``rank<R>-steps<A>-<B>.txt``: the operators that took the most time as torch's
  ``key_averages`` tables: by CPU time with children, where the trainer's own phases
  (``grpo/generate``, ``grpo/score``, ``grpo/vote``: the wait for the other ranks' rollouts,
  ``grpo/update``, ``grpo/report``, ``grpo/save``; :func:`phase`) give each rank's step in
  parts, and on a GPU also by device time.

Both are written to a temp file and renamed. The profiled steps run slower than the
others (the profiler's own overhead), and their ``time/step`` says so only by being there:
leave them out of a step-time comparison.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from grpo_hpc.core.fsutil import atomic_write_text
from grpo_hpc.train.measure import stall_sampler

TABLE_ROWS = 40
"""Operators listed in the summary."""


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """A named range of the step (``grpo/<name>``) in the profiler's trace and tables, and
    timed by the stall sampler where one runs (:mod:`grpo_hpc.train.measure.stall_sampler`); a few
    microseconds when neither does."""
    sampler = stall_sampler.current()
    with torch.profiler.record_function(f"grpo/{name}"):
        if sampler is None:
            yield
            return
        sampler.enter(name)
        try:
            yield
        finally:
            sampler.leave(name)


@dataclass
class ThreadClock:
    """Where a block's wall-clock went on the host (:func:`thread_clock`).

    The update of a small model is bound by the host: Python and kernel launches. On a GPU
    the forward is launched from the calling thread and the backward from autograd's own
    thread for the device, while the caller waits in ``backward()``; so the calling
    thread's CPU seconds (``cpu_s``) leave the backward out, and the process's
    (``process_cpu_s``: every thread, autograd's, NCCL's and the trainer's own) count it.
    ``process_cpu_s`` near ``wall_s`` says the host was busy all along; far under it, that
    it waited (the GPU, a peer rank, the GIL). ``descheduled`` counts the kernel taking the
    process's threads off their cores (involuntary context switches)."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    """CPU seconds of the calling thread (user and system)."""
    process_cpu_s: float = 0.0
    """CPU seconds of the whole process, all its threads (not its child processes)."""
    descheduled: int = 0
    """Involuntary context switches of the process's threads."""
    by_group: dict[str, float] = field(default_factory=dict)
    """CPU seconds of the process's threads by :func:`thread_group`, from Linux's
    per-thread ``schedstat`` (empty where the kernel does not keep it). A thread that ended
    inside the block has left ``/proc`` and is not counted."""
    waited_s: dict[str, float] = field(default_factory=dict)
    """Seconds the threads of each group were ready to run but waited for a core (the
    run queue's wait in ``schedstat``): a busy host, not a slow thread."""

    def metrics(self, name: str, sync_s: float = 0.0) -> dict[str, float]:
        """The block's metrics as a step logs them (pure; docs/run-directory.md):
        ``time/<name>`` (the wall, plus ``sync_s`` waited for the GPU after it),
        ``time/<name>_sync``, ``_cpu`` (the process), ``_cpu_main`` and one
        ``_cpu_<group>`` per other :func:`thread_group`, ``_waited`` (every thread's
        run-queue wait) and ``_waited_main``, and ``<name>/descheduled``."""
        t = f"time/{name}"
        out = {t: self.wall_s + sync_s, f"{t}_sync": sync_s, f"{t}_cpu": self.process_cpu_s}
        out[f"{t}_cpu_main"] = self.cpu_s
        out |= {f"{t}_cpu_{g}": v for g, v in self.by_group.items() if g != "main"}
        if self.waited_s:
            out[f"{t}_waited"] = sum(self.waited_s.values())
            out[f"{t}_waited_main"] = self.waited_s["main"]
        out[f"{name}/descheduled"] = float(self.descheduled)
        return out


THREAD_GROUPS = ("main", "autograd", "python", "native")
"""How :func:`thread_group` sorts a process's threads."""


def thread_group(tid: int, comm: str, main: int, python: set[int]) -> str:
    """The group of one thread (pure): ``main``, the calling thread; ``autograd``,
    PyTorch's device threads for the backward (named ``pt_autograd_N``); ``python``, the
    process's other Python threads (the scoring thread, liveness, progress, samplers);
    ``native``, the rest (the intra-op OpenMP pool, CUDA's and NCCL's threads)."""
    if tid == main:
        return "main"
    if comm.startswith("pt_autograd"):
        return "autograd"
    return "python" if tid in python else "native"


def _schedstat() -> dict[int, tuple[int, int]]:
    """Each live thread of this process: (ns on a core, ns waiting for one)."""
    out: dict[int, tuple[int, int]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for t in tids:
        try:
            with open(f"/proc/self/task/{t}/schedstat") as f:
                ran, waited = f.read().split()[:2]
        except (OSError, ValueError):  # a thread that ended meanwhile, or no schedstats
            continue
        out[int(t)] = (int(ran), int(waited))
    return out


def _names(tids: list[int]) -> dict[int, str]:
    """Each thread's name (``comm``); read once, at the block's end: a name matters only
    for the grouping."""
    out = {}
    for t in tids:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            with open(f"/proc/self/task/{t}/comm") as f:
                out[t] = f.read().strip()
    return out


def group_times(
    before: dict[int, tuple[int, int]],
    after: dict[int, tuple[int, int]],
    names: dict[int, str],
    main: int,
    python: set[int],
) -> tuple[dict[str, float], dict[str, float]]:
    """CPU seconds and run-queue seconds by :func:`thread_group` between two
    :func:`_schedstat` readings (pure); a thread born meanwhile counts from zero."""
    cpu = dict.fromkeys(THREAD_GROUPS, 0.0)
    waited = dict.fromkeys(THREAD_GROUPS, 0.0)
    for tid, (ran, wait) in after.items():
        ran0, wait0 = before.get(tid, (0, 0))
        g = thread_group(tid, names.get(tid, ""), main, python)
        cpu[g] += (ran - ran0) / 1e9
        waited[g] += (wait - wait0) / 1e9
    return cpu, waited


def _usage() -> tuple[float, float, int]:
    """(this thread's CPU s, the process's CPU s, the process's involuntary switches)."""
    # RUSAGE_THREAD is Linux's; elsewhere the process's figures stand in
    mine = resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF))
    every = resource.getrusage(resource.RUSAGE_SELF)
    cpu = mine.ru_utime + mine.ru_stime
    return cpu, every.ru_utime + every.ru_stime, every.ru_nivcsw


@contextlib.contextmanager
def thread_clock() -> Iterator[ThreadClock]:
    """Times the block on the host; the yielded :class:`ThreadClock` is filled in when
    the block ends. Reading the threads' ``schedstat`` costs about 12 us a thread (tens of
    threads on a GPU rank: under a millisecond, twice)."""
    clock = ThreadClock()
    sched0 = _schedstat()
    before = _usage()
    t0 = time.monotonic()
    try:
        yield clock
    finally:
        clock.wall_s = time.monotonic() - t0
        after = _usage()
        clock.cpu_s, clock.process_cpu_s = after[0] - before[0], after[1] - before[1]
        clock.descheduled = after[2] - before[2]
        sched1 = _schedstat()
        if sched0 and sched1:
            python = {t.native_id for t in threading.enumerate() if t.native_id is not None}
            names = _names(list(sched1))
            clock.by_group, clock.waited_s = group_times(
                sched0, sched1, names, threading.get_native_id(), python
            )


def window(start: int, count: int) -> range:
    """The profiled step numbers (pure): ``count`` steps from ``start`` (the step number as
    logged, 1-based); empty when ``count`` is 0."""
    return range(start, start + count) if count > 0 else range(0)


def names(out: Path, rank: int, steps: range) -> tuple[Path, Path]:
    """The trace and summary paths of one rank's window (pure)."""
    stem = f"rank{rank}-steps{steps.start}-{steps.stop - 1}"
    return out / f"{stem}.json", out / f"{stem}.txt"


@dataclass
class StepProfiler:
    """Wraps the trainer's steps: :meth:`before_step` and :meth:`after_step` around each."""

    out: Path
    """``torch_profile/`` of the run directory."""
    rank: int
    steps: range
    """:func:`window` of the config."""
    cuda: bool
    _prof: torch.profiler.profile | None = field(default=None, repr=False)

    def before_step(self, step: int) -> None:
        """``step``: the number the step about to run will log."""
        if step == self.steps.start and self._prof is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(activities=activities)
            self._prof.start()

    def after_step(self, step: int) -> None:
        """``step``: the number the step just finished logged."""
        if self._prof is not None and step == self.steps.stop - 1:
            self._finish()

    def close(self) -> None:
        """The run ended (or stopped) inside the window: what was recorded is written."""
        if self._prof is not None:
            with contextlib.suppress(Exception):  # a failed trace must not hide the exit
                self._finish()

    def _finish(self) -> None:
        prof, self._prof = self._prof, None
        assert prof is not None
        prof.stop()
        self.out.mkdir(parents=True, exist_ok=True)
        trace, summary = names(self.out, self.rank, self.steps)
        tmp = trace.with_name(f".{trace.name}.tmp")
        prof.export_chrome_trace(str(tmp))
        tmp.replace(trace)
        averages = prof.key_averages()
        tables = [("CPU time, with children", "cpu_time_total")]
        if self.cuda:
            tables.append(("device time", "self_device_time_total"))
        text = phase_lines(averages) + "".join(
            f"== by {what}\n{averages.table(sort_by=key, row_limit=TABLE_ROWS)}\n"
            for what, key in tables
        )
        atomic_write_text(summary, text)


def phase_lines(averages: list) -> str:
    """The step's phases (:func:`phase`), every one of them, however short: a phase can be
    too short for the tables' top rows (a rank that reaches ``grpo/vote`` last barely
    waits), and its absence there would read as "not run". On a GPU the profiler lists
    each range twice, as the CPU range and as its annotation on the device's timeline
    (no CPU time): one line each, the CPU range's."""
    best: dict[str, Any] = {}
    for e in averages:
        if e.key.startswith("grpo/"):
            if e.key not in best or e.cpu_time_total > best[e.key].cpu_time_total:
                best[e.key] = e
    lines = [
        f"  {k:<16} {e.count:>4} calls  {e.cpu_time_total / 1e3:10.1f} ms CPU time total"
        for k, e in sorted(best.items())
    ]
    return "== the step's phases, this rank\n" + "\n".join(lines) + "\n\n"
