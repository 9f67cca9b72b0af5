"""Atomic file writes: temp file in the same directory, fsync, rename.

A reader (the monitor, grpo-status, a resumed attempt) never sees a half-written
file: it sees the old content or the new one.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old or the new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def fsync_file(path: Path) -> None:
    """Wait until ``path``'s data is on the disk (a file written by a library that does not
    sync, such as ``torch.save``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make ``path``'s entries (a rename into it, a new file) durable, where the filesystem
    can: some (FUSE mounts, a few network filesystems) refuse fsync on a directory, and a
    checkpoint must not fail for that."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Text variant of :func:`atomic_write_bytes` (UTF-8)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def append_jsonl(path: Path, obj: Any) -> None:
    """Append one JSON line. A single small ``write`` on an O_APPEND file is atomic
    enough for line-oriented logs read by tools that skip a torn last line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(obj, sort_keys=True) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL file, skipping a torn (unparseable) last line."""
    path = Path(path)
    if not path.exists():
        return []
    rows: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def tail_jsonl(path: Path, max_bytes: int = 32768) -> list[dict[str, Any]]:
    """The last lines of a JSONL file without reading all of it (torn lines skipped)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - max_bytes))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except FileNotFoundError:
        return []
    if size > max_bytes:
        lines = lines[1:]  # the first line is cut
    out = []
    for line in filter(None, (raw.strip() for raw in lines)):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
