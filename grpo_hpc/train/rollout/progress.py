"""Whether the generation a trainer waits for is moving: the counter its working thread
advances (:class:`Progress`) and the pure decision on it (:func:`stuck_for`), shared by the
thread placement (the main thread judges its decode thread, :mod:`pipeline`) and the split
placement (a trainer's pulse thread judges its generator's counter, carried in the
generator's pulse: grpo_hpc.train.supervision.liveness). ``rollout.progress_timeout_s``
is the limit; docs/async.md says why 600 s.
"""

from __future__ import annotations

import socket

HOST = socket.gethostname()
"""This node's name, as reasons give it."""


class Progress:
    """A process's work counter, written in its pulse: None until :meth:`start` (a
    generator loading its model is not judged by it: a load is the monitor's
    ``step0_timeout``'s), then advanced by :meth:`bump` from the working thread. Read
    from the pulse thread; an int assignment under the GIL needs no lock, and a bump lost
    to a race would only be one tick fewer."""

    def __init__(self) -> None:
        self.value: int | None = None

    def start(self) -> None:
        self.value = 0

    def bump(self) -> None:
        if self.value is not None:
            self.value += 1


def stuck_for(
    progress: int | None, progress_at: float, since: float, now: float, limit_s: float
) -> float | None:
    """How long a peer's work has not moved while this rank waited for it, when that is
    over ``limit_s``; None otherwise (pure). ``progress``: the peer's counter (None: it
    reports none, not judged); ``progress_at``: when it last moved; ``since``: when this
    rank began waiting (a peer idle before that was waiting for this rank, not stuck);
    ``limit_s`` 0: off."""
    if progress is None or limit_s <= 0:
        return None
    idle = now - max(progress_at, since)
    return idle if idle > limit_s else None


def stuck_reason(name: str, idle_s: float, waiter: str, what: str) -> str:
    """The one line progress.json gets for a peer that made no progress (pure), e.g.
    ``generator (rank 1 on node2) made no progress for 600 s while trainer 0 waited for
    step 7's rollouts``."""
    return (
        f"{name} made no progress for {idle_s:.0f} s while {waiter} waited for {what} "
        "(rollout.progress_timeout_s): alive but stuck (a hung kernel or collective, a "
        "deadlock, a reward that never returns); the job ends so that it can be resubmitted "
        "from the last checkpoint"
    )
