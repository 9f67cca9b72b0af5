"""``grpo-ckpt``: the command line (argparse, examples, exit codes); the work is in
:mod:`grpo_hpc.export.checkpoints`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from rich.console import Console

from grpo_hpc.cli.common import EXIT_CODES_HELP, Parser, run_cli
from grpo_hpc.core.errors import ConfigError, ExitCode
from grpo_hpc.core.manifest import COMPLETE_MARKER, verify_checkpoint
from grpo_hpc.core.paths import RunPaths, default_logs_root
from grpo_hpc.core.runs import resolve_run
from grpo_hpc.export.checkpoints import build_list_table, fmt_bytes, list_checkpoints

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
