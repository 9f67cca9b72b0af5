"""The pure parts of the GPU fault campaign (bench/faults/gpu_run.py): the fault
kinds, each trial's moment and target (a function of the seed and the trial index), what
a trial measured, whether it passed, and the campaign's totals. No I/O: tests pin these.

Unlike the CPU campaign (bench/faults/plan.py), GPU kernels are not bit-deterministic, so a
trial is not judged by its final weights against an uninterrupted run's. It is judged by
its resume instead: every resumed attempt's state digest (weights, optimizer, RNG, data
position: grpo_hpc.train.state.state_digest) must equal the one its checkpoint was saved with.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

KINDS = (
    "time_limit",  # the job's time limit: signal lead -> checkpoint -> requeue (longest)
    "kill_rank",  # SIGKILL of one rank mid-step, after a checkpoint exists
    "hang_rank",  # SIGSTOP of one rank: alive, silent; its peer waits in a collective
    "kill_rank_in_save",  # SIGKILL of one rank inside an FSDP2 (DCP) checkpoint save
    "step0_stall",  # generation never returns at step 0 (faults.hang_at_step=0)
    "cuda_oom",  # the update runs out of GPU memory (faults.oom_at_step): stop, no resubmit
)
"""Fault kinds; trial i gets KINDS[i % len(KINDS)]."""
STRUCK = ("kill_rank", "hang_rank", "kill_rank_in_save")
"""Faults the harness strikes from outside; the others are set in the run's own config or
profile and strike by themselves."""
RESUMING = ("time_limit", "kill_rank", "hang_rank", "kill_rank_in_save")
"""Kinds whose run must resume from a checkpoint (they strike after one exists)."""
RANK_LIMIT_S = 120.0
"""A dead or hung rank must end its job within this many seconds."""


@dataclass(frozen=True)
class GpuTrialPlan:
    """One trial: its kind, and for the struck kinds when and whom."""

    index: int
    kind: str
    delay_s: float = 0.0
    """Seconds after the trigger (a step past the first checkpoint; a save starting)."""
    target: int = 1
    """The rank struck (0 or 1)."""


def plan_trial(seed: int, index: int) -> GpuTrialPlan:
    rng = random.Random(f"grpo-gpu-faults/{seed}/{index}")
    kind = KINDS[index % len(KINDS)]
    if kind == "kill_rank_in_save":
        return GpuTrialPlan(index, kind, round(rng.uniform(0.0, 0.4), 3), rng.randrange(2))
    if kind in STRUCK:
        return GpuTrialPlan(index, kind, round(rng.uniform(0.0, 3.0), 2), rng.randrange(2))
    return GpuTrialPlan(index, kind)


@dataclass
class GpuTrialResult:
    """What one GPU trial measured (times in seconds)."""

    index: int
    kind: str
    target: int
    finished: bool = False
    """progress.json says finished at max_steps and the monitor said DONE."""
    stopped: str = ""
    """The monitor's STOP line's class, when it stopped the run (cuda_oom must)."""
    jobs_submitted: int = 0
    max_live_jobs: int = 0
    """Most jobs of the run squeue listed at one poll (2 or more: a duplicate)."""
    bad_checkpoints: int = 0
    attempts: int = 0
    """Trainer attempts (progress.json's attempt + 1)."""
    fault_step: int | None = None
    """The last step logged when the fault struck."""
    ended_s: float | None = None
    """Fault -> the job left RUNNING. The fault's moment: the strike; for the faults a run
    carries in its config or profile (time limit, step-0 stall, OOM) the job's start."""
    act_s: float | None = None
    """Fault -> the monitor's first decision on it (cancel, resubmit, stop); for a job
    requeued in place by its time-limit signal (no decision needed), -> RUNNING again."""
    recover_s: float | None = None
    """Fault -> the first training step logged after the job ended (the next attempt)."""
    steps_repeated: list[int] = field(default_factory=list)
    """Steps logged more than once (work lost to the fault)."""
    resumes: int = 0
    """Resumed ranks whose state digest was compared with their checkpoint's (exact or
    not: the mismatches are listed below)."""
    resume_mismatch: list[str] = field(default_factory=list)
    """``resume-file: parts`` that differ from the checkpoint's digest."""
    decisions: list[str] = field(default_factory=list)
    """The monitor's non-trivial decisions, ``class ACTION``, in order."""
    reason: str = ""
    """progress.json's reason of the faulted attempt (what grpo-status shows)."""
    wall_s: float = 0.0
    injected: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None


def repeated_steps(steps: list[int]) -> list[int]:
    """Steps that appear more than once in the metrics log (pure)."""
    seen: set[int] = set()
    again = []
    for s in steps:
        if s in seen and s not in again:
            again.append(s)
        seen.add(s)
    return again


def verdict(r: GpuTrialResult, save_every: int) -> list[str]:
    """Why a trial failed the campaign's promise ([] = passed)."""
    why = [f"harness: {r.error}"] if r.error else []
    if r.max_live_jobs > 1:
        why.append(f"{r.max_live_jobs} live jobs of one run at once")
    if r.bad_checkpoints:
        why.append(f"{r.bad_checkpoints} checkpoint(s) fail grpo-ckpt verify")
    if r.resume_mismatch:
        why.append("resumed state differs from its checkpoint: " + "; ".join(r.resume_mismatch))
    if len(r.steps_repeated) > save_every:
        why.append(f"steps {r.steps_repeated} repeated (more than the checkpoint interval)")
    if r.kind == "cuda_oom":
        if r.stopped != "out_of_memory" or r.jobs_submitted != 1:
            why.append(f"not stopped once as out_of_memory (stop {r.stopped!r}, "
                       f"{r.jobs_submitted} jobs)")  # fmt: skip
        return why
    if not r.finished:
        why.append("run did not finish")
    if r.kind in RESUMING and not r.resumes:
        why.append("no resume from a checkpoint was seen")
    if r.kind in ("kill_rank", "hang_rank") and (r.ended_s is None or r.ended_s > RANK_LIMIT_S):
        why.append(f"job ended {r.ended_s} s after the fault (limit {RANK_LIMIT_S:g} s)")
    if r.kind == "hang_rank" and "stopped answering" not in r.reason:
        why.append(f"the hang was not named: {r.reason!r}")
    if r.kind == "step0_stall" and not any(d.startswith("stalled_step0") for d in r.decisions):
        why.append("the monitor never called it stalled_step0")
    if r.kind == "time_limit" and r.attempts < 2:
        why.append("the run never hit its time limit")
    return why


def _stats(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"{xs[len(xs) // 2]:.0f} / {xs[-1]:.0f}" if xs else "-"


def summarize(results: list[GpuTrialResult], save_every: int) -> dict[str, Any]:
    """Per kind: trials, passed, and the median / max of each time."""

    def block(rs: list[GpuTrialResult]) -> dict[str, Any]:
        def vals(key: str) -> list[float]:
            return [getattr(r, key) for r in rs if getattr(r, key) is not None]

        return {
            "trials": len(rs),
            "passed": sum(not verdict(r, save_every) for r in rs),
            "jobs_submitted": sum(r.jobs_submitted for r in rs),
            "duplicate_job_trials": sum(r.max_live_jobs > 1 for r in rs),
            "bad_checkpoints": sum(r.bad_checkpoints for r in rs),
            "resumes_exact": f"{sum(r.resumes - len(r.resume_mismatch) for r in rs)} / "
            f"{sum(r.resumes for r in rs)}",
            "steps_repeated_max": max((len(r.steps_repeated) for r in rs), default=0),
            "ended_s": _stats(vals("ended_s")),
            "act_s": _stats(vals("act_s")),
            "recover_s": _stats(vals("recover_s")),
        }

    kinds = [k for k in KINDS if any(r.kind == k for r in results)]
    failed = [
        {"index": r.index, "kind": r.kind, "why": verdict(r, save_every)}
        for r in results
        if verdict(r, save_every)
    ]
    return {
        "total": block(results),
        "by_kind": {k: block([r for r in results if r.kind == k]) for k in kinds},
        "failed": failed,
    }


COLUMNS = (
    ("trials", "trials"), ("passed", "passed"), ("jobs", "jobs_submitted"),
    ("duplicate-job trials", "duplicate_job_trials"), ("bad ckpts", "bad_checkpoints"),
    ("exact resumes", "resumes_exact"), ("most steps redone", "steps_repeated_max"),
    ("job ended, s (med / max)", "ended_s"), ("monitor acted, s", "act_s"),
    ("training again, s", "recover_s"),
)  # fmt: skip


def markdown_table(summary: dict[str, Any]) -> str:
    head = "| kind | " + " | ".join(c for c, _ in COLUMNS) + " |"
    rule = "|---" * (len(COLUMNS) + 1) + "|"

    def row(name: str, b: dict[str, Any]) -> str:
        return f"| {name} | " + " | ".join(str(b[k]) for _, k in COLUMNS) + " |"

    rows = [row(f"`{k}`", b) for k, b in summary["by_kind"].items()]
    return "\n".join([head, rule, *rows, row("**total**", summary["total"])])
