"""How much slower than usual this machine starts a Python process that imports torch: the
factor the suite's time bounds are stretched by.

Two kinds of bound. A *guard* only ends a test that went wrong (a subprocess's deadline, a
wait for a file, a pytest-timeout mark): stretching it costs nothing while the tests pass,
so :func:`guard` stretches it by at least :data:`GUARD_FLOOR` whatever was measured (the
machine can slow down after the measurement). A *behaviour* bound is part of what a test
sets up (a monitor's step-0 timeout, a Slurm time limit, how long a job sleeps): a test
waits it out, so :func:`scaled` stretches it by the measured factor only.

Why: these bounds were set on the 2-core machine on a normal day, where a process's ``import
torch`` takes about 2 CPU s (bench/probes/README.md, suite_timeline). The same kind of
machine has been seen several times slower at process starts alone (2026-12-06: ``import
torch`` 4.2-17 s wall within an hour, where a pure-Python loop ran at its usual speed;
touching 2 GiB afresh took 8 s and again 1.4 s: the VM hands its free memory back to its
host, which faults it in slowly): CI's run then took 42:53 instead of ~14 minutes, and 11
tests missed a bound, none of them a wrong answer given in time. Stretching the bounds keeps
each test's meaning (what must happen, and in which order); on a normal machine, where the
factor is 1, only the guards change.

The root conftest measures once per session, in the process that starts the xdist workers,
and passes the factor on in ``GRPO_HPC_TEST_SLOWDOWN`` (set it yourself to skip the probe).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

ENV = "GRPO_HPC_TEST_SLOWDOWN"
REFERENCE_IMPORT_S = 2.0
"""Seconds of ``import torch`` on the 2-core machine on a normal day (2 CPU s in a rank's
start, bench/probes/README.md's suite_timeline row). The probe underestimates the suite's
slowdown: on 2026-12-06 it read about 4.2 s (x1.7 against the 2.5 s first used here) at the start
of a fresh clone's suite that then took 34:15, 2.4 times its usual ~14 minutes (green, the
guards at x3)."""
GUARD_FLOOR = 3.0
"""The least stretch of a guard: CI's slowdown on 2026-12-06 (42:53 against ~14 minutes)."""
MAX_FACTOR = 5.0
"""The most any bound is stretched: a machine slower than this fails tests rather than make
a hang test wait for ever."""


def factor_from(import_s: float) -> float:
    """The stretch for a measured ``import torch`` time: never below 1 (a fast machine keeps
    the bounds as set), never above :data:`MAX_FACTOR`, rounded to a tenth."""
    return round(min(MAX_FACTOR, max(1.0, import_s / REFERENCE_IMPORT_S)), 1)


def measure_import_s() -> float:
    """Wall seconds of a fresh ``python -c 'import torch'`` on this machine now."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch"], check=True, timeout=300)
    return time.monotonic() - t0


def factor() -> float:
    """This session's stretch (1 where the conftest did not measure, e.g. a bare import)."""
    return float(os.environ.get(ENV, "1"))


def scaled(seconds: float) -> float:
    """A behaviour bound's ``seconds`` stretched by this session's factor."""
    return seconds * factor()


def guard(seconds: float) -> float:
    """A guard's ``seconds`` stretched by this session's factor, and at least by
    :data:`GUARD_FLOOR`."""
    return seconds * max(factor(), GUARD_FLOOR)
