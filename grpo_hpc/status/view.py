"""grpo-status rendering (pure): the RunRow/RunDetail data, flags, and the rich table and
one-run view built from them and a clock."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from grpo_hpc.core.events import TRAINER
from grpo_hpc.core.progress import TrainState
from grpo_hpc.core.runs import RUNNING_STATES
from grpo_hpc.monitor.decision import heartbeat_watched
from grpo_hpc.status.failure import (  # noqa: F401  (part of this module's API)
    EXIT_CLASSES,
    REASON_WIDTH,
    ended_badly,
    exit_class,
    failure_flags,
    failure_lines,
    monitor_answer,
)
from grpo_hpc.status.termviz import cut, fmt_age, sparkline, step_bar, text_plot

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
    nodes: str | None = None
    """The newest job's nodes as Slurm writes them (``grpo-n[1-2]``); None before any."""
    node_note: str | None = None
    """A multi-node run carried on with the nodes left (``nodes_wait_s``): ``on 2/4
    nodes``, or ``waiting for nodes (2/4 up)`` while the monitor waits for a lost one."""
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
    held_out: float | None = None
    """The newest held-out figure in the metrics tail (None: no evaluation logged there)."""
    held_out_metric: str | None = None
    """Which one ``held_out`` is: ``eval/pass@1`` (code tasks) or ``eval/accuracy``."""
    kl: float | None = None
    """KL of the last step."""
    entropy: float | None = None
    """Policy entropy (nats/token) of the last step; when the last step measured none (its
    groups all had equal rewards, so the update skipped the forward pass), the newest one
    measured, at ``entropy_step``."""
    entropy_step: int | None = None
    """The step ``entropy`` was measured at when that is not the last step (None: it is)."""
    engine_kl: float | None = None
    """Engine-vs-trainer KL (k3, per token) of the last step."""
    staleness: int | None = None
    """Of the last step's batch, in updates (asynchronous runs; None: synchronous); with
    partial rollouts, of its oldest group."""
    continued: int | None = None
    """Partial rollouts: rows of the last step's batch continued from an earlier round."""
    clip_frac: float | None = None
    """Share of the last step's tokens whose PPO ratio was clipped."""
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
    collapse: str | None = None
    """The newest collapse the trainer detected (events.jsonl): ``signal@step action``,
    e.g. ``no_signal@10 rollback 1``, or ``solved@12 finish`` for a solved task; None: none."""
    final_model: str | None = None
    """``logs/<run>/final/``, the finished run's Hugging Face directory, once written."""
    final_step: int | None = None
    """The checkpoint step ``final/`` was exported from (its grpo_export.json)."""
    best_step: int | None = None
    """The step of the best validation evaluation so far (best.json; keep-best)."""
    best_metric: str | None = None
    """What it was compared on (``accuracy``, ``pass@1``)."""
    best_score: float | None = None
    """Its score."""
    exit_code: int | None = None
    """The trainer's exit code in progress.json (None: none recorded yet)."""
    end_reason: str | None = None
    """progress.json's ``reason``: why the trainer ended without finishing (a crash's
    exception line, ``NotImplementedError: ...``; a config error's or a breaker's line)."""
    exit_class: str | None = None
    """What that exit means (docs/exit-codes.md; :func:`exit_class`): crash, config error,
    circuit breaker, collapse, stalled, checkpointed, stopped before training, out of GPU
    memory."""
    monitor_next_action: str | None = None
    """Where no monitor decision about the newest job is logged: what ``grpo-monitor`` would
    decide now (grpo_hpc.monitor.decision.decide: RESUBMIT, WAIT, STOP, ...)."""
    monitor_next_reason: str | None = None
    """That decision's reason line."""
    best_why: str | None = None
    """Why that step is the model to hand over, in words (``BestRecord.why``): the peak, or
    within noise of the peak, or the start that beat every later evaluation."""


NODES_WAIT = "waiting for nodes"
"""How a row's node note begins while the monitor waits for a lost node (report.node_note):
that WAIT is not a backoff, and the note says what it waits for."""


def row_flags(row: RunRow, now: float, heartbeat_timeout_s: float = 600.0) -> list[str]:
    """Why a row deserves attention (pure): stalled, zero reward, stopped, budget, ..."""
    flags = []
    if row.monitor_action == "STOP":
        exhausted = row.monitor_class == "budget_exhausted"
        flags.append("budget exhausted" if exhausted else f"stopped: {row.monitor_class}")
    elif row.monitor_action == "WAIT" and not (row.node_note or "").startswith(NODES_WAIT):
        flags.append(f"backoff: {row.monitor_class}")  # a wait for lost nodes: the node note
    # the monitor's rule (decision.heartbeat_watched): a trainer that loads is not stalled
    watched = row.train_state is not None and heartbeat_watched(TrainState(row.train_state))
    running = row.slurm_state in RUNNING_STATES
    age = None if row.heartbeat is None else now - row.heartbeat
    if watched and running and age is not None and age > heartbeat_timeout_s:
        flags.append(f"stalled {fmt_age(age)}")
    flags += [row.node_note] if row.node_note else []
    flags += failure_flags(row)
    if row.collapse and row.monitor_class != "collapsed":  # a collapse STOP says it already
        solved = row.collapse.startswith("solved@")  # a solved task: no collapse
        flags.append(f"{'SOLVED' if solved else 'COLLAPSE'} {row.collapse}")
    trend = row.reward_trend if len(row.reward_trend) >= 3 else []
    if (trend and not any(trend)) or (not trend and row.reward_mean == 0):
        flags.append("zero reward")
    return flags


def collapse_flag(events: list[dict[str, Any]]) -> str | None:
    """``signal@step action`` of the newest collapse the trainer logged in events.jsonl
    (phase ``collapse``; grpo_hpc/train/supervision/on_collapse.py), or of a solved task
    (phase ``solved``: ``solved@step finish``), or None (pure)."""
    marks = [e for e in events if e.get("phase") in TRAINER]
    if not marks:
        return None
    e = marks[-1]
    action = str(e.get("action", "")).lower()
    if action == "rollback":
        action += f" {e.get('rollbacks', '?')}"
    return f"{e.get('signal', '?')}@{e.get('step', '?')} {action}"


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


COLUMNS = (
    "RUN JOB PROFILE SLURM NODES TRAIN STEP REWARD EVAL BEST KL TOK/S HB ATT CKPT ETA FLAG".split()
)
# Dropped first when the terminal is narrow (the rest still fits in 80 columns).
OPTIONAL_COLUMNS = ("PROFILE", "KL", "TOK/S", "CKPT", "ATT", "ETA", "NODES", "EVAL", "BEST")
HELD_OUT_METRICS = ("eval/pass@1", "eval/accuracy")
"""Metrics the EVAL column shows, the first one a metrics line has (pass@1: code tasks)."""


def held_out_figure(metrics: list[dict[str, Any]]) -> tuple[str, float] | None:
    """(metric, value) of the newest held-out evaluation among ``metrics`` (pure)."""
    for m in reversed(metrics):
        for key in HELD_OUT_METRICS:
            value = m.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return key, float(value)
    return None


def last_measured(
    metrics: list[dict[str, Any]], key: str, up_to: int | None = None
) -> tuple[int, float] | None:
    """(step, value) of the newest metrics line with a number for ``key`` at a step no
    later than ``up_to`` (pure): lines an earlier attempt logged past the step a run resumed
    from are not its history. A step that measured nothing logs null."""
    for m in reversed(metrics):
        value, step = m.get(key), m.get("step")
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if not math.isfinite(value):
            continue
        if isinstance(step, int) and (up_to is None or step <= up_to):
            return step, float(value)
    return None


def _held_out_cell(row: RunRow) -> str:
    if row.held_out is None:
        return "-"
    name = "pass@1" if row.held_out_metric == "eval/pass@1" else "acc"
    return f"{name} {row.held_out:.3f}"


def best_cell(row: RunRow) -> str:
    """The best evaluation, score at step (``0.625@12``): narrow, for the table."""
    if row.best_step is None or row.best_score is None:
        return "-"
    return f"{row.best_score:.3f}@{row.best_step}"


FULL_WIDTH = 150


def columns_for_width(width: int | None) -> list[str]:
    """The columns that fit a terminal ``width`` wide (pure); None means all."""
    if width is None or width >= FULL_WIDTH:
        return list(COLUMNS)
    drop = OPTIONAL_COLUMNS[: 3 if width >= 110 else len(OPTIONAL_COLUMNS)]
    return [c for c in COLUMNS if c not in drop]


def column_style(name: str) -> dict[str, Any]:
    """How the table lays out a column: FLAG wraps, folding a word longer than the column
    (an exception's name) rather than cutting it to ``Not…``; the others stay on one line."""
    if name == "FLAG":
        return {"no_wrap": False, "overflow": "fold"}
    return {"no_wrap": True, "justify": "right" if name == "ATT" else "left"}


def build_table(
    rows: list[RunRow], now: float, heartbeat_timeout_s: float = 600.0, width: int | None = None
) -> Table:
    """The squeue-like dashboard (pure); ``width`` drops optional columns to fit."""
    shown = columns_for_width(width)
    if all(r.held_out is None for r in rows):  # no run has evaluated: no EVAL column
        shown = [c for c in shown if c != "EVAL"]
    if all(r.best_step is None for r in rows):  # nor a BEST one where none selects
        shown = [c for c in shown if c != "BEST"]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    table = Table(title=f"grpo runs: {len(rows)} at {stamp}", title_justify="left", box=None)
    for name in shown:
        table.add_column(name, **column_style(name))
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
            row.nodes or "-",
            row.train_state or "no progress",
            step_bar(row.step, row.max_steps),
            reward,
            _held_out_cell(row),
            best_cell(row),
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
    sample: dict[str, Any] | None = None
    """The newest samples.jsonl entry (a completion as written and scored), if any."""
    node_moves: list[dict[str, Any]] = field(default_factory=list)
    """Every ``nodes`` event of the monitor (a lost node: wait, shrink, grow), oldest first."""


def nodes_line(moves: list[dict[str, Any]]) -> str:
    """``nodes: 19:24 wait (1/2 up), 19:24 shrink to 1, 19:25 grow to 2`` (pure); empty
    for a run whose node count never changed."""
    said = []
    for e in moves:
        at = time.strftime("%H:%M", time.localtime(float(e.get("time", 0))))
        move, n = str(e.get("move")), e.get("nodes")
        what = f"{move} ({e.get('up')}/{e.get('full')} up)" if move == "wait" else f"{move} to {n}"
        said.append(f"{at} {what}")
    return "nodes: " + ", ".join(said) if said else ""


def _plain_table(title: str, columns: str, rows: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left", box=None)
    for name in columns.split():
        table.add_column(name, no_wrap=name != "REASON")
    for cells in rows:
        table.add_row(*cells)
    return table


def final_line(row: RunRow) -> str:
    """Where the run's final model is (pure)."""
    if row.final_model is None:
        return "final model: none yet (written when the run finishes; grpo-export RUN)"
    step = f"step {row.final_step}" if row.final_step is not None else "step ?"
    if row.final_step is not None and row.final_step == row.best_step:
        step = row.best_why or f"{step}, the best"
        step += "; the last step's model in last/"
    return f"final model: {row.final_model} ({step}; grpo-eval {row.final_model})"


def best_line(row: RunRow) -> str:
    """The model to hand over so far (keep-best), why, and how to export it (pure)."""
    if row.best_step is None or row.best_score is None:
        return "best: none (training.eval_every with a validation split, data.num_val)"
    why = row.best_why or f"step {row.best_step}: {row.best_metric} {row.best_score:.3f}"
    where = (
        "the run's model directory" if row.best_step == 0 else f"checkpoint step-{row.best_step}"
    )
    return f"best: {why} on validation ({where}; grpo-export {row.run} OUT --best)"


def eval_samples_lines(
    step: int, rows: list[dict[str, Any]], n: int = 3, width: int = 100
) -> list[str]:
    """An evaluation's worst and best ``n`` completions, one line each within ``width``
    (pure): the wrong ones first (verdict 0), then the right ones; question, gold, the
    answer read from the completion, and the completion, each cut to fit."""
    ranked = sorted(rows, key=lambda r: float(r.get("verdict") or 0.0))
    worst = [r for r in ranked if not r.get("verdict")][:n]
    best = [r for r in reversed(ranked) if r.get("verdict")][:n]
    right = sum(1 for r in rows if r.get("verdict"))
    out = [f"evaluation at step {step}: {right}/{len(rows)} right"]
    for title, part in (("worst", worst), ("best", best)):
        out.append(f"{title} {len(part)}:" if part else f"{title}: none")
        for r in part:
            mark = "right" if r.get("verdict") else "wrong"
            got = "" if r.get("gold") is None else f" gold {r['gold']}, got {r.get('answer')}"
            head = f"  {mark}{got} | "
            q = " ".join(str(r.get("question", "")).split())
            c = " ".join(str(r.get("completion", "")).split())
            room = max(width - len(head), 20)
            out.append(head + cut(f"{cut(q, room // 2)} => {c}", room))
    return out


def health_line(row: RunRow) -> str:
    """The policy's health in the last step (pure): entropy falling to ~0 is a collapse to
    fixed answers; an engine-trainer KL far above its usual ~1e-3 is the engine sampling
    from another policy than the one trained; a large clipped share is an update too big
    for its batch. A last step that measured no entropy shows the newest one measured, with
    its step."""
    at = "" if row.entropy_step is None else f" (step {row.entropy_step})"
    stale = "" if row.staleness is None else f", batch {row.staleness} update(s) stale"
    if row.staleness is not None and row.continued is not None:  # groups of their own ages
        stale = f", groups at most {row.staleness} update(s) stale, {row.continued} rows continued"
    return (
        f"last step: entropy {_num(row.entropy, '.3f')} nats/token{at}, "
        f"engine-trainer KL {_num(row.engine_kl, '.2e')}, clipped {_num(row.clip_frac, '.1%')}"
        f"{stale}"
    )


def sample_line(sample: dict[str, Any] | None, limit: int = 240) -> str:
    """The newest logged completion on one line (pure): the text a reward is paid for,
    where a rising reward over a degenerating answer shows first."""
    if not sample:
        return "last sample: none yet (training.log_samples)"
    text = " ".join(str(sample.get("completion", "")).split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    reward, tokens = sample.get("reward"), sample.get("tokens")
    return (
        f"last sample (step {sample.get('step', '?')}, reward {_num(reward, '.2f')}, "
        f"{tokens if tokens is not None else '?'} tokens): {text}"
    )


def _event_cells(e: dict, now: float) -> list[str]:
    """One row of the run view's last events; a node decision's has its move as action."""
    keys = ("job_id", "phase", "action", "class", "reason")
    cells = [fmt_age(now - float(e.get("time", now)))] + [str(e.get(k) or "-") for k in keys]
    if not e.get("action"):
        cells[3] = str(e.get("move", "-")).upper()
    return cells


def build_details(d: RunDetail, now: float) -> Group:
    """The ``grpo-status RUN`` view (pure)."""
    keys = ("attempt", "job_id", "submitted_at", "executor", "profile", "nodes", "reason")
    job_rows = [[str(j.get(k, "-")) for k in keys] for j in d.jobs]
    for cells, j in zip(job_rows, d.jobs, strict=True):
        cells[2] = time.strftime("%m-%d %H:%M", time.localtime(j.get("submitted_at") or 0))
        cells[5] += f" of {j['short_of']}" if j.get("short_of") else ""
    ev_rows = [_event_cells(e, now) for e in d.events]
    ckpts = ", ".join(map(str, d.checkpoints[-8:])) or "none"
    final = final_line(d.row)
    parts = [
        build_table([d.row], now),
        *([Text("\n".join(failure_lines(d.row)))] if failure_lines(d.row) else []),
        _plain_table("jobs", "ATTEMPT JOB SUBMITTED EXECUTOR PROFILE NODES REASON", job_rows),
        _plain_table("last events", "AGO JOB PHASE ACTION CLASS REASON", ev_rows),
        *([Text(nodes_line(d.node_moves))] if d.node_moves else []),
        Text(health_line(d.row)),
        Text(sample_line(d.sample)),
        Text(f"complete checkpoints: {ckpts}"),
        Text(final),
        Text(best_line(d.row)),
        Text("reward/mean per step\n" + "\n".join(text_plot(d.rewards))),
    ]
    return Group(*(x for part in parts for x in (part, Text(""))))
