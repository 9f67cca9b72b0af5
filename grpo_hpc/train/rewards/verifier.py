"""The math-verify worker: judges answers against golds in a separate, restartable process.

Correctness is judged by math-verify, but never in the trainer's process: sympy can spin
for minutes (or forever) on output such as ``\\boxed{10^{10^{10^{10}}}}``, and math-verify's
own timeout relies on ``signal.alarm``, which only works on the main thread. We run it in a
long-lived worker process (fork context, so math-verify is imported once) with a per-item
deadline; an item that overruns scores 0, the worker is killed and a fresh one continues.

Throughput, measured on a shared 2-core box under load (best runs; Python 3.11, math-verify
0.9.0): in-process math-verify parse(gold) + parse(answer) + verify ~1,300 calls/s on plain
integers and ~850 calls/s on a GSM8K-style mix (``\\boxed{3/4}``, ``$1,000.00``, ``5%``);
through the worker, gold parses cached, ~1,100 items/s.
"""

from __future__ import annotations

import functools
import gc
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

_START_METHOD = "fork" if "fork" in mp.get_all_start_methods() else "spawn"


def _parse(text: str, latex_first: bool) -> list[Any]:
    """math-verify parse. Bare LaTeX (``x^2+1``) needs $...$ or math-verify picks a lone
    number from it; but "18 dollars" must stay bare. Hence: the preferred form, then the other.
    Text with a LaTeX command (``50\\%``, ``\\frac``: a box's content) is LaTeX first.
    """
    from math_verify import parse

    forms = [text] if "$" in text or "\\boxed" in text else [f"${text}$", text]
    for form in forms if latex_first or "\\" in text else forms[::-1]:
        parsed = parse(form, parsing_timeout=None)
        if parsed:
            return parsed
    return []


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple[Any, ...]:
    return tuple(_parse(gold, True))  # a GRPO group shares one gold: parse it once per worker


def _judge(answer: str, gold: str, symbolic: bool) -> float:
    """math-verify's verdict, in the worker; timeouts disabled (the parent enforces them).
    A symbolic gold (not a plain number) makes the answer parse as LaTeX first."""
    from math_verify import verify

    try:
        parsed_gold, parsed = list(_parse_gold(gold)), _parse(answer, symbolic)
        if not parsed or not parsed_gold:
            return 0.0
        return 1.0 if verify(parsed_gold, parsed, timeout_seconds=None) else 0.0
    except Exception:  # malformed output must score 0, never crash the worker
        return 0.0


WARM_UP: tuple[tuple[str, str, bool], ...] = (
    ("50\\%", "4", False),  # sympy's simplify: imports sympy.physics.units on its first call
    ("\\sqrt{2}", "4", False),  # imports sympy.sets.setexpr
    ("x", "4", False),
    ("$12.50", "4", False),
    ("12 hours", "4", False),
    ("3/4", "4", False),
    ("-3.14", "4", False),
    ("5 \\times 3", "4", False),  # each LaTeX operator costs tens of ms the first time
    ("2 \\cdot 6", "4", False),
    ("12 \\div 4", "4", False),
    ("\\text{7 cm}", "4", False),
)
"""Answers of the kinds a run sends to math-verify, judged once in the trainer before the
first worker is forked. The first time a process meets a kind of answer, math-verify and
sympy pay for it once (lazy imports: ``sympy.simplify`` imports the 33 modules of
``sympy.physics.units`` on its first call; parsers built per LaTeX command): 0.1-0.25 s in
one item on the CPU test machine; likely the 0.08-0.45 s single items of the real 2-GPU
runs, during which the other ranks waited (not yet confirmed on a GPU node). Every worker
forked after this inherits the warm state (a restarted one too) and freezes it with the
rest; the slowest item then took
6-14 ms (``python -m bench.probes.verifier_items --extra``, 2-core CPU machine,
2026-11-27). Trivial, fixed inputs: safe to judge without a deadline in the trainer."""

_WARM_MODULES = ("sympy.physics.units", "sympy.sets.setexpr")
_warmed = False


def _warm_up() -> None:
    """Judge :data:`WARM_UP` here, once per process, so that every worker starts warm."""
    global _warmed
    if _warmed:
        return
    import importlib

    for name in _WARM_MODULES:
        importlib.import_module(name)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # no-timeout warnings
    for job in WARM_UP:
        _judge(*job)
    _warmed = True


def _worker_main(conn: Connection, other_end: Connection) -> None:
    """Verification worker: receives lists of _judge arguments, streams back one score each."""
    other_end.close()  # so that we see EOF (and exit) when the trainer goes away
    # The fork inherits every Python object of the trainer, with automatic collection on
    # (it is forked at start-up, before the trainer's GC schedule). An occasional full
    # collection then walks them all: 0.30-0.31 s in one item on the CPU test machine (806k
    # objects inherited; bench/probes/verifier_gc.py), while the trainer's other ranks
    # wait at the next collective (one rank scoring 0.14-0.45 s in some steps
    # of real 2-GPU runs). Frozen, they are never collected here; the worker's own
    # garbage still is, whenever the worker was forked (a restart after a timeout comes
    # while the trainer's own automatic collection is off).
    gc.freeze()
    gc.enable()
    # Inherited trainer handlers (checkpoint on SIGUSR1, ...) must not run here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    # math-verify warns on every call made with its (signal-based) timeouts disabled.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    while True:
        try:
            jobs = conn.recv()
        except (EOFError, OSError):
            return
        for job in jobs:
            conn.send(_judge(*job))


class _Verifier:
    """Owner of the worker process; restarts it after a timeout or a crash."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: Any = None
        self.conn: Connection | None = None
        self.items = 0
        """Items judged since :meth:`take_stats` last ran."""
        self.slowest_s = 0.0
        """The longest any one of them took (wall, as the parent waited for it)."""

    def take_stats(self) -> tuple[int, float]:
        """(items judged, slowest item's seconds) since the last call, then reset: one
        odd completion can hold a rank's scoring for tenths of a second while its peers
        wait for it (real 2-GPU runs), and this says whether it was one item or many."""
        with self.lock:
            out, self.items, self.slowest_s = (self.items, self.slowest_s), 0, 0.0
        return out

    def _start(self) -> None:
        import math_verify  # noqa: F401  (imported before forking: each restart is instant)

        _warm_up()  # and warmed before forking: no first-use costs mid-run
        ctx = mp.get_context(_START_METHOD)
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=_worker_main, args=(child, parent), daemon=True, name="grpo-math-verify"
        )
        proc.start()
        child.close()
        self.proc, self.conn = proc, parent

    def _stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.join(5)
            self.conn.close()
        self.proc = self.conn = None

    def judge(self, jobs: list[tuple[str, str, bool]], timeout_s: float) -> tuple[list[float], int]:
        """Scores for ``jobs`` and the number of items that timed out or crashed the worker."""
        each = self.judge_each(jobs, timeout_s)
        return [score for score, _ in each], sum(failed for _, failed in each)

    def judge_each(
        self, jobs: list[tuple[str, str, bool]], timeout_s: float
    ) -> list[tuple[float, bool]]:
        """(score, failed) of each job: failed when it timed out or crashed the worker (it
        then scores 0). Callers on several threads take turns (one worker, one pipe)."""
        out, i = [(0.0, False)] * len(jobs), 0
        with self.lock:
            while i < len(jobs):
                if self.proc is None or not self.proc.is_alive():
                    self._stop()
                    self._start()
                t = time.monotonic()
                try:
                    self.conn.send(jobs[i:])
                    while i < len(jobs):
                        if not self.conn.poll(timeout_s):
                            raise TimeoutError
                        out[i] = (float(self.conn.recv()), False)
                        i, t = i + 1, self._count(t, jobs[i])
                except (TimeoutError, EOFError, OSError):
                    self._stop()  # item i scores 0; a fresh worker takes the rest
                    out[i] = (0.0, True)
                    i += 1
                    self._count(t, jobs[i - 1])
        return out

    def _count(self, since: float, job: tuple[str, str, bool]) -> float:
        now = time.monotonic()
        self.items += 1
        self.slowest_s = max(self.slowest_s, now - since)
        if now - since >= SLOW_ITEM_S:  # named: what held this rank's scoring, and its peers
            print(f"[Verify] {slow_item_line(now - since, job)}", flush=True)
        return now


SLOW_ITEM_S = 0.1
"""An item math-verify takes this long on is named in the training log."""


def slow_item_line(seconds: float, job: tuple[str, str, bool], width: int = 80) -> str:
    """The log line of one slow item (pure): its time, the answer and the gold, cut."""
    answer, gold = (repr(x[:width] + ("..." if len(x) > width else "")) for x in job[:2])
    return (
        f"math-verify took {seconds:.2f} s on one answer: {answer} (gold {gold}, pid {os.getpid()})"
    )


VERIFIER = _Verifier()
"""The process-wide verifier (one worker per trainer rank)."""


SELF_CHECK = (("\\frac{1}{2}", "0.5", True), ("\\frac{1}{3}", "0.5", True))
"""A right and a wrong answer that only math-verify (not the pre-judge) can settle."""


def self_check(timeout_s: float = 30.0, tries: int = 2) -> str | None:
    """None when the worker scores :data:`SELF_CHECK` as (1, 0); else why not. A worker
    that died under the check (the job's SIGTERM from a scancel reaches it too: found by
    bench/faults/run.py) gets a second try with a fresh one before the run is refused."""
    for _ in range(tries):
        try:
            scores, failures = VERIFIER.judge(list(SELF_CHECK), timeout_s)
        except Exception as e:  # noqa: BLE001 - any failure to start the worker is the answer
            return f"{type(e).__name__}: {e}"
        if not failures:
            break
    if failures:
        return f"the worker timed out or crashed on {failures} trivial item(s)"
    if scores != [1.0, 0.0]:
        return f"trivial right/wrong answers scored {scores}, expected [1.0, 0.0]"
    return None
