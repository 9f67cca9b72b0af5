"""Every rank's pulse, and each rank's watch on its peers'.

A rank that stops answering (SIGSTOP, a hung driver, a node that vanished under a
multi-node job) leaves its peers blocked in their next collective. The process group's
timeout cannot end that quickly: after a rollout the ranks reach the next collective
minutes apart (one rank's generation or evaluation runs longer than another's), so a
timeout short enough to catch a hang would kill healthy jobs across a rollout. A pulse
does not care where the main thread is: a daemon thread on every rank writes a counter to
``<run>/alive/<launch>/rank<R>`` every ``PULSE_S`` seconds and reads its peers'. A stopped
process stops all of its threads, so its counter stops; a rank blocked in a collective or
busy generating keeps pulsing. When a peer's counter has not moved for
``dist.peer_timeout_s``, the watching rank records why in progress.json and exits
(ExitCode.STALLED): torchrun then ends the other ranks, the job ends, and the monitor
resubmits from the last complete checkpoint.

The files are compared by content, never by mtime: nodes' clocks may differ, and each
rank judges a peer by its own monotonic clock. A rank that ends normally writes
``rank<R>.done`` first, so that its peers do not mistake its exit for a hang.

A pulse proves a process alive, not its work moving: a generator whose main thread hangs
(a CUDA kernel or NCCL op that never returns, a deadlock, a reward that loops) keeps
pulsing, and the trainer waiting for its batch would wait for ever. So a generator process
also writes its *progress* on a second line of its pulse file (``progress <n>``: the
counter, grpo_hpc.train.rollout.progress's ``Progress``, that its working thread advances
at every engine tick, request, weight transfer and batch sent), and a trainer that waits
for it (:meth:`Liveness.waiting_on`) ends the job when that counter has not moved for
``rollout.progress_timeout_s`` of its wait (``stuck_for``), with ExitCode.STALLED and a
reason naming the generator (``stuck_reason``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from grpo_hpc.train.rollout.progress import HOST, Progress, stuck_for

PULSE_S = 2.0
"""Seconds between a rank's pulses (and its looks at its peers')."""


@dataclass
class PeerSeen:
    """What a rank last saw of one peer's pulse file."""

    content: str | None = None
    """The file's text (``<pid> <counter> <host>``, then ``<role>`` where the job's ranks do
    different things, its index after it where the role has several processes; a second
    line ``progress <n>`` where the rank reports its work, :class:`Progress`); None before
    the peer first pulsed."""
    changed_at: float = 0.0
    """When (this rank's monotonic clock) the content last changed."""
    done: bool = False
    """The peer announced a normal end."""
    progress: int | None = None
    """The work counter the peer last reported (:func:`progress_of`); None while it
    reports none (not a generator, or not ready to work yet)."""
    progress_at: float = 0.0
    """When (this rank's monotonic clock) ``progress`` last changed."""


def progress_of(pulse: str | None) -> int | None:
    """The work counter in a pulse file's text (pure): its second line, ``progress <n>``;
    None when there is none (a rank that reports no progress) or it cannot be read."""
    lines = (pulse or "").splitlines()
    parts = lines[1].split() if len(lines) > 1 else []
    if len(parts) == 2 and parts[0] == "progress" and parts[1].isdigit():
        return int(parts[1])
    return None


def lost_peers(seen: dict[int, PeerSeen], now: float, timeout_s: float) -> list[int]:
    """The peers whose pulse has not moved for ``timeout_s`` (pure). A peer that never
    pulsed is not judged here (starting up is the process group's to time out), nor one
    that ended normally."""
    return sorted(
        rank
        for rank, s in seen.items()
        if s.content is not None and not s.done and now - s.changed_at > timeout_s
    )


def describe(rank: int, pulse: str | None) -> str:
    """A rank as a reason names it, from its pulse file's text (pure): ``generator (rank 1
    on node2)``, ``generator 1 (rank 3 on node2)`` when the pulse says its role (a run with
    generator processes: ``Role.label``), ``rank 1`` when it does not (every rank trains)."""
    lines = (pulse or "").splitlines()
    parts = lines[0].split() if lines else []  # the second line is the progress
    if len(parts) < 4:
        return f"rank {rank}"
    return f"{' '.join(parts[3:])} (rank {rank} on {parts[2]})"


def lost_reason(
    ranks: list[int],
    timeout_s: float,
    step: int,
    waiting: str | None = None,
    names: dict[int, str] | None = None,
) -> str:
    """The one line progress.json gets (pure); ``waiting``: where the watching rank was
    blocked (:func:`waiting_in`); ``names``: how to name a rank (:func:`describe`; else
    ``rank R``)."""
    who = ", ".join((names or {}).get(r, f"rank {r}") for r in ranks)
    where = f"; the others waited in {waiting}" if waiting else ""
    return (
        f"{who} stopped answering (no pulse for {timeout_s:g} s) at step {step}{where}: a "
        "hung or lost process; the job ends so that it can be resubmitted from the last "
        "checkpoint"
    )


def waiting_in(entries: list[dict]) -> str | None:
    """Where this rank waits, from its flight recorder's entries (pure): the oldest
    collective not completed, by name and the two innermost lines of ours that issued it,
    e.g. ``nccl:all_reduce from train/distributed/dist.py:91 (all_reduce_max) <
    train/rollout/collect.py:94 (collect)``; None if none is open."""
    open_ = [e for e in entries if e.get("state") != "completed" and not e.get("retired")]
    if not open_:
        return None
    e = open_[0]
    what = str(e.get("profiling_name") or "a collective")
    ours = [f for f in e.get("frames", []) if "grpo_hpc" in str(f.get("filename", ""))]
    if not ours:
        return what
    # the innermost two of our frames: a helper (dist.barrier) and what called it
    where = [f"{str(f['filename']).split('grpo_hpc/')[-1]}:{f.get('line')} ({f.get('name')})"
             for f in ours[:2]]  # fmt: skip
    return f"{what} from " + " < ".join(where)


@dataclass
class Liveness:
    """The pulse thread of one rank. ``on_lost`` runs in that thread with the lost ranks;
    it is expected not to return (it records the reason and exits the process)."""

    directory: Path
    rank: int
    world_size: int
    timeout_s: float
    on_lost: Callable[[list[int]], None]
    pulse_s: float = PULSE_S
    role: str | None = None
    """What this rank does, written in its pulse (``generator``, ``generator 1``,
    ``trainer 0``: ``Role.label``) where the job's ranks do different things; None: every
    rank trains."""
    progress: Progress | None = None
    """This rank's work counter, written in its pulse (a generator's); None: none."""
    progress_timeout_s: float = 0.0
    """How long a peer this rank waits on (:meth:`waiting_on`) may make no progress
    (``rollout.progress_timeout_s``; 0: not judged)."""
    on_stuck: Callable[[int, float, str], None] | None = None
    """Runs in the pulse thread with the stuck peer, how long it has been stuck and what
    this rank waited for; expected not to return, as ``on_lost``."""
    _waiting: tuple[int, str, float] | None = field(default=None, init=False, repr=False)
    """The peer this rank waits on, for what, and since when (set by the main thread, read
    by the pulse thread: one tuple assignment)."""
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _seen: dict[int, PeerSeen] = field(default_factory=dict, init=False, repr=False)
    _count: int = field(default=0, init=False, repr=False)

    def path(self, rank: int) -> Path:
        return self.directory / f"rank{rank}"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._seen = {r: PeerSeen() for r in range(self.world_size) if r != self.rank}
        self._pulse()
        self._thread = threading.Thread(target=self._loop, name="grpo-liveness", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """A normal end: peers stop watching this rank, then the thread stops."""
        try:
            _write(self.directory / f"rank{self.rank}.done", f"{os.getpid()}\n")
        except OSError:
            pass  # the run directory went away; nobody is left to watch
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.pulse_s)

    @contextlib.contextmanager
    def waiting_on(self, rank: int, what: str) -> Iterator[None]:
        """While the body blocks on ``rank`` (for ``what``: ``step 7's rollouts``), the
        pulse thread judges that peer's progress (:func:`stuck_for`)."""
        self._waiting = (rank, what, time.monotonic())
        try:
            yield
        finally:
            self._waiting = None

    def _loop(self) -> None:
        while not self._stop.wait(self.pulse_s):
            try:
                self._pulse()
                now = time.monotonic()
                lost = self._look(now)
            except OSError:
                continue  # a full or flaky filesystem: the next pulse tries again
            if lost:
                self.on_lost(lost)
                return
            if (stuck := self._stuck(now)) is not None and self.on_stuck is not None:
                self.on_stuck(*stuck)
                return

    def _stuck(self, now: float) -> tuple[int, float, str] | None:
        """The peer this rank waits on, if its progress stopped for the limit: (its rank,
        seconds stuck, what this rank waited for)."""
        waiting = self._waiting
        if waiting is None:
            return None
        rank, what, since = waiting
        s = self._seen.get(rank)
        if s is None or s.done:
            return None
        idle = stuck_for(s.progress, s.progress_at, since, now, self.progress_timeout_s)
        return None if idle is None else (rank, idle, what)

    def _pulse(self) -> None:
        self._count += 1
        role = f" {self.role}" if self.role else ""
        work = self.progress.value if self.progress is not None else None
        progress = f"progress {work}\n" if work is not None else ""
        _write(self.path(self.rank), f"{os.getpid()} {self._count} {HOST}{role}\n{progress}")

    def local_pid(self, rank: int) -> int | None:
        """A lost peer's pid when it runs on this host (None elsewhere, or unknown): torchrun
        gives a stopped worker 30 s to answer SIGTERM before it kills it; the watcher need
        not wait for that."""
        s = self._seen.get(rank)
        parts = (s.content or "").split() if s is not None else []  # pid, counter, host first
        if len(parts) >= 3 and parts[2] == HOST and parts[0].isdigit():
            return int(parts[0])
        return None

    def name(self, rank: int) -> str:
        """How a reason names a peer (:func:`describe`, from its last pulse)."""
        s = self._seen.get(rank)
        return describe(rank, s.content if s is not None else None)

    def _look(self, now: float) -> list[int]:
        for rank, s in self._seen.items():
            if s.done:
                continue
            if (self.directory / f"rank{rank}.done").exists():
                s.done = True
                continue
            try:
                content = self.path(rank).read_text()
            except FileNotFoundError:
                continue
            if content != s.content:
                s.content, s.changed_at = content, now
                progress = progress_of(content)
                if progress != s.progress:
                    s.progress, s.progress_at = progress, now
        return lost_peers(self._seen, now, self.timeout_s)


def _write(path: Path, text: str) -> None:
    """Temp file then rename: a peer never reads half a pulse."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def clear_other_launches(alive_dir: Path, launch: str) -> None:
    """Rank 0 at start: the pulse folders of earlier launches of this run are stale."""
    if not alive_dir.is_dir():
        return
    for d in alive_dir.iterdir():
        if d.name != launch:
            shutil.rmtree(d, ignore_errors=True)
