"""Bubblewrap around the code sandbox when it works here: read-only root, private /tmp, no
network, its own PID namespace. Probed once per process; the audit-hook sandbox alone is
the fallback (no bwrap installed, or user namespaces disabled)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Isolation:
    """Which sandbox runs the code reward."""

    name: str
    """``bwrap`` or ``audit-hook``."""
    detail: str
    """One line: what it isolates, or why bwrap is not used."""


HIDDEN = ("/tmp",)
"""Directories the sandbox replaces with empty ones (``--tmpfs``)."""


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def environment_paths(
    executable: str = sys.executable,
    prefixes: tuple[str, ...] = (sys.prefix, sys.base_prefix, sys.exec_prefix),
    search_path: tuple[str, ...] = tuple(sys.path),
) -> list[str]:
    """The interpreter's files that a private /tmp would hide: its prefix, base prefix,
    resolved executable and ``sys.path`` entries that live under a hidden directory (a venv
    staged on node-local /tmp, say). Elsewhere the read-only root already shows them."""
    exe = os.path.realpath(executable)
    found = [*prefixes, os.path.dirname(executable), os.path.dirname(exe), *search_path]
    out: list[str] = []
    for p in found:
        if p and os.path.isabs(p) and os.path.exists(p) and p not in out:
            if any(_under(p, h) and p != h for h in HIDDEN):
                out.append(p)
    return sorted(out)


def command(
    work_dir: str, argv: list[str], bwrap: str = "bwrap", keep: list[str] | None = None
) -> list[str]:
    """``argv`` inside bubblewrap, with only ``work_dir`` writable (pure); ``keep``: paths
    under the private /tmp to show read-only (default: :func:`environment_paths`)."""
    binds = []
    for p in environment_paths() if keep is None else keep:
        binds += ["--ro-bind", p, p]
    return [
        bwrap,
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--tmpfs", "/tmp",
        *binds,  # the interpreter and its environment, wherever it is installed
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
    with tempfile.TemporaryDirectory(prefix="grpo-bwrap-probe-") as work:
        probe = command(work, [sys.executable, "-I", "-S", "-c", "pass"], bwrap=path)
        try:
            proc = subprocess.run(probe, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            return Isolation("audit-hook", f"bwrap did not start: {e}")
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return Isolation("audit-hook", f"bwrap unusable here: {why}")
    return Isolation("bwrap", "read-only root, private /tmp, no network, own PID namespace")
