"""The main thread's stack, sampled while a phase of the step runs long
(``training.stall_sample_ms``): what a rank was doing in a slow step, where the profiler
cannot look.

The real 2-GPU runs had rank 0 generating 1.16 s in one step against 0.4-0.5 s in
every other. The two runs with ``training.profile_steps`` over that step did not have it, so
the profiler, whose overhead changes the timing, cannot say what the rank was doing then.
This sampler costs nothing until a phase (:func:`grpo_hpc.train.measure.profiling.phase`:
generate, score, vote, update, report, save) has run :data:`SLACK_S` longer than its median
over the earlier steps. Then a thread of its own reads the main thread's stack every
``stall_sample_ms`` milliseconds (``sys._current_frames``: Python frames only; a rank
waiting in a CUDA call shows the Python line that made it). When the phase ends, the
stacks seen are counted and written to ``torch_profile/stalls-rank<R>.txt``, with one
console line.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from grpo_hpc.core.fsutil import append_text

SLACK_S = 0.15
"""How much longer than its median a phase runs before its stack is sampled."""
MIN_HISTORY = 3
"""Earlier runs of a phase needed before its median counts (warm-up steps compile)."""
FRAMES = 8
"""Innermost frames kept per sample."""
TOP = 6
"""Distinct stacks written per slow phase."""


def stack_of(frame: FrameType | None, depth: int = FRAMES) -> str:
    """A frame and its callers, innermost first, as ``file:line function`` (pure)."""
    parts = []
    while frame is not None and len(parts) < depth:
        code = frame.f_code
        parts.append(f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return " <- ".join(parts)


def report(step: int, rank: int, name: str, took: float, usual: float, stacks: Counter) -> str:
    """The lines written for one slow phase (pure)."""
    n = sum(stacks.values())
    lines = [f"step {step} rank {rank} {name}: {took:.2f} s (median {usual:.2f} s), {n} samples"]
    lines += [f"  {c:>4}x {s}" for s, c in stacks.most_common(TOP)]
    return "\n".join(lines) + "\n"


@dataclass
class StallSampler:
    """One per rank; :func:`grpo_hpc.train.measure.profiling.phase` calls :meth:`enter` and
    :meth:`leave` around each phase once :meth:`start` has run."""

    out: Path
    """``torch_profile/`` of the run directory."""
    rank: int
    every_s: float
    """Seconds between two samples."""
    step: int = 0
    """The step being run (set by the trainer; named in the report)."""
    _durations: dict[str, list[float]] = field(default_factory=dict, repr=False)
    _active: tuple[str, float, float] | None = field(default=None, repr=False)
    _stacks: Counter = field(default_factory=Counter, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _main: int = field(default_factory=threading.get_ident, repr=False)
    _nested: int = field(default=0, repr=False)

    def start(self) -> None:
        threading.Thread(target=self._loop, name="grpo-stall-sampler", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def enter(self, name: str) -> None:
        if self._active is not None:  # a phase inside another (a save during the update)
            self._nested += 1
            return
        past = self._durations.get(name, [])
        usual = statistics.median(past) if len(past) >= MIN_HISTORY else float("inf")
        with self._lock:
            self._stacks.clear()
            self._active = (name, time.monotonic(), usual)

    def leave(self, name: str) -> None:
        if self._nested:
            self._nested -= 1
            return
        with self._lock:
            active, self._active = self._active, None
            stacks, self._stacks = self._stacks, Counter()
        if active is None or active[0] != name:
            return
        took = time.monotonic() - active[1]
        self._durations.setdefault(name, []).append(took)
        if stacks:
            text = report(self.step, self.rank, f"grpo/{name}", took, active[2], stacks)
            self.out.mkdir(parents=True, exist_ok=True)
            append_text(self.out / f"stalls-rank{self.rank}.txt", text)
            print(
                f"[Stall] {text.splitlines()[0]}: stacks in "
                f"{self.out.name}/stalls-rank{self.rank}.txt",
                flush=True,
            )

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            with self._lock:
                active = self._active
                if active is None or time.monotonic() - active[1] < active[2] + SLACK_S:
                    continue
                frame = sys._current_frames().get(self._main)
                self._stacks[stack_of(frame)] += 1


_SAMPLER: StallSampler | None = None


def install(sampler: StallSampler | None) -> None:
    """Make ``sampler`` the one :func:`grpo_hpc.train.measure.profiling.phase` reports to (None:
    none), starting its thread; the one it replaces is stopped."""
    global _SAMPLER
    if _SAMPLER is not None:
        _SAMPLER.stop()
    _SAMPLER = sampler
    if sampler is not None:
        sampler.start()


def current() -> StallSampler | None:
    return _SAMPLER
