"""grpo-ckpt: list and verify a run's checkpoints.

The manifest itself (what the trainer writes, what counts as complete, the full
verification) lives in :mod:`grpo_hpc.core.manifest`; this module is its command line.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from grpo_hpc.core.manifest import COMPLETE_MARKER, MANIFEST
from grpo_hpc.core.paths import RunPaths


@dataclass
class CheckpointInfo:
    """One checkpoint directory, as ``grpo-ckpt list`` shows it."""

    step: int
    """Training step."""
    path: str
    """Directory."""
    complete: bool
    """Has the COMPLETE marker (only complete checkpoints are resumed from)."""
    manifest: bool
    """Has a manifest.json."""
    size_bytes: int
    """Total size of its files."""
    mtime: float
    """When it was completed (COMPLETE marker), else the directory's mtime."""
    format: str = "-"
    """gathered or sharded (with the world size that wrote it), from the manifest; - if
    the manifest does not say."""


def list_checkpoints(paths: RunPaths) -> list[CheckpointInfo]:
    """Every step-N directory of a run, complete or not, by step."""
    out = []
    for step in paths.checkpoint_steps(complete_only=False):
        d = paths.checkpoint(step)
        marker = d / COMPLETE_MARKER
        try:  # a live run's trainer can prune it meanwhile (training.keep_last)
            size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
            stamp = (marker if marker.exists() else d).stat().st_mtime
        except FileNotFoundError:
            continue  # gone: not a checkpoint of the run any more
        info = CheckpointInfo(step, str(d), marker.exists(), (d / MANIFEST).exists(), size, stamp)
        info.format = _format_label(d)
        out.append(info)
    return out


def _format_label(ckpt_dir: Path) -> str:
    try:
        manifest = json.loads((ckpt_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "-"
    fmt = manifest.get("format") if isinstance(manifest, dict) else None
    if not isinstance(fmt, str):
        return "-"
    world = manifest.get("world_size")
    return f"{fmt} x{world}" if fmt == "sharded" and isinstance(world, int) else fmt


def fmt_bytes(n: int) -> str:
    """1.5 GiB-style size."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover


def build_list_table(run: str, infos: list[CheckpointInfo]) -> Table:
    """The ``grpo-ckpt list`` table (pure)."""
    table = Table(title=f"checkpoints of {run}: {len(infos)}", title_justify="left", box=None)
    for name in ("STEP", "TIME", "SIZE", "FORMAT", "COMPLETE", "MANIFEST"):
        table.add_column(name, justify="right" if name in ("STEP", "SIZE") else "left")
    for c in infos:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c.mtime))
        table.add_row(
            str(c.step),
            when,
            fmt_bytes(c.size_bytes),
            c.format,
            "yes" if c.complete else "NO",
            "yes" if c.manifest else "-",
            style="" if c.complete else "yellow",
        )
    return table
