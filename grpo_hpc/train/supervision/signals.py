"""The trainer's stop signals, and the handler the entry point installs before its first
import so that a signal arriving while torch loads is remembered, not lost."""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)
"""Slurm's time-limit warning (--signal), preemption and scancel: checkpoint, exit 5."""

_received: list[int] = []


def _remember(signum: int, frame: object) -> None:
    _received.append(signum)


def install_early() -> None:
    """Remember stop signals until the trainer installs its own handlers. (torchrun starts
    workers with USR1/USR2 ignored, so without this one a signal during imports is lost.)"""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _remember)


def pending() -> int | None:
    """The first stop signal received since :func:`install_early`, if any."""
    return _received[0] if _received else None
