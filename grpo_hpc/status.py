"""grpo-status: one squeue-like line per run, or one run in detail.

:func:`collect_rows` is the I/O shell (files of every run, one ``sacct`` + one ``squeue``
for all of them); the rendering is pure and lives in :mod:`grpo_hpc.status_view`: rows (and
a clock) in, rich renderables out, so tests render them into a StringIO console.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console, Group
from rich.table import Table

from grpo_hpc.cli_common import EXIT_CODES_HELP, Parser, run_cli
from grpo_hpc.decision import MonitorPolicy, history_from
from grpo_hpc.errors import ConfigError, ExitCode, SlurmUnavailableError
from grpo_hpc.export_plan import read_provenance
from grpo_hpc.fsutil import read_jsonl, tail_jsonl
from grpo_hpc.paths import RunPaths, logs_root
from grpo_hpc.progress import read_progress
from grpo_hpc.runs import SlurmView, job_view, query_slurm, resolve_run, resolve_runs, slurm_ids
from grpo_hpc.status_view import (
    FULL_WIDTH,
    RunDetail,
    RunRow,
    build_details,
    build_table,
    held_out_figure,
    row_flags,
)

TREND_POINTS = 16


# ------------------------------------------------------------------------------- I/O shell


def read_row(paths: RunPaths, view: SlurmView | None) -> RunRow:
    """One run's row from its files (``view`` None: Slurm did not answer)."""
    jobs, events = read_jsonl(paths.jobs), read_jsonl(paths.events)
    row = RunRow(run=paths.name, attempts=len(jobs), last_checkpoint=paths.latest_checkpoint())
    if jobs:
        entry = jobs[-1]
        row.job_id, row.profile = str(entry["job_id"]), entry.get("profile")
        local = entry.get("executor") == "local"
        known = view is not None or local
        row.slurm_state = job_view(entry, view or SlurmView(), events).state if known else "?"
        record = view.records.get(row.job_id) if view is not None else None
        row.nodes = record.nodes if record is not None else None
        last = [e for e in events if e.get("phase") == "decision" and e.get("job_id") == row.job_id]
        if last:
            row.monitor_action, row.monitor_class = last[-1].get("action"), last[-1].get("class")
            row.monitor_reason = last[-1].get("reason")
        final = history_from(events, jobs).final
        row.monitor_action = final.value if final else row.monitor_action
    rec = read_progress(paths.progress)
    if rec is not None:
        row.train_state, row.step, row.max_steps = rec.state.value, rec.step, rec.max_steps
        row.reward_mean, row.kl, row.tokens_per_s = rec.reward_mean, rec.kl, rec.tokens_per_s
        row.entropy, row.engine_kl, row.clip_frac = rec.entropy, rec.engine_kl, rec.clip_frac
        row.heartbeat = rec.heartbeat
        if rec.last_checkpoint is not None:
            row.last_checkpoint = max(rec.last_checkpoint, row.last_checkpoint or 0)
    prov = read_provenance(paths.final)
    if prov is not None:
        row.final_model, row.final_step = str(paths.final), prov.get("step")
    tail = tail_jsonl(paths.metrics)
    metrics = tail[-TREND_POINTS:]
    row.reward_trend = [float(m["reward/mean"]) for m in metrics if "reward/mean" in m]
    held_out = held_out_figure(tail)  # evaluations are sparser than steps: the whole tail
    if held_out is not None:
        row.held_out_metric, row.held_out = held_out
    times = [float(m["time/step"]) for m in metrics if "time/step" in m]
    row.sec_per_step = sum(times) / len(times) if times else None
    return row


def collect_rows(
    logs_root: Path,
    run_names: list[str] | None = None,
    query: Callable[[list[str]], SlurmView] | None = None,
) -> list[RunRow]:
    """Rows for the named runs (default: all under ``logs_root``), one sacct call in all."""
    return rows_for(resolve_runs(run_names or [], logs_root), query)


def rows_for(
    runs: list[RunPaths], query: Callable[[list[str]], SlurmView] | None = None
) -> list[RunRow]:
    """Rows of the given runs, asking Slurm once for all of them."""
    ids = slurm_ids(next(iter(read_jsonl(p.jobs)[-1:]), None) for p in runs)
    try:
        view: SlurmView | None = (query or query_slurm)(ids)
    except SlurmUnavailableError as e:
        print(f"grpo-status: warning: {e} (Slurm states shown as ?)", file=sys.stderr)
        view = None
    return [read_row(p, view) for p in runs]


def collect_detail(
    paths: RunPaths, query: Callable[[list[str]], SlurmView] | None = None
) -> RunDetail:
    """Everything ``grpo-status RUN`` shows."""
    metrics = read_jsonl(paths.metrics)
    rewards = [
        (int(m["step"]), float(m["reward/mean"]))
        for m in metrics
        if "step" in m and "reward/mean" in m
    ]
    return RunDetail(
        rows_for([paths], query)[0],
        read_jsonl(paths.jobs),
        read_jsonl(paths.events)[-10:],
        rewards,
        paths.checkpoint_steps(),
        next(iter(tail_jsonl(paths.samples)[-1:]), None),
    )


EXAMPLES = """examples:
  grpo-status                       # every run under logs/, one line each
  grpo-status --watch               # refresh every 5 s (Ctrl-C to leave)
  grpo-status --json | jq '.[] | select(.flags != [])'
  grpo-status gsm8k-a               # one run: jobs, events, health, last sample, rewards
  grpo-status gsm8k-a --plot reward.png
  grpo-status gsm8k-a gsm8k-b       # several named runs, one line each

FLAG: stalled (heartbeat older than --heartbeat-timeout), zero reward, failed, backoff,
stopped (circuit breaker / config error) and budget exhausted (from the monitor's events).
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
        help="write RUN's curves (reward, correctness, KL, length, accuracy) as a PNG",
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
        from grpo_hpc.plot import plot_data, write_png

        data = plot_data(read_jsonl(single.metrics), read_jsonl(single.jobs))
        write_png(data, args.plot, single.name)
        print(f"wrote {args.plot}")
        return ExitCode.OK
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


def main(argv: list[str] | None = None) -> int:
    """Console entry point ``grpo-status``."""
    return run_cli("grpo-status", lambda: _status(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
