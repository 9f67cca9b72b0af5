"""training.gc_every_steps: automatic collection off while training, young collections at
a fixed point of the step, a full one every hundredth step, every collection timed; the
entry point's imports made without collections and frozen out of later ones."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest

from grpo_hpc.train.supervision.gc_schedule import FULL_EVERY, GcSchedule, due


@pytest.fixture
def restored() -> Iterator[None]:
    """Whatever a test does to the collector, the next test finds Python's defaults."""
    yield
    gc.enable()


def test_young_collections_fall_on_every_nth_step_and_full_ones_every_hundredth() -> None:
    assert [s for s in range(7) if due(s, 3)] == [0, 3, 6]
    assert [due(s, 1) for s in range(3)] == [1, 1, 1]
    assert all(due(s, 0) is None for s in (0, 1, 100))  # 0: Python's automatic collection
    assert [due(s, 1) for s in (99, FULL_EVERY, 101, 2 * FULL_EVERY)] == [1, 2, 1, 2]
    assert due(FULL_EVERY, 7) == 2  # a full one even where no young one falls


def _cycles(n: int) -> None:
    for _ in range(n):
        a: list = []
        a.append(a)  # a reference cycle: only the collector frees it


@pytest.mark.usefixtures("restored")
def test_scheduled_collection_turns_automatic_gc_off_and_back_on() -> None:
    sched = GcSchedule(every=2)
    frozen = gc.get_freeze_count()  # what the imports left (tests/conftest.py froze it)
    sched.start()
    try:
        # nothing more kept: a freeze would add every live object; the count may still
        # fall, when a frozen object is freed meanwhile (another thread of this worker)
        assert not gc.isenabled() and gc.get_freeze_count() <= frozen
        assert sched.clock in gc.callbacks
        _cycles(1000)
        pending = gc.get_count()[0]
        assert pending >= 1000  # nothing collected them automatically
        sched.before_step(1)  # not due: nothing collected
        assert gc.get_count()[0] >= pending
        sched.before_step(2)
        assert gc.get_count()[0] < pending
        assert sched.clock.take() > 0  # the collection was timed
    finally:
        sched.stop()
    assert gc.isenabled() and sched.clock not in gc.callbacks


@pytest.mark.usefixtures("restored")
def test_automatic_mode_leaves_gc_on_and_still_times_it() -> None:
    sched = GcSchedule(every=0)
    sched.start()
    try:
        assert gc.isenabled()
        sched.before_step(0)  # nothing scheduled
        gc.collect()  # what Python would start by itself
        assert sched.clock.take() > 0
        assert sched.clock.take() == 0  # taken: back to zero
    finally:
        sched.stop()


@pytest.mark.usefixtures("restored")
def test_a_collection_between_steps_is_not_the_next_steps() -> None:
    sched = GcSchedule(every=5)
    sched.start()
    try:
        gc.collect()  # one between steps (the engine's own, an evaluation's)
        assert sched.clock.spent > 0
        sched.before_step(1)  # not due: the step starts with nothing counted
        assert sched.clock.take() == 0
    finally:
        sched.stop()


def test_a_negative_interval_is_refused_in_one_line() -> None:
    from grpo_hpc.config.load import build_config
    from grpo_hpc.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"training.gc_every_steps=-1 must be >= 0"):
        build_config("tiny", ["training.gc_every_steps=-1"])


FROZEN_IMPORTS = """
import gc
from grpo_hpc.train.supervision.gc_schedule import imports_frozen

passes = []
gc.callbacks.append(lambda phase, info: phase == "start" and passes.append(info["generation"]))
with imports_frozen():
    assert not gc.isenabled()
    import email.mime.multipart  # noqa: F401  (an import that makes long-lived objects)
    made = [[i] for i in range(50_000)]  # enough allocations for many automatic passes
assert passes == [], passes  # none ran inside
assert gc.isenabled() and gc.get_freeze_count() > len(made)  # and all of it is frozen
gc.collect()
assert gc.get_freeze_count() > len(made)  # out of every later pass
try:
    with imports_frozen():
        raise ImportError("a failed import")
except ImportError:
    pass
assert gc.isenabled()  # back on after a failure too
gc.disable()
with imports_frozen():
    pass
assert not gc.isenabled()  # as it was: off stays off
print("ok")
"""


def test_the_entry_points_imports_run_without_collections_and_stay_out_of_later_ones() -> None:
    """gc_schedule.imports_frozen, in a process of its own (it freezes that process's
    objects for good): no automatic pass while it lasts, everything frozen after it,
    Python's setting restored, also when the imports fail."""
    done = subprocess.run(
        [sys.executable, "-c", FROZEN_IMPORTS], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
