"""Python's garbage collector on a schedule (``training.gc_every_steps``), and timed.

A full collection walks every tracked Python object. After torch, transformers and the
compiled graphs are loaded that is hundreds of thousands of them (435k on the CPU test
machine, 0.15 s there for one full pass), and Python starts one whenever enough
allocations pile up: at a different moment on each rank. A rank paused in the collector
reaches the next collective late and its peers wait, so one step in several runs slower
by that much, at no step anyone could predict. The field's answer (torchtitan's
``gc_freq``, Megatron-LM's manual GC) is to turn automatic collection off during training
and collect at a fixed point of the step, the same on every rank. Here:

- while the entry point imports torch, transformers and the trainer and joins the process
  group, the collector is off, and what that left alive is frozen (:func:`imports_frozen`):
  modules, classes and functions that live as long as the process, left out of every
  later pass;
- at the start of training everything made since is collected once, and automatic
  collection is turned off (nothing made after the imports is frozen: a frozen object is
  never collected, and the native engine frees the CUDA graphs and caches it drops through
  the collector);
- every ``gc_every_steps`` steps, at the start of the step, every rank collects the young
  generations (the objects a step made and dropped in reference cycles: milliseconds);
- at the start of every :data:`FULL_EVERY`-th step every rank collects everything not frozen,
  freeing cycles that outlived a step (torchtitan never collects fully; a long run should).
  A full collection after each checkpoint save was tried and dropped: walking every object
  takes 0.1-0.5 s a save per rank, and the CPU test suite, which saves often, ran 17 %
  slower for it.

Every collection, scheduled or automatic, is timed through ``gc.callbacks``: the step's
``time/gc`` metric is the longest any rank spent collecting during it. Measured on 2x H100
(SmolLM2-135M, 30 GSM8K steps, bench/results/archive/ladder_ddp_first_h100x2_2026-11-26.md): with
automatic
collection the longest pause in a step was 4.4 ms, and the schedule cost 0.01-0.16 ms a
step (that run also froze the objects alive at the start, which is no longer done). There
it neither helped nor hurt; it is the default as the field's practice for processes whose
full collection takes longer.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

FULL_EVERY = 100
"""Steps between full collections, each at the start of a step on every rank."""


@contextlib.contextmanager
def imports_frozen() -> Iterator[None]:
    """Python's automatic collection off inside, and everything alive frozen at the end
    (``gc.freeze``): for the entry point's imports.

    Importing torch, transformers and the trainer makes ~450k objects that live as long as
    the process and almost no garbage. The automatic collector starts a full pass each time
    the long-lived objects have grown by a quarter: 7 passes over them during those imports,
    which freed 413 objects, 1-1.7 s of CPU per process on the 2-core test machine (an
    import of the trainer: 4.6-5.3 s with the collector off, 5.6-7.0 s with it on). Frozen,
    they are also left out of the collection at the start of training (~0.3 s) and of
    every full one. Collection is as it was on the way out, also when an import fails."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if was_enabled:
            gc.enable()


def due(step: int, every: int) -> int | None:
    """The generation the step about to run (``step`` done so far) starts by collecting
    (pure): 1 (the young ones) every ``every`` steps, 2 (everything) every
    :data:`FULL_EVERY` steps; None for no collection. ``every`` 0: never (Python's
    automatic collection instead)."""
    if every <= 0:
        return None
    if step > 0 and step % FULL_EVERY == 0:
        return 2
    return 1 if step % every == 0 else None


@dataclass
class GcClock:
    """Seconds spent in the garbage collector since the last :meth:`take` (installed as a
    ``gc.callbacks`` hook, which Python calls at the start and the end of a collection)."""

    spent: float = 0.0
    began: float | None = None

    def __call__(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self.began = time.perf_counter()
        elif self.began is not None:
            self.spent += time.perf_counter() - self.began
            self.began = None

    def take(self) -> float:
        """The seconds collected so far, and start again from zero."""
        spent, self.spent = self.spent, 0.0
        return spent


@dataclass
class GcSchedule:
    """The trainer's collector control: :meth:`start` before the first step, :meth:`stop`
    after the last (Python's own behaviour restored)."""

    every: int
    """``training.gc_every_steps``: a young collection every N steps (0: automatic GC)."""
    clock: GcClock = field(default_factory=GcClock)
    active: bool = False

    def start(self) -> None:
        gc.callbacks.append(self.clock)
        if self.every > 0:
            gc.collect()
            gc.disable()
        self.clock.take()  # the start-up collection is not a step's
        self.active = True

    def before_step(self, step: int) -> None:
        """At a step's start: what was collected between steps (a save, an evaluation) is
        not this step's; then the young collection, when due."""
        if not self.active:
            return
        self.clock.take()
        generation = due(step, self.every)
        if generation is not None:
            gc.collect(generation)

    def stop(self) -> None:
        if not self.active:
            return
        self.active = False
        if self.clock in gc.callbacks:
            gc.callbacks.remove(self.clock)
        if self.every > 0:
            gc.enable()
