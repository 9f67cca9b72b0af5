"""``grpo-status``: the command line (argparse, examples, exit codes); the work is in
:mod:`grpo_hpc.status.report`."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

from rich.console import Console, Group
from rich.table import Table

from grpo_hpc.cli.common import EXIT_CODES_HELP, Parser, run_cli
from grpo_hpc.core import events as event_log
from grpo_hpc.core.errors import ConfigError, ExitCode
from grpo_hpc.core.fsutil import read_jsonl
from grpo_hpc.core.paths import RunPaths, logs_root
from grpo_hpc.core.runs import (
    resolve_run,
)
from grpo_hpc.monitor.decision import MonitorPolicy
from grpo_hpc.status.report import collect_detail, collect_rows, last_eval_samples, run_beta
from grpo_hpc.status.view import (
    FULL_WIDTH,
    build_details,
    build_table,
    eval_samples_lines,
    row_flags,
)

EXAMPLES = """examples:
  grpo-status                       # every run under logs/, one line each
  grpo-status --watch               # refresh every 5 s (Ctrl-C to leave)
  grpo-status --json | jq '.[] | select(.flags != [])'
  grpo-status gsm8k-a               # one run: jobs, events, health, last sample, rewards
  grpo-status gsm8k-a --plot reward.png
  grpo-status gsm8k-a --samples     # the last evaluation's worst and best completions
  grpo-status gsm8k-a gsm8k-b       # several named runs, one line each

FLAG: stalled (heartbeat older than --heartbeat-timeout), zero reward, failed (its exit
class and reason, cut to fit; `grpo-status RUN` shows it whole), backoff, stopped (circuit
breaker / config error) and budget exhausted (from the monitor's events); where the monitor
logged no decision about a failed run, what it would do.
"""


def _parser() -> Parser:
    p = Parser(
        prog="grpo-status",
        description="Show GRPO runs: Slurm state, training progress, reward, throughput, flags.",
        epilog=EXAMPLES + "\n" + EXIT_CODES_HELP,
    )
    p.add_argument("runs", nargs="*", metavar="RUN", help="runs to show (default: all)")
    p.add_argument("--logs", type=Path, help="runs directory (default: $GRPO_HPC_LOGS or ./logs)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=5.0,
        metavar="S",
        help="refresh every S seconds (default 5)",
    )
    p.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="write RUN's curves (reward, correctness, length, accuracy; KL to the reference "
        "when algo.beta > 0) as a PNG",
    )
    p.add_argument(
        "--samples",
        action="store_true",
        help="RUN's last evaluation: its worst and best completions (eval_samples/)",
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=float,
        metavar="S",
        default=MonitorPolicy().heartbeat_timeout_s,
        help="stalled flag threshold",
    )
    return p


def _status(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    root = logs_root(args.logs, must_exist=True)
    single = resolve_run(args.runs[0], root) if len(args.runs) == 1 else None
    if args.plot is not None:
        if single is None:
            raise ConfigError("--plot needs exactly one RUN")
        from grpo_hpc.status.plot import plot_data, write_png

        metrics, jobs = read_jsonl(single.metrics), read_jsonl(single.jobs)
        events = event_log.read(single.events)
        data = plot_data(metrics, jobs, beta=run_beta(single), events=events)
        write_png(data, args.plot, single.name)
        print(f"wrote {args.plot}")
        return ExitCode.OK
    if args.samples:
        if single is None:
            raise ConfigError("--samples needs exactly one RUN")
        return _samples(single)
    if args.json:
        now, rows = time.time(), collect_rows(root, args.runs)
        hb = args.heartbeat_timeout
        out = [{**dataclasses.asdict(r), "flags": row_flags(r, now, hb)} for r in rows]
        print(json.dumps(out, indent=2))
        return ExitCode.OK

    def render() -> Table | Group:
        if single is not None:
            return build_details(collect_detail(single), time.time())
        rows = collect_rows(root, args.runs)
        return build_table(rows, time.time(), args.heartbeat_timeout, console.width)

    # A terminal gets what fits its width; a pipe or file gets every column, like squeue.
    console = Console() if sys.stdout.isatty() else Console(width=FULL_WIDTH + 40)
    if args.watch is None:
        console.print(render())
        return ExitCode.OK
    from rich.live import Live

    with Live(render(), console=console, auto_refresh=False) as live:
        try:
            while True:
                time.sleep(args.watch)
                live.update(render(), refresh=True)
        except KeyboardInterrupt:
            return ExitCode.OK


def _samples(paths: RunPaths) -> int:
    """Print the run's last evaluation's worst and best completions, cut to the terminal."""
    got = last_eval_samples(paths)
    if got is None:
        print(
            f"{paths.name}: no evaluation samples yet (written at each evaluation: "
            "training.eval_every)"
        )
        return ExitCode.OK
    width = shutil.get_terminal_size((100, 24)).columns if sys.stdout.isatty() else 100
    print("\n".join(eval_samples_lines(*got, width=width)))
    return ExitCode.OK


def main(argv: list[str] | None = None) -> int:
    """Console entry point ``grpo-status``."""
    return run_cli("grpo-status", lambda: _status(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
