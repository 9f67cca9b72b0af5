"""Bubblewrap around the code sandbox when it works here: read-only root, private /tmp, no
network, its own PID namespace. Probed once per process; the audit-hook sandbox alone is
the fallback (no bwrap installed, or user namespaces disabled)."""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from dataclasses import dataclass

PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Isolation:
    """Which sandbox runs the code reward."""

    name: str
    """``bwrap`` or ``audit-hook``."""
    detail: str
    """One line: what it isolates, or why bwrap is not used."""


def command(work_dir: str, argv: list[str], bwrap: str = "bwrap") -> list[str]:
    """``argv`` inside bubblewrap, with only ``work_dir`` writable (pure)."""
    return [
        bwrap,
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--tmpfs", "/tmp",
        "--bind", work_dir, work_dir,  # after /tmp: the work dir usually lives under it
        "--unshare-all",  # network, PID, IPC, UTS, cgroup (and user where allowed)
        "--die-with-parent",
        "--new-session",
        "--chdir", work_dir,
        "--",
        *argv,
    ]  # fmt: skip


@functools.lru_cache(maxsize=1)
def detect() -> Isolation:
    """bwrap if it is on PATH and can start a process here, else the audit-hook sandbox."""
    path = shutil.which("bwrap")
    if path is None:
        return Isolation("audit-hook", "bwrap not installed (apt-get install bubblewrap)")
    probe = command("/", [sys.executable, "-I", "-S", "-c", "pass"], bwrap=path)
    try:
        proc = subprocess.run(probe, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Isolation("audit-hook", f"bwrap did not start: {e}")
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return Isolation("audit-hook", f"bwrap unusable here: {why}")
    return Isolation("bwrap", "read-only root, private /tmp, no network, own PID namespace")
