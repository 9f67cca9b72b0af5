"""grpo-status: one squeue-like line per run, or one run in detail.

:func:`collect_rows` is the I/O shell (files of every run, one ``sacct`` + one ``squeue``
for all of them); the rendering is pure and lives in :mod:`grpo_hpc.status.view`: rows (and
a clock) in, rich renderables out, so tests render them into a StringIO console.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from grpo_hpc.config.load import load_resolved
from grpo_hpc.core import events as event_log
from grpo_hpc.core.best import read_best
from grpo_hpc.core.errors import ConfigError, ExitCode, SlurmUnavailableError
from grpo_hpc.core.events import Phase
from grpo_hpc.core.fsutil import read_jsonl, tail_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import ProgressRecord, read_progress
from grpo_hpc.core.runs import (
    SlurmView,
    job_view,
    query_slurm,
    resolve_runs,
    slurm_ids,
)
from grpo_hpc.export.plan import read_provenance
from grpo_hpc.monitor.decision import decide, history_from
from grpo_hpc.monitor.node_loss import NODES_PHASE
from grpo_hpc.status.view import (
    NODES_WAIT,
    RunDetail,
    RunRow,
    collapse_flag,
    ended_badly,
    exit_class,
    held_out_figure,
    last_measured,
)

TREND_POINTS = 16


# ------------------------------------------------------------------------------- I/O shell


def read_row(paths: RunPaths, view: SlurmView | None) -> RunRow:
    """One run's row from its files (``view`` None: Slurm did not answer)."""
    jobs, events = read_jsonl(paths.jobs), event_log.read(paths.events)
    row = RunRow(run=paths.name, attempts=len(jobs), last_checkpoint=paths.latest_checkpoint())
    if jobs:
        entry = jobs[-1]
        row.job_id, row.profile = str(entry["job_id"]), entry.get("profile")
        local = entry.get("executor") == "local"
        known = view is not None or local
        row.slurm_state = job_view(entry, view or SlurmView(), events).state if known else "?"
        record = view.records.get(row.job_id) if view is not None else None
        row.nodes = record.nodes if record is not None else None
        last = [
            e for e in events if e.get("phase") == Phase.DECISION and e.get("job_id") == row.job_id
        ]
        if last:
            row.monitor_action, row.monitor_class = last[-1].get("action"), last[-1].get("class")
            row.monitor_reason = last[-1].get("reason")
        row.collapse = collapse_flag(events)
        row.node_note = node_note(entry, events)
        final = history_from(events, jobs).final
        row.monitor_action = final.value if final else row.monitor_action
    rec = read_progress(paths.progress)
    if rec is not None:
        row.train_state, row.step, row.max_steps = rec.state.value, rec.step, rec.max_steps
        row.reward_mean, row.kl, row.tokens_per_s = rec.reward_mean, rec.kl, rec.tokens_per_s
        row.entropy, row.engine_kl, row.clip_frac = rec.entropy, rec.engine_kl, rec.clip_frac
        row.staleness, row.continued = rec.staleness, rec.continued
        row.heartbeat = rec.heartbeat
        if rec.last_checkpoint is not None:
            row.last_checkpoint = max(rec.last_checkpoint, row.last_checkpoint or 0)
    best = read_best(paths.root)
    if best is not None:
        row.best_step, row.best_metric, row.best_score = best.step, best.metric, best.score
        row.best_why = best.why()
    prov = read_provenance(paths.final)
    if prov is not None:
        row.final_model, row.final_step = str(paths.final), prov.get("step")
    fill_failure(row, rec, jobs, events, view)
    tail = tail_jsonl(paths.metrics)
    fill_entropy(row, tail)
    metrics = tail[-TREND_POINTS:]
    row.reward_trend = [float(m["reward/mean"]) for m in metrics if "reward/mean" in m]
    held_out = held_out_figure(tail)  # evaluations are sparser than steps: the whole tail
    if held_out is not None:
        row.held_out_metric, row.held_out = held_out
    times = [float(m["time/step"]) for m in metrics if "time/step" in m]
    row.sec_per_step = sum(times) / len(times) if times else None
    return row


def node_note(entry: dict, events: list[dict]) -> str | None:
    """``on 2/4 nodes`` for a job on fewer nodes than its profile's, ``waiting for nodes
    (2/4 up)`` while the monitor waits for a lost node (its ``nodes`` events) (pure)."""
    if entry.get("short_of"):
        return f"on {entry.get('nodes')}/{entry['short_of']} nodes"
    last = next((e for e in reversed(events) if e.get("phase") == NODES_PHASE), None)
    if last is not None and last.get("move") == "wait":
        return f"{NODES_WAIT} ({last.get('up')}/{last.get('full')} up)"
    return None


def fill_failure(
    row: RunRow,
    rec: ProgressRecord | None,
    jobs: list[dict],
    events: list[dict],
    view: SlurmView | None,
    now: float | None = None,
) -> None:
    """Why the run ended badly, from its progress record (exit code, reason, class), and,
    where the monitor logged no decision about the newest job, the decision it would make
    now (grpo_hpc.monitor.decision.decide, the monitor's own pure rule)."""
    if rec is None:
        return
    row.exit_code, row.end_reason = rec.exit_code, rec.reason
    history = history_from(events, jobs)
    before = rec.exit_code == ExitCode.CHECKPOINTED and rec.step <= rec.start_step
    row.exit_class = exit_class(
        rec.exit_code, rec.state.value, history.collapse_stop is not None, before
    )
    if not jobs or row.monitor_action is not None or not ended_badly(row):
        return
    local = jobs[-1].get("executor") == "local"
    if view is None and not local:  # Slurm did not answer: the job's state is not known
        return
    job = job_view(jobs[-1], view or SlurmView(), events)
    action = decide(rec, job, history, time.time() if now is None else now)
    row.monitor_next_action, row.monitor_next_reason = action.kind.value, action.reason


def fill_entropy(row: RunRow, metrics: list[dict]) -> None:
    """A last step that measured no entropy (every group flat: no forward pass) gets the
    newest entropy in ``metrics`` up to that step, and its step."""
    if row.entropy is not None or not row.step:
        return
    measured = last_measured(metrics, "entropy", up_to=row.step)
    if measured is not None:
        row.entropy_step, row.entropy = measured


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
    row = rows_for([paths], query)[0]
    fill_entropy(row, metrics)  # the tail held none: the whole history
    events = event_log.read(paths.events)
    return RunDetail(
        row,
        read_jsonl(paths.jobs),
        events[-10:],
        rewards,
        paths.checkpoint_steps(),
        next(iter(tail_jsonl(paths.samples)[-1:]), None),
        [e for e in events if e.get("phase") == NODES_PHASE],
    )


def last_eval_samples(paths: RunPaths) -> tuple[int, list[dict]] | None:
    """(step, rows) of the newest evaluation's completions (``eval_samples/``), or None."""
    steps = []
    for p in paths.eval_samples.glob("step_*.jsonl"):
        tail = p.stem.removeprefix("step_")
        if tail.isdigit():
            steps.append(int(tail))
    if not steps:
        return None
    step = max(steps)
    return step, read_jsonl(paths.eval_samples_at(step))


def run_beta(paths: RunPaths) -> float | None:
    """The run's ``algo.beta`` from its config.yaml (whether it has a reference policy,
    for the plot's KL panel); None when there is no readable config."""
    try:
        return float(load_resolved(paths.config).algo.beta) if paths.config.is_file() else None
    except ConfigError:
        return None
