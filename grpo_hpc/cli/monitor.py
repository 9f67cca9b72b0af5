"""``grpo-monitor``: the command line (argparse, examples, exit codes); the work is in
:mod:`grpo_hpc.monitor.loop`."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

from grpo_hpc.cli.common import EXIT_CODES_HELP, Parser, run_cli
from grpo_hpc.core.errors import ConfigError, ExitCode, SlurmUnavailableError
from grpo_hpc.core.paths import logs_root
from grpo_hpc.core.runs import resolve_runs
from grpo_hpc.monitor.decision import (
    ActionKind,
    MonitorPolicy,
)
from grpo_hpc.monitor.loop import format_outcome, is_final, monitor_pass, worth_saying

EXAMPLES = """examples:
  grpo-monitor                          # watch every run under logs/ until all end
  grpo-monitor gsm8k-a gsm8k-b --interval 30
  grpo-monitor --once                   # one pass (e.g. from cron or scrontab)
  grpo-monitor --step0-timeout 3600 --heartbeat-timeout 900 --max-retries 8
  nohup grpo-monitor --forever > monitor.log 2>&1 &

A pass asks Slurm one squeue and one sacct for all runs (docs/scaling.md). A multi-node
run whose profile sets nodes_wait_s goes on with the nodes left when one is lost and not
back within that many seconds, and returns to all of them when they are (a nodes event
in events.jsonl for each move).

Each decision is logged to logs/<run>/events.jsonl; STOP and DONE stick until the run is
resubmitted by hand (grpo-submit --resume RUN). The loop exits 0 when every watched run is
DONE and 1 when some run was STOPPED (circuit breaker, config error, out of memory,
budget exhausted).
"""


def _parser() -> Parser:
    what = "Watch runs: resubmit after timeouts, preemptions, crashes and stalls (within a retry"
    what += " budget); stop on circuit breakers and config errors."
    p = Parser(prog="grpo-monitor", description=what, epilog=EXAMPLES + "\n" + EXIT_CODES_HELP)
    d = MonitorPolicy()
    p.add_argument("runs", nargs="*", metavar="RUN", help="run names (default: all under --logs)")
    p.add_argument("--logs", type=Path, help="runs directory (default: $GRPO_HPC_LOGS or ./logs)")
    p.add_argument("--once", action="store_true", help="one pass, then exit 0")
    p.add_argument("--forever", action="store_true", help="keep watching (new runs too)")
    p.add_argument("--interval", type=float, default=60.0, metavar="S", help="seconds per pass")
    num = {"type": float, "metavar": "S"}
    p.add_argument(
        "--step0-timeout",
        **num,
        default=d.step0_timeout_s,
        help="stalled if no step within S s of the start (default %(default)s)",
    )
    p.add_argument(
        "--heartbeat-timeout",
        **num,
        default=d.heartbeat_timeout_s,
        help="stalled if the heartbeat is older than S s (default %(default)s)",
    )
    p.add_argument(
        "--max-retries",
        type=int,
        default=d.max_retries,
        metavar="N",
        help="failure resubmissions per run in total (default %(default)s)",
    )
    p.add_argument(
        "--backoff",
        **num,
        default=d.backoff_base_s,
        help="first crash-retry wait, doubling per failure (default %(default)s)",
    )
    return p


def _say(line: str, stream) -> None:  # noqa: ANN001
    """Print a line; a log on a full disk must not kill the monitor (bench/faults/run.py)."""
    with contextlib.suppress(OSError):
        print(line, file=stream, flush=True)


def _watch(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    root = logs_root(args.logs)
    policy = MonitorPolicy(
        step0_timeout_s=args.step0_timeout,
        heartbeat_timeout_s=args.heartbeat_timeout,
        max_retries=args.max_retries,
        backoff_base_s=args.backoff,
    )
    while True:
        runs = resolve_runs(args.runs, root)
        if not runs and not args.forever:
            raise ConfigError(f"no runs under {root} (submit one with grpo-submit)")
        try:
            for o in monitor_pass(runs, policy):
                if worth_saying(o):
                    _say(format_outcome(o, time.time()), sys.stdout)
        except (SlurmUnavailableError, OSError) as e:  # Slurm away, or a full disk: retry
            if args.once:
                raise
            _say(f"grpo-monitor: warning: {e}; retrying in {args.interval:.0f} s", sys.stderr)
        if args.once:
            return ExitCode.OK
        finals = [is_final(p) for p in runs]
        if runs and all(finals) and not args.forever:
            return ExitCode.OK if all(f is ActionKind.DONE for f in finals) else ExitCode.CRASH
        time.sleep(args.interval)


def main(argv: list[str] | None = None) -> int:
    """Console entry point ``grpo-monitor``."""
    return run_cli("grpo-monitor", lambda: _watch(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
