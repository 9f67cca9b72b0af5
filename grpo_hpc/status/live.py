"""Live progress of one job (``grpo-submit --wait``, ``--profile local``): a rich progress
bar fed by progress.json and the metrics tail, never by the trainer's stdout (which lives in
the run directory, and on another node for Slurm jobs)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from grpo_hpc.core.fsutil import tail_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import ProgressRecord, read_progress
from grpo_hpc.status.termviz import fmt_age

ETA_POINTS = 16
"""Steps of the metrics tail whose mean time/step gives the ETA."""


@dataclass(frozen=True)
class Snapshot:
    """What the bar shows at one moment."""

    state: str
    """Trainer state (loading, generating, training, ...)."""
    step: int
    """Steps done."""
    max_steps: int
    """Steps configured."""
    reward: str
    """Mean reward of the last step, formatted ("-" before the first)."""
    tokens_per_s: str
    """Generation throughput of the last step, formatted."""
    eta: str
    """Remaining steps x mean step time of the metrics tail, formatted."""


def snapshot(rec: ProgressRecord | None, sec_per_step: float | None) -> Snapshot:
    """The bar's fields from a progress record (pure); None means "no progress yet"."""
    if rec is None:
        return Snapshot("waiting", 0, 0, "-", "-", "-")
    remaining = max(0, rec.max_steps - rec.step)
    eta = fmt_age(remaining * sec_per_step) if sec_per_step and not rec.state.terminal else "-"
    return Snapshot(
        rec.state.value,
        rec.step,
        rec.max_steps,
        "-" if rec.reward_mean is None else f"{rec.reward_mean:.3f}",
        "-" if rec.tokens_per_s is None else f"{rec.tokens_per_s:,.0f}",
        eta,
    )


def line(s: Snapshot) -> str:
    """The same fields as one log line (pure), for output that is not a terminal."""
    return (
        f"  [{s.state}] step {s.step}/{s.max_steps or '?'} reward {s.reward} "
        f"tok/s {s.tokens_per_s} eta {s.eta}"
    )


def _mean_step_time(paths: RunPaths) -> float | None:
    tail = tail_jsonl(paths.metrics)[-ETA_POINTS:]
    times = [float(m["time/step"]) for m in tail if isinstance(m.get("time/step"), (int, float))]
    return sum(times) / len(times) if times else None


def read_snapshot(paths: RunPaths) -> Snapshot:
    return snapshot(read_progress(paths.progress), _mean_step_time(paths))


def follow(
    paths: RunPaths,
    done: Callable[[], bool],
    console: Console | None = None,
    poll_s: float = 1.0,
) -> Snapshot:
    """Show the run's progress until ``done()``; returns the last snapshot. A terminal gets
    a live bar; a pipe or log file gets one line whenever the step or state changes."""
    console = console or Console()
    if not console.is_terminal:
        return _follow_lines(paths, done, console, poll_s)
    columns = (
        TextColumn("[bold]{task.fields[state]:<13}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("reward {task.fields[reward]}"),
        TextColumn("{task.fields[tps]} tok/s"),
        TextColumn("ETA {task.fields[eta]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, auto_refresh=False) as bar:
        task = bar.add_task("train", total=None, **_fields(read_snapshot(paths)))
        while True:
            finished = done()  # before reading: the last read sees the final state
            snap = read_snapshot(paths)
            bar.update(task, completed=snap.step, total=snap.max_steps or None, **_fields(snap))
            bar.refresh()
            if finished:
                return snap
            time.sleep(poll_s)


def _fields(s: Snapshot) -> dict[str, str]:
    return {"state": s.state, "reward": s.reward, "tps": s.tokens_per_s, "eta": s.eta}


def _follow_lines(
    paths: RunPaths, done: Callable[[], bool], console: Console, poll_s: float
) -> Snapshot:
    last = None
    while True:
        finished = done()
        snap = read_snapshot(paths)
        if (snap.step, snap.state) != last:
            last = (snap.step, snap.state)
            console.print(line(snap), markup=False, highlight=False, soft_wrap=True)
        if finished:
            return snap
        time.sleep(poll_s)
