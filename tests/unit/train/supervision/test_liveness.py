"""Each rank's pulse and its watch on its peers (grpo_hpc.train.supervision.liveness): the pure
decision, then two real pulse threads on real files, one of which goes silent."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from grpo_hpc.train.rollout.progress import Progress, stuck_for, stuck_reason
from grpo_hpc.train.supervision.liveness import (
    Liveness,
    PeerSeen,
    describe,
    lost_peers,
    lost_reason,
    progress_of,
    waiting_in,
)


def test_only_a_silent_peer_that_pulsed_and_did_not_end_is_lost() -> None:
    seen = {
        1: PeerSeen("10 5", changed_at=100.0),  # silent for 30 s
        2: PeerSeen("11 9", changed_at=125.0),  # pulsed 5 s ago
        3: PeerSeen(None),  # never pulsed: still starting
        4: PeerSeen("13 2", changed_at=50.0, done=True),  # ended normally
    }
    assert lost_peers(seen, now=130.0, timeout_s=20.0) == [1]
    assert lost_peers(seen, now=130.0, timeout_s=60.0) == []
    line = lost_reason([1, 3], 60.0, 12)
    assert line.startswith("rank 1, rank 3 stopped answering (no pulse for 60 s) at step 12")


def test_stuck_for_judges_only_a_reported_counter_and_only_during_the_wait() -> None:
    """The table of the pure decision: (progress, when it last moved, when the wait began,
    now, limit) -> seconds stuck, or None."""
    table = [
        # a counter still for 30 s of a 40 s wait: stuck past a 20 s limit
        ((7, 100.0, 90.0, 130.0, 20.0), 30.0),
        # the same, under a limit it has not reached
        ((7, 100.0, 90.0, 130.0, 60.0), None),
        # the counter moved 5 s ago: working
        ((7, 125.0, 90.0, 130.0, 20.0), None),
        # idle long before the wait began (it waited for this rank): counted from the wait
        ((7, 0.0, 120.0, 130.0, 20.0), None),
        ((7, 0.0, 100.0, 130.0, 20.0), 30.0),
        # no counter reported (not a generator, or still loading): never judged
        ((None, 0.0, 0.0, 1e6, 20.0), None),
        # a limit of 0: off
        ((7, 0.0, 0.0, 1e6, 0.0), None),
        # exactly at the limit: not yet
        ((7, 100.0, 90.0, 120.0, 20.0), None),
    ]
    for args, verdict in table:
        assert stuck_for(*args) == verdict, (args, verdict)


def test_the_progress_line_is_read_back_and_does_not_change_the_name() -> None:
    """The counter rides on a second line of the pulse; the first line is as before, so a
    pulse without it (an older writer, a trainer) reads as no progress."""
    pulse = "4242 17 node2 generator 1\nprogress 33\n"
    assert progress_of(pulse) == 33
    assert describe(3, pulse) == "generator 1 (rank 3 on node2)"
    assert progress_of("4242 17 node2 generator\n") is None
    assert progress_of(None) is None
    assert progress_of("4242 17 node2\nprogress x\n") is None
    line = stuck_reason("generator (rank 1 on node2)", 612.4, "trainer 0", "step 7's rollouts")
    assert line.startswith(
        "generator (rank 1 on node2) made no progress for 612 s while trainer 0 waited for "
        "step 7's rollouts"
    )


def _entry(state: str, name: str, *files: tuple[str, int, str]) -> dict:
    frames = [{"filename": f, "line": line, "name": fn} for f, line, fn in files]
    return {"state": state, "profiling_name": name, "frames": frames, "retired": False}


TORCH = ("/venv/torch/distributed/distributed_c10d.py", 3245, "all_reduce")


def test_waiting_in_names_the_oldest_open_collective_and_who_issued_it() -> None:
    done = _entry("completed", "nccl:all_gather", TORCH)
    stuck = _entry(
        "started", "nccl:all_reduce", TORCH,
        ("/x/grpo_hpc/train/distributed/dist.py", 91, "all_reduce_max"),
        ("/x/grpo_hpc/train/rollout/collect.py", 94, "collect"),
        ("/x/grpo_hpc/train/trainer.py", 392, "train_step"),
    )  # fmt: skip
    later = _entry("scheduled", "nccl:barrier", TORCH)
    assert waiting_in([done, stuck, later]) == (
        "nccl:all_reduce from train/distributed/dist.py:91 (all_reduce_max)"
        " < train/rollout/collect.py:94 (collect)"
    )
    assert waiting_in([done]) is None
    assert waiting_in([_entry("scheduled", "gloo:barrier", TORCH)]) == "gloo:barrier"
    line = lost_reason([1], 60.0, 4, "gloo:barrier")
    assert "at step 4; the others waited in gloo:barrier: a hung or lost process" in line


def _pair(tmp_path: Path, timeout_s: float) -> tuple[Liveness, Liveness, list, threading.Event]:
    lost: list[tuple[list[int], float]] = []
    called = threading.Event()

    def on_lost(ranks: list[int]) -> None:
        lost.append((ranks, time.monotonic()))
        called.set()

    a = Liveness(tmp_path, 0, 2, timeout_s, on_lost, pulse_s=0.05)
    b = Liveness(tmp_path, 1, 2, timeout_s, lambda r: None, pulse_s=0.05)
    return a, b, lost, called


def _until(cond, what: str, deadline_s: float = 60.0) -> None:
    """Poll ``cond`` until it holds (a deadline only a hung thread misses)."""
    end = time.monotonic() + deadline_s
    while not cond():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.01)


def _count_seen(a: Liveness, rank: int) -> int:
    """The pulse counter of ``rank`` as ``a`` last read it (0: never)."""
    content = a._seen.get(rank, PeerSeen()).content
    return int(content.split()[1]) if content else 0


TIMEOUT_S = 2.0
"""The peer timeout of the pair: 40 of their pulses; a loaded machine delays a pulse by
milliseconds, not by this."""


def test_a_peer_that_goes_silent_is_reported(tmp_path: Path) -> None:
    a, b, lost, called = _pair(tmp_path, timeout_s=TIMEOUT_S)
    a.start()
    b.start()
    _until(lambda: _count_seen(a, 1) >= 5, "rank 0 saw rank 1's pulse move")
    assert not called.is_set()  # both pulsing: rank 0 watches rank 1 and is content
    b._stop.set()  # rank 1 freezes (as under SIGSTOP): no pulse, no "done"
    b._thread.join()
    frozen = (tmp_path / "rank1").read_text()
    assert called.wait(60.0), "the silent peer was never reported"
    (ranks, at), seen = lost[0], a._seen[1]
    assert len(lost) == 1 and ranks == [1]  # once, and only the silent one
    # what rank 0 judged by: the frozen pulse, unchanged for the timeout by its own clock
    assert seen.content == frozen and at - seen.changed_at > TIMEOUT_S
    pid, count, host = frozen.split()  # "<pid> <counter> <host>"
    assert count.isdigit() and a.local_pid(1) == int(pid) == os.getpid()


def test_a_peer_that_ends_normally_is_not_reported(tmp_path: Path) -> None:
    a, b, _, called = _pair(tmp_path, timeout_s=0.3)
    a.start()
    b.start()
    _until(lambda: _count_seen(a, 1) >= 2, "rank 0 saw rank 1's pulse")  # it judges rank 1
    b.stop()  # writes rank1.done, then stops pulsing
    stopped = time.monotonic()
    _until(lambda: a._seen[1].done, "rank 0 read rank1.done")
    # rank 0 keeps looking well past the timeout since rank 1's last pulse ...
    _until(lambda: time.monotonic() > stopped + 3 * 0.3, "three timeouts passed")
    looks = a._count
    _until(lambda: a._count >= looks + 2, "rank 0 looked again")  # a pulse, then its look
    assert not called.is_set()  # ... and never reports it
    a.stop()
    assert (tmp_path / "rank0.done").exists()


def test_a_stuck_peer_is_reported_only_while_waited_on(tmp_path: Path) -> None:
    """Two real pulse threads: rank 1 pulses on with a progress counter that stops. Rank 0
    reports nothing while it does not wait on rank 1 (however long the counter is still),
    then, once it waits, reports rank 1 after the limit of its wait, with what it waited
    for; rank 1's pulse never stopped, so it is not lost."""
    limit_s = 0.5
    stuck: list[tuple[int, float, str, float]] = []
    called = threading.Event()

    def on_stuck(rank: int, idle_s: float, what: str) -> None:
        stuck.append((rank, idle_s, what, time.monotonic()))
        called.set()

    a = Liveness(tmp_path, 0, 2, 60.0, lambda r: None, pulse_s=0.05,
                 progress_timeout_s=limit_s, on_stuck=on_stuck)  # fmt: skip
    work = Progress()
    b = Liveness(tmp_path, 1, 2, 60.0, lambda r: None, pulse_s=0.05, progress=work)
    a.start()
    b.start()
    work.start()
    for _ in range(5):  # it works: rank 0 sees the counter move
        work.bump()
        time.sleep(0.1)
    _until(lambda: a._seen[1].progress == 5, "rank 0 read rank 1's progress")
    time.sleep(3 * limit_s)  # the counter is still, but nobody waits on rank 1
    assert not called.is_set()
    with a.waiting_on(1, "step 3's rollouts"):
        began = time.monotonic()
        assert called.wait(60.0), "the stuck peer was never reported"
    rank, idle_s, what, at = stuck[0]
    assert (rank, what) == (1, "step 3's rollouts") and idle_s > limit_s
    assert at - began > limit_s  # counted from the wait, not from the counter's last move
    assert len(stuck) == 1 and not lost_peers(a._seen, time.monotonic(), 60.0)
    b.stop()
