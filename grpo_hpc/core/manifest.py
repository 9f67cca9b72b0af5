"""A checkpoint's manifest: what the trainer writes before COMPLETE, what resume and
``grpo-ckpt verify`` check.

``checkpoints/step-N/manifest.json`` records every file with size and sha256::

    {"step": N, "format": "gathered", "world_size": 1,
     "files": {"model.pt": {"size": 123, "sha256": "ab12..."}, ...}}

A checkpoint counts (:func:`is_complete`) only when it has the ``COMPLETE`` marker *and* a
manifest that lists the model and optimizer files of its format, present with their
recorded sizes: a directory with the marker but no weights (its files deleted under a
trainer that then wrote an empty manifest) is never resumed from. :func:`verify_checkpoint`
is the full check (sha256 of every byte), used by ``grpo-ckpt verify`` and by the trainer
before it reports a run finished. Standard library only (paths.py imports it), but for
DCP's metadata reader on sharded checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from grpo_hpc.core.errors import GrpoError
from grpo_hpc.core.fsutil import atomic_write_json, fsync_dir

COMPLETE_MARKER = "COMPLETE"
MANIFEST = "manifest.json"
DCP_DIR = "dcp"
NOT_LISTED = frozenset({MANIFEST, COMPLETE_MARKER})
STEP_RE = re.compile(r"step-(\d+)$")
CHUNK = 1 << 20


def file_digest(path: Path) -> tuple[int, str]:
    """(size, sha256 hex) of a file, read in 1 MiB chunks."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def file_digests(paths: list[Path]) -> dict[Path, tuple[int, str]]:
    """:func:`file_digest` of each file, several at once: hashlib and file reads release the
    GIL, so threads hash side by side (a checkpoint's model.pt and optim.pt, or a sharded
    one's shards, took 1.6-1.9 s one after another on a 2x H100 node)."""
    if len(paths) < 2:
        return {p: file_digest(p) for p in paths}
    workers = min(len(paths), os.cpu_count() or 1, 8)
    with ThreadPoolExecutor(workers, thread_name_prefix="grpo-sha256") as pool:
        return dict(zip(paths, pool.map(file_digest, paths), strict=True))


def _step_of(ckpt_dir: Path) -> int | None:
    m = STEP_RE.search(ckpt_dir.name)  # step-N, also the trainer's .tmp-step-N
    return int(m.group(1)) if m else None


def write_manifest(
    ckpt_dir: Path, step: int | None = None, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Record every file under ``ckpt_dir`` (size, sha256) in its manifest.json, atomically.

    ``step`` defaults to the N of a ``step-N`` / ``.tmp-step-N`` directory name; ``extra``
    adds keys (the trainer's ``format`` and ``world_size``).
    """
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():  # deleted under us: never write a manifest of nothing
        raise CheckpointIncompleteError(f"{ckpt_dir} vanished before its manifest was written")
    listed = [
        p
        for p in sorted(ckpt_dir.rglob("*"))
        if p.is_file() and p.relative_to(ckpt_dir).as_posix() not in NOT_LISTED
    ]
    files: dict[str, dict[str, Any]] = {
        p.relative_to(ckpt_dir).as_posix(): {"size": size, "sha256": sha}
        for p, (size, sha) in file_digests(listed).items()
    }
    manifest = {"step": _step_of(ckpt_dir) if step is None else step, **(extra or {})}
    manifest["files"] = files
    if manifest.get("format") is not None:  # a trainer checkpoint: its weights must be there
        _refuse_incomplete(ckpt_dir, manifest_problems(ckpt_dir, manifest))
    atomic_write_json(ckpt_dir / MANIFEST, manifest)
    return manifest


class CheckpointIncompleteError(GrpoError):
    """A checkpoint about to be marked COMPLETE lacks files it must have (they were deleted
    under the writer, e.g. by a second trainer on the same run directory)."""


def _refuse_incomplete(ckpt_dir: Path, problems: list[str]) -> None:
    if problems:
        raise CheckpointIncompleteError(
            f"checkpoint {ckpt_dir.name} is not complete ({'; '.join(problems[:3])}): not "
            "marking it COMPLETE (is a second trainer writing this run directory?)"
        )


def _weights_of(manifest: dict[str, Any]) -> list[str]:
    """The files a trainer checkpoint must list: those of its format (an old manifest
    without ``format``: model.pt + optim.pt, or a DCP directory's .metadata)."""
    files = manifest.get("files") or {}
    fmt, world = manifest.get("format"), manifest.get("world_size")
    if fmt in ("gathered", "sharded") and isinstance(world, int) and world >= 1:
        return required_files(fmt, world)
    if f"{DCP_DIR}/.metadata" in files:
        return [f"{DCP_DIR}/.metadata"]
    return ["model.pt", "optim.pt"]


def manifest_problems(ckpt_dir: Path, manifest: Any) -> list[str]:
    """Cheap checks (no hashing) that a manifest describes a whole checkpoint: it lists the
    model/optimizer files of its format, and every listed file is present with its size."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        return [f"{MANIFEST} lists no files"]
    problems = [f"{rel}: not in {MANIFEST}" for rel in _weights_of(manifest) if rel not in files]
    for rel, meta in files.items():
        size = meta.get("size") if isinstance(meta, dict) else None
        actual = _file_size(ckpt_dir / rel)
        if actual is None:
            problems.append(f"{rel}: missing")
        elif actual != size:
            problems.append(f"{rel}: size {actual} != {size} in {MANIFEST}")
    return problems


def _file_size(path: Path) -> int | None:
    """A regular file's size, None where there is none. One stat: a checkpoint can be
    pruned (training.keep_last) while a monitor or a status reads it, and a file seen by a
    first look may be gone by a second."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def read_manifest(ckpt_dir: Path) -> dict[str, Any] | None:
    """The parsed manifest.json of a checkpoint directory, or None (missing, unreadable)."""
    try:
        data = json.loads((Path(ckpt_dir) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_complete(ckpt_dir: Path) -> bool:
    """Whether resume may use a checkpoint: the COMPLETE marker, and a manifest that lists
    the weights, all present with their recorded sizes (cheap: no hashing)."""
    ckpt_dir = Path(ckpt_dir)
    if not (ckpt_dir / COMPLETE_MARKER).is_file():
        return False
    manifest = read_manifest(ckpt_dir)
    return manifest is not None and not manifest_problems(ckpt_dir, manifest)


def mark_complete(ckpt_dir: Path, stamp: str) -> None:
    """Write the COMPLETE marker, after checking (again, on disk) that the manifest lists
    the weights and they are all there. Never creates the directory: if it was deleted
    under the writer, this fails instead of leaving a marker with nothing behind it."""
    ckpt_dir = Path(ckpt_dir)
    _refuse_incomplete(ckpt_dir, manifest_problems(ckpt_dir, read_manifest(ckpt_dir) or {}))
    with open(ckpt_dir / COMPLETE_MARKER, "x", encoding="utf-8") as f:
        f.write(stamp)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(ckpt_dir)


def verify_checkpoint(ckpt_dir: Path) -> list[str]:
    """Problems of one checkpoint against its manifest; [] when it is intact."""
    ckpt_dir = Path(ckpt_dir)
    try:
        manifest = json.loads((ckpt_dir / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [f"no {MANIFEST}"]
    except (OSError, ValueError) as e:
        return [f"unreadable {MANIFEST}: {e}"]
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        return [f"{MANIFEST} has no 'files' mapping"]
    problems = [] if files else [f"{MANIFEST} lists no files"]
    step = _step_of(ckpt_dir)
    if step is not None and manifest.get("step") != step:
        problems.append(f"{MANIFEST} says step {manifest.get('step')}, directory is step {step}")
    checks = {rel: _check_file(ckpt_dir, rel, meta) for rel, meta in sorted(files.items())}
    hashed = file_digests([ckpt_dir / rel for rel, found in checks.items() if found is None])
    for rel, found in checks.items():
        if found is None:
            found = _sha_problem(rel, hashed[ckpt_dir / rel][1], files[rel]["sha256"])
        problems += found
    return problems + format_problems(ckpt_dir, manifest)


def required_files(fmt: str, world_size: int) -> list[str]:
    """The files a trainer checkpoint of this format and world size must have (pure)."""
    per_rank = [f"rng-rank{r}.pt" for r in range(world_size)]
    weights = {"gathered": ["model.pt", "optim.pt"], "sharded": [f"{DCP_DIR}/.metadata"]}[fmt]
    return ["trainer.pt", *weights, *per_rank]


def format_problems(ckpt_dir: Path, manifest: dict[str, Any]) -> list[str]:
    """What a checkpoint lacks for its recorded format (gathered: model.pt + optim.pt;
    sharded: a DCP directory whose .metadata points only at listed, long-enough shards).
    A manifest without ``format`` (not written by the trainer) gets no such checks."""
    fmt, world = manifest.get("format"), manifest.get("world_size")
    if fmt is None:
        return []
    if fmt not in ("gathered", "sharded"):
        return [f"{MANIFEST}: unknown format {fmt!r} (gathered or sharded)"]
    if not isinstance(world, int) or world < 1:
        return [f"{MANIFEST}: world_size {world!r} is not a positive integer"]
    files = manifest["files"]
    need = required_files(fmt, world)
    problems = [
        f"{rel}: missing ({fmt} checkpoint of {world} ranks)" for rel in need if rel not in files
    ]
    if fmt == "sharded" and f"{DCP_DIR}/.metadata" in files:
        problems += dcp_problems(ckpt_dir / DCP_DIR, files)
    return problems


def dcp_problems(dcp_dir: Path, files: dict[str, Any]) -> list[str]:
    """Every byte range DCP's .metadata refers to lies in a shard file of the manifest."""
    from torch.distributed.checkpoint import FileSystemReader  # only for sharded checkpoints

    try:
        meta = FileSystemReader(str(dcp_dir)).read_metadata()
    except Exception as e:  # noqa: BLE001 - any unreadable metadata is the finding
        return [f"{DCP_DIR}/.metadata: unreadable ({type(e).__name__}: {e})"]
    problems: set[str] = set()
    for info in (meta.storage_data or {}).values():
        rel = f"{DCP_DIR}/{info.relative_path}"
        entry = files.get(rel)
        if entry is None:
            problems.add(f"{rel}: named by {DCP_DIR}/.metadata but not in the manifest")
        elif info.offset + info.length > entry.get("size", 0):
            problems.add(f"{rel}: shorter than {DCP_DIR}/.metadata says")
    return sorted(problems)


def _check_file(ckpt_dir: Path, rel: str, meta: Any) -> list[str] | None:
    """A file's problems short of its contents; None when only its sha256 is left to check."""
    if not isinstance(meta, dict) or "size" not in meta or "sha256" not in meta:
        return [f"{rel}: manifest entry lacks size/sha256"]
    if Path(rel).is_absolute() or ".." in Path(rel).parts:
        return [f"{rel}: path escapes the checkpoint directory"]
    actual = _file_size(ckpt_dir / rel)
    if actual is None:
        return [f"{rel}: missing"]
    if actual != meta["size"]:
        return [f"{rel}: size {actual} != {meta['size']} in the manifest"]
    return None


def _sha_problem(rel: str, actual: str, listed: str) -> list[str]:
    return [] if actual == listed else [f"{rel}: sha256 differs from the manifest"]
