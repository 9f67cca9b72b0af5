"""grpo-ckpt: list and verify a run's checkpoints.

The manifest itself (what the trainer writes, what counts as complete, the full
verification) lives in :mod:`grpo_hpc.manifest`; this module is its command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from grpo_hpc.cli_common import EXIT_CODES_HELP, Parser, run_cli
from grpo_hpc.errors import ConfigError, ExitCode
from grpo_hpc.manifest import (  # noqa: F401 - re-exported: the names grpo_hpc.ckpt had
    COMPLETE_MARKER,
    MANIFEST,
    file_digest,
    format_problems,
    required_files,
    verify_checkpoint,
    write_manifest,
)
from grpo_hpc.paths import RunPaths, default_logs_root
from grpo_hpc.runs import resolve_run


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
