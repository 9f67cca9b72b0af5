"""grpo-status: one squeue-like line per run, or one run in detail.

:func:`collect_rows` is the I/O shell (files of every run, one ``sacct`` + one ``squeue``
for all of them); :func:`build_table` and :func:`build_details` are pure: rows (and a
clock) in, rich renderables out, so tests render them into a StringIO console.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from grpo_hpc.cli_common import EXIT_CODES_HELP, Parser, run_cli
from grpo_hpc.decision import RUNNING_STATES, MonitorPolicy, history_from
from grpo_hpc.errors import ConfigError, ExitCode, SlurmUnavailableError
from grpo_hpc.fsutil import read_jsonl
from grpo_hpc.paths import RunPaths, default_logs_root
from grpo_hpc.progress import TrainState, read_progress
from grpo_hpc.runs import SlurmView, job_view, query_slurm, resolve_run, resolve_runs, slurm_ids
from grpo_hpc.termviz import fmt_age, sparkline, step_bar, text_plot

TREND_POINTS = 16
RED_FLAGS = ("stalled", "stopped", "budget exhausted", "failed")


@dataclass
class RunRow:
    """Everything the dashboard shows about one run (plain data; ``--json`` prints it)."""

    run: str
    """Run name."""
    job_id: str | None = None
    """Newest job id (a pid for the local executor)."""
    profile: str | None = None
    """Cluster profile of the newest job."""
    slurm_state: str = "-"
    """Slurm state, LOCAL_RUNNING/LOCAL_EXITED, MISSING, or ? when Slurm did not answer."""
    train_state: str | None = None
    """Trainer state from progress.json (None: no progress yet)."""
    step: int | None = None
    """Steps done."""
    max_steps: int | None = None
    """Steps configured."""
    reward_mean: float | None = None
    """Mean reward of the last step."""
    reward_trend: list[float] = field(default_factory=list)
    """reward/mean of the last few steps (metrics.jsonl tail), oldest first."""
    kl: float | None = None
    """KL of the last step."""
    tokens_per_s: float | None = None
    """Generation throughput of the last step."""
    heartbeat: float | None = None
    """Unix time of the trainer's last heartbeat."""
    attempts: int = 0
    """Jobs submitted so far."""
    last_checkpoint: int | None = None
    """Newest complete checkpoint step."""
    sec_per_step: float | None = None
    """Mean time/step over the metrics tail (for the ETA)."""
    monitor_action: str | None = None
    """The monitor's latest decision about the newest job (NONE, WAIT, STOP, ...)."""
    monitor_class: str | None = None
    """Its class (crash, budget_exhausted, circuit_breaker, ...)."""
    monitor_reason: str | None = None
    """Its reason line."""


# ---------------------------------------------------------------------------- pure rendering


def row_flags(row: RunRow, now: float, heartbeat_timeout_s: float = 600.0) -> list[str]:
    """Why a row deserves attention (pure): stalled, zero reward, stopped, budget, ..."""
    flags = []
    if row.monitor_action == "STOP":
        exhausted = row.monitor_class == "budget_exhausted"
        flags.append("budget exhausted" if exhausted else f"stopped: {row.monitor_class}")
    elif row.monitor_action == "WAIT":
        flags.append(f"backoff: {row.monitor_class}")
    live = row.train_state is not None and not TrainState(row.train_state).terminal
    running = row.slurm_state in RUNNING_STATES
    if live and running and row.heartbeat is not None and now - row.heartbeat > heartbeat_timeout_s:
        flags.append(f"stalled {fmt_age(now - row.heartbeat)}")
    if row.train_state == TrainState.FAILED.value and row.monitor_action != "STOP":
        flags.append("failed")
    trend = row.reward_trend if len(row.reward_trend) >= 3 else []
    if (trend and not any(trend)) or (not trend and row.reward_mean == 0):
        flags.append("zero reward")
    return flags


def _style(flags: list[str], row: RunRow) -> str:
    if any(f.startswith(RED_FLAGS) for f in flags):
        return "red"
    if flags:
        return "yellow"
    return "green" if row.train_state == TrainState.FINISHED.value else ""


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _eta(row: RunRow) -> str:
    ended = row.train_state in (None, "finished", "failed") or row.monitor_action == "STOP"
    if ended or not row.sec_per_step or not row.max_steps:
        return "-"
    return fmt_age(max(0, row.max_steps - (row.step or 0)) * row.sec_per_step)


COLUMNS = "RUN JOB PROFILE SLURM TRAIN STEP REWARD KL TOK/S HB ATT CKPT ETA FLAG".split()
# Dropped first when the terminal is narrow (the rest still fits in 80 columns).
OPTIONAL_COLUMNS = ("PROFILE", "KL", "TOK/S", "CKPT", "ATT", "ETA")
FULL_WIDTH = 150


def columns_for_width(width: int | None) -> list[str]:
    """The columns that fit a terminal ``width`` wide (pure); None means all."""
    if width is None or width >= FULL_WIDTH:
        return list(COLUMNS)
    drop = OPTIONAL_COLUMNS[: 3 if width >= 110 else len(OPTIONAL_COLUMNS)]
    return [c for c in COLUMNS if c not in drop]


def build_table(
    rows: list[RunRow], now: float, heartbeat_timeout_s: float = 600.0, width: int | None = None
) -> Table:
    """The squeue-like dashboard (pure); ``width`` drops optional columns to fit."""
    shown = columns_for_width(width)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    table = Table(title=f"grpo runs: {len(rows)} at {stamp}", title_justify="left", box=None)
    for name in shown:
        table.add_column(name, no_wrap=name != "FLAG", justify="right" if name == "ATT" else "left")
    for row in rows:
        flags = row_flags(row, now, heartbeat_timeout_s)
        reward = _num(row.reward_mean, ".3f")
        if row.reward_trend:
            reward += " " + sparkline(row.reward_trend[-8:])
        hb = None if row.heartbeat is None else max(0.0, now - row.heartbeat)
        cells = [
            row.run,
            row.job_id or "-",
            row.profile or "-",
            row.slurm_state,
            row.train_state or "no progress",
            step_bar(row.step, row.max_steps),
            reward,
            _num(row.kl, ".4f"),
            _num(row.tokens_per_s, ".0f"),
            fmt_age(hb),
            str(row.attempts),
            "-" if row.last_checkpoint is None else str(row.last_checkpoint),
            _eta(row),
            ", ".join(flags),
        ]
        keep = [cell for name, cell in zip(COLUMNS, cells, strict=True) if name in shown]
        table.add_row(*keep, style=_style(flags, row))
    return table


@dataclass
class RunDetail:
    """One run in depth: its row, job history, last events and reward curve."""

    row: RunRow
    """The dashboard row."""
    jobs: list[dict[str, Any]]
    """jobs.jsonl entries."""
    events: list[dict[str, Any]]
    """The last events.jsonl entries."""
    rewards: list[tuple[int, float]]
    """(step, reward/mean) from metrics.jsonl."""
    checkpoints: list[int]
    """Complete checkpoint steps."""


def _plain_table(title: str, columns: str, rows: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left", box=None)
    for name in columns.split():
        table.add_column(name, no_wrap=name != "REASON")
    for cells in rows:
        table.add_row(*cells)
    return table


def build_details(d: RunDetail, now: float) -> Group:
    """The ``grpo-status RUN`` view (pure)."""
    keys = ("attempt", "job_id", "submitted_at", "executor", "profile", "reason")
    job_rows = [[str(j.get(k, "-")) for k in keys] for j in d.jobs]
    for cells, j in zip(job_rows, d.jobs, strict=True):
        cells[2] = time.strftime("%m-%d %H:%M", time.localtime(j.get("submitted_at") or 0))
    keys = ("job_id", "phase", "action", "class", "reason")
    ev_rows = [
        [fmt_age(now - float(e.get("time", now)))] + [str(e.get(k) or "-") for k in keys]
        for e in d.events
    ]
    ckpts = ", ".join(map(str, d.checkpoints[-8:])) or "none"
    parts = [
        build_table([d.row], now),
        _plain_table("jobs", "ATTEMPT JOB SUBMITTED EXECUTOR PROFILE REASON", job_rows),
        _plain_table("last events", "AGO JOB PHASE ACTION CLASS REASON", ev_rows),
        Text(f"complete checkpoints: {ckpts}"),
        Text("reward/mean per step\n" + "\n".join(text_plot(d.rewards))),
    ]
    return Group(*(x for part in parts for x in (part, Text(""))))


# ------------------------------------------------------------------------------- I/O shell


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
        row.heartbeat = rec.heartbeat
        if rec.last_checkpoint is not None:
            row.last_checkpoint = max(rec.last_checkpoint, row.last_checkpoint or 0)
    metrics = tail_jsonl(paths.metrics)[-TREND_POINTS:]
    row.reward_trend = [float(m["reward/mean"]) for m in metrics if "reward/mean" in m]
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
    )


def write_png(rewards: list[tuple[int, float]], out: Path, title: str) -> None:
    """The reward curve as a PNG (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install matplotlib") from None
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([s for s, _ in rewards], [r for _, r in rewards])
    ax.set(xlabel="step", ylabel="reward/mean", title=title)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)


EXAMPLES = """examples:
  grpo-status                       # every run under logs/, one line each
  grpo-status --watch               # refresh every 5 s (Ctrl-C to leave)
  grpo-status --json | jq '.[] | select(.flags != [])'
  grpo-status gsm8k-a               # one run: jobs, events, reward curve
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
    p.add_argument("--plot", type=Path, metavar="FILE.png", help="write RUN's reward curve")
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
    root = (args.logs or default_logs_root()).resolve()
    single = resolve_run(args.runs[0], root) if len(args.runs) == 1 else None
    if args.plot is not None:
        if single is None:
            raise ConfigError("--plot needs exactly one RUN")
        write_png(collect_detail(single).rewards, args.plot, single.name)
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
