"""grpo-ckpt: list and verify a run's checkpoints; the manifest the trainer writes.

A checkpoint ``checkpoints/step-N/`` counts once its ``COMPLETE`` marker exists. Its
``manifest.json`` records every file with size and sha256::

    {"step": N, "files": {"model.safetensors": {"size": 123, "sha256": "ab12..."}, ...}}

The trainer calls :func:`write_manifest` on the finished directory (before the COMPLETE
marker); :func:`verify_checkpoint` checks a directory against it.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from grpo_hpc.cli_common import EXIT_CODES_HELP, Parser, run_cli
from grpo_hpc.errors import ConfigError, ExitCode
from grpo_hpc.fsutil import atomic_write_json
from grpo_hpc.paths import COMPLETE_MARKER, RunPaths, default_logs_root
from grpo_hpc.runs import resolve_run

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
    files: dict[str, dict[str, Any]] = {}
    for p in sorted(ckpt_dir.rglob("*")):
        rel = p.relative_to(ckpt_dir).as_posix()
        if p.is_file() and rel not in NOT_LISTED:
            size, sha = file_digest(p)
            files[rel] = {"size": size, "sha256": sha}
    manifest = {"step": _step_of(ckpt_dir) if step is None else step, **(extra or {})}
    manifest["files"] = files
    atomic_write_json(ckpt_dir / MANIFEST, manifest)
    return manifest


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
    for rel, meta in sorted(files.items()):
        problems += _check_file(ckpt_dir, rel, meta)
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


def _check_file(ckpt_dir: Path, rel: str, meta: Any) -> list[str]:
    if not isinstance(meta, dict) or "size" not in meta or "sha256" not in meta:
        return [f"{rel}: manifest entry lacks size/sha256"]
    if Path(rel).is_absolute() or ".." in Path(rel).parts:
        return [f"{rel}: path escapes the checkpoint directory"]
    path = ckpt_dir / rel
    if not path.is_file():
        return [f"{rel}: missing"]
    actual = path.stat().st_size
    if actual != meta["size"]:
        return [f"{rel}: size {actual} != {meta['size']} in the manifest"]
    if file_digest(path)[1] != meta["sha256"]:
        return [f"{rel}: sha256 differs from the manifest"]
    return []


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
        size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
        stamp = (marker if marker.exists() else d).stat().st_mtime
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


EXAMPLES = """examples:
  grpo-ckpt list gsm8k-a              # step, time, size, format, complete or not
  grpo-ckpt list gsm8k-a --json
  grpo-ckpt verify gsm8k-a            # every complete checkpoint against its manifest
  grpo-ckpt verify gsm8k-a --step 200
  grpo-ckpt verify logs/gsm8k-a       # a run directory path works too

verify exits 1 when a checkpoint is bad (no manifest.json, a missing file, a size or
sha256 mismatch); incomplete checkpoints (no COMPLETE marker) are never resumed from
and are skipped.
"""


def _parser() -> Parser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("run", metavar="RUN", help="run name (or run directory path)")
    common.add_argument(
        "--logs", type=Path, help="runs directory (default: $GRPO_HPC_LOGS or ./logs)"
    )
    epilog = EXAMPLES + "\n" + EXIT_CODES_HELP
    p = Parser(prog="grpo-ckpt", description="List and verify a run's checkpoints.", epilog=epilog)
    sub = p.add_subparsers(dest="command", required=True, metavar="{list,verify}")
    ls = sub.add_parser("list", parents=[common], help="list checkpoints", epilog=epilog)
    ls.add_argument("--json", action="store_true", help="print JSON")
    vf = sub.add_parser("verify", parents=[common], help="verify checkpoints", epilog=epilog)
    vf.add_argument("--step", type=int, help="verify only this step")
    return p


def _verify(paths: RunPaths, only: int | None) -> int:
    infos = [c for c in list_checkpoints(paths) if only is None or c.step == only]
    if only is not None and not infos:
        raise ConfigError(f"run {paths.name} has no checkpoint step-{only}")
    bad = 0
    for c in infos:
        if not c.complete:
            print(f"step-{c.step}: incomplete (no {COMPLETE_MARKER} marker), skipped")
            continue
        problems = verify_checkpoint(Path(c.path))
        bad += bool(problems)
        verdict = "BAD: " + "; ".join(problems) if problems else f"ok ({fmt_bytes(c.size_bytes)})"
        print(f"step-{c.step}: {verdict}")
    if not any(c.complete for c in infos):
        print(f"run {paths.name}: no complete checkpoints")
    return ExitCode.CRASH if bad else ExitCode.OK


def _ckpt(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    paths = resolve_run(args.run, (args.logs or default_logs_root()).resolve())
    if args.command == "verify":
        return _verify(paths, args.step)
    infos = list_checkpoints(paths)
    if args.json:
        print(json.dumps([dataclasses.asdict(c) for c in infos], indent=2))
    else:
        Console().print(build_list_table(paths.name, infos))
    return ExitCode.OK


def main(argv: list[str] | None = None) -> int:
    """Console entry point ``grpo-ckpt``."""
    return run_cli("grpo-ckpt", lambda: _ckpt(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
