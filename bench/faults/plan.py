"""The pure parts of the fault campaign (bench/faults/run.py): which faults a trial gets, at
which moments (a function of the campaign seed, the placement and the trial index only),
whether a trial passed, and the campaign's totals. No I/O here: tests pin these functions
directly.

A campaign runs in one placement (``--placement``): ``sync``, the synchronous step (every
campaign before asynchronous GRPO, unchanged); ``thread``, every run asynchronous
(``algo.max_staleness=1``), each rank generating ahead in a thread; ``split``, a trainer
process and a generator process under one torchrun (``rollout.placement=split``; the
profile ``slurm-local-split`` runs 2 processes on one node, ``slurm-local-2node`` one on
each of two nodes). docs/async.md.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

SINGLE_NODE = "slurm-local"
TWO_NODE = "slurm-local-2node"
SPLIT_NODE = "slurm-local-split"
"""One node, 2 processes: trainer rank 0, generator rank 1 (bench/faults/profiles/)."""
PLACEMENTS = ("sync", "thread", "split")
PLACEMENT_OVERRIDES: dict[str, tuple[str, ...]] = {
    "sync": (),
    "thread": ("algo.max_staleness=1",),
    "split": ("algo.max_staleness=1", "rollout.placement=split"),
}
"""What every run of a campaign in each placement adds to its config (the reference too)."""

KINDS = (
    "kill_trainer",  # SIGKILL of the trainer process at a random moment of its attempt
    "kill_trainer_in_save",  # ... while a checkpoint is being written (.tmp-step-N exists)
    "kill_trainer_in_first_step",  # ... inside the attempt's first step
    "kill_monitor",  # SIGKILL of grpo-monitor, started again after a while
    "scancel",  # scancel of the run's job
    "restart_slurmctld",  # slurmctld stopped, started again after a while
    "hang_rank",  # SIGSTOP of one trainer rank (two nodes): alive, silent, never answering
    "node_down",  # every process of one node killed, its slurmd included (two nodes)
    "disk_full",  # the filesystem under the run directory filled, freed after a while
    "two_faults",  # two of the single-node faults above in one trial
)
"""Fault kinds (of the sync and thread placements: kinds_for); trial i gets
KINDS[i % len(KINDS)], so every kind recurs evenly."""
COMBINABLE = ("kill_trainer", "kill_trainer_in_save", "kill_monitor", "scancel", "disk_full")
"""The kinds a ``two_faults`` trial draws from (single node, no cluster-wide effects)."""
TWO_NODE_KINDS = ("hang_rank", "node_down")
ROLE_KINDS = (
    "kill_generator",  # SIGKILL of the generator process alone (the last global rank)
    "kill_trainer_only",  # SIGKILL of trainer rank 0 alone, the generator left running
    "hang_generator",  # SIGSTOP of the generator alone: the trainer's watch must end the job
)
"""Split placement only: faults that strike one role, once the run trains (step 1 or later)."""
SPLIT_KINDS = (*ROLE_KINDS, *KINDS)
"""A split run's kinds: its roles' (one node, 2 processes), then every kind of the
synchronous campaign (``kill_trainer`` kills both processes); the two-node ones on two
nodes of one process each: the trainer on grpo-n1, the generator on grpo-n2."""
ALL_KINDS = (*KINDS, *ROLE_KINDS)
"""Every kind of every placement, in the order tables list them."""
ROLE_NAMED = {
    "kill_generator": ("generator (rank", "SIGKILL"),
    "kill_trainer_only": ("trainer (rank", "SIGKILL"),
    "hang_generator": ("stalled_phase", "generator (rank", "stopped answering"),
}
"""What the monitor's first decision after a role's fault must say (its class, its reason):
the process struck, named by its role as the reason names one (``generator (rank 1, pid
... on ...) was killed by SIGKILL``, ``generator (rank 1 on ...) stopped answering``:
docs/async.md); a hang, ended by the trainer's exit 4 (``stalled_phase``), not by the
monitor's heartbeat timeout."""
HANG_LIMIT_S = 120.0
"""A hung generator must have ended its job, and the monitor acted, within this many seconds
of the SIGSTOP (``dist.peer_timeout_s``, 60 s by default, torchrun's 30 s grace for the
stopped process, the monitor's next pass)."""


def kinds_for(placement: str) -> tuple[str, ...]:
    """The fault kinds of a campaign in ``placement``; trial i gets ``kinds[i % len]``. A
    thread-placement run is one process per rank as a synchronous one is: every kind
    applies, the two-node ones on two nodes of one asynchronous DDP rank each."""
    if placement in ("sync", "thread"):
        return KINDS
    if placement == "split":
        return SPLIT_KINDS
    raise ValueError(f"unknown placement {placement!r}: one of {', '.join(PLACEMENTS)}")


EXCLUSIVE = ("restart_slurmctld", "node_down")
"""Faults that reach beyond their own run (the whole cluster, a node): their trials run
alone even with --parallel."""


@dataclass(frozen=True)
class Fault:
    """One fault of a trial."""

    kind: str
    """One of KINDS except ``two_faults``."""
    delay_s: float
    """Seconds after its trigger (the trainer's start, a save starting, the first step,
    the previous fault) at which it strikes."""
    hold_s: float = 0.0
    """How long the fault lasts where it has a duration (monitor down, slurmctld down,
    disk full, node down before it is brought back)."""
    target: int = 0
    """Which rank / node (hang_rank, node_down: 0 or 1)."""


@dataclass(frozen=True)
class TrialPlan:
    """What one trial does: the run, its profile and its faults."""

    index: int
    kind: str
    profile: str
    faults: tuple[Fault, ...]
    placement: str = "sync"
    """Where generation runs (PLACEMENTS): what every run of the campaign adds to its
    config (PLACEMENT_OVERRIDES)."""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "faults": [asdict(f) for f in self.faults]}


def _fault(kind: str, rng: random.Random) -> Fault:
    """A fault of ``kind`` with its moment and duration drawn from ``rng``."""
    if kind in ("kill_trainer", "scancel"):
        return Fault(kind, round(rng.uniform(0.0, 8.0), 2))
    if kind == "kill_trainer_in_save":
        return Fault(kind, round(rng.uniform(0.0, 0.3), 3))  # within the slowed-down save
    if kind == "kill_trainer_in_first_step":
        return Fault(kind, round(rng.uniform(0.0, 0.3), 3))
    if kind == "kill_monitor":
        return Fault(kind, round(rng.uniform(0.0, 10.0), 2), hold_s=round(rng.uniform(0, 6), 2))
    if kind == "restart_slurmctld":
        return Fault(kind, round(rng.uniform(0.0, 8.0), 2), hold_s=round(rng.uniform(1, 6), 2))
    if kind == "hang_rank":
        return Fault(kind, round(rng.uniform(0.0, 6.0), 2), target=rng.randrange(2))
    if kind == "node_down":
        return Fault(kind, round(rng.uniform(0.0, 6.0), 2), hold_s=5.0, target=rng.randrange(2))
    if kind == "disk_full":
        return Fault(kind, round(rng.uniform(0.0, 8.0), 2), hold_s=round(rng.uniform(2, 8), 2))
    if kind in ROLE_KINDS:  # after the trigger: a step past the first checkpoint
        return Fault(kind, round(rng.uniform(0.0, 2.0), 2))
    raise ValueError(f"unknown fault kind {kind!r}")


def profile_for(kind: str, placement: str) -> str:
    """The profile of a trial of ``kind`` (the reference run of each profile is made in the
    same placement)."""
    if kind in TWO_NODE_KINDS:
        return TWO_NODE
    return SPLIT_NODE if placement == "split" else SINGLE_NODE


def plan_trial(seed: int, index: int, placement: str = "sync") -> TrialPlan:
    """Trial ``index`` of the campaign with ``seed`` in ``placement``: the same whatever the
    number of trials (a failing trial can be rerun alone with --only). A synchronous
    campaign's trials are those of every campaign before the placements existed."""
    kinds = kinds_for(placement)
    key = f"{seed}/{index}" if placement == "sync" else f"{placement}/{seed}/{index}"
    rng = random.Random(f"grpo-faults/{key}")
    kind = kinds[index % len(kinds)]
    if kind == "two_faults":
        first, second = rng.sample(COMBINABLE, 2)
        faults = (_fault(first, rng), _fault(second, rng))
    else:
        faults = (_fault(kind, rng),)
    return TrialPlan(index, kind, profile_for(kind, placement), faults, placement)


def batches(plans: list[TrialPlan], parallel: int) -> list[list[TrialPlan]]:
    """Groups of trials run at the same time, in order: at most ``parallel`` per group,
    and a trial whose fault reaches beyond its run (EXCLUSIVE) in a group of its own."""
    out: list[list[TrialPlan]] = []
    group: list[TrialPlan] = []
    for p in plans:
        if any(f.kind in EXCLUSIVE for f in p.faults):
            out += [group] if group else []
            out.append([p])
            group = []
            continue
        group.append(p)
        if len(group) >= max(1, parallel):
            out.append(group)
            group = []
    return out + ([group] if group else [])


def plan_campaign(seed: int, trials: int, placement: str = "sync") -> list[TrialPlan]:
    return [plan_trial(seed, i, placement) for i in range(trials)]


@dataclass
class TrialResult:
    """What a trial measured."""

    index: int
    kind: str
    profile: str
    faults: list[dict[str, Any]]
    finished: bool = False
    """The run's progress says finished at max_steps and its monitor said DONE."""
    weights_match: bool | None = None
    """Final weights equal (every tensor, bit for bit) to the uninterrupted run's."""
    jobs_submitted: int = 0
    """Entries in jobs.jsonl (Slurm jobs of the run)."""
    jobs_seen: int = 0
    """Distinct job ids of the run squeue showed."""
    max_live_jobs: int = 0
    """Most jobs of the run squeue listed at one poll (2 or more: a duplicate)."""
    bad_checkpoints: int = 0
    """Checkpoints ``grpo-ckpt verify`` calls BAD."""
    recover_s: float | None = None
    """From the (first) fault to the next training step logged after it."""
    wall_s: float = 0.0
    monitor_rc: int | None = None
    struck: int = 0
    """Faults that struck (a fault whose trigger never came, e.g. the run had finished, not)."""
    injected: list[str] = field(default_factory=list)
    """What the injector did, in order (with times from the trial start)."""
    error: str | None = None
    """Why the trial itself could not be carried out (harness or cluster problem)."""
    notes: list[str] = field(default_factory=list)
    decision: str = ""
    """The monitor's first decision after the (first) fault that acts (not NONE, not DONE),
    as ``class: reason``: which failure it saw, and whom the reason blames."""
    act_s: float | None = None
    """From the (first) fault to that decision."""


def first_decision(events: list[dict[str, Any]], t_fault: float) -> tuple[str, float | None]:
    """The monitor's first decision after ``t_fault`` that acts (events.jsonl's records;
    not NONE, not DONE) as ``class: reason``, and the seconds from the fault to it; ("",
    None) when it took none."""
    for e in events:
        acts = e.get("phase") == "decision" and e.get("action") not in (None, "NONE", "DONE")
        if acts and float(e.get("time", 0)) > t_fault:
            return f"{e.get('class')}: {e.get('reason')}", round(float(e["time"]) - t_fault, 1)
    return "", None


def verdict(r: TrialResult) -> list[str]:
    """Why the trial failed the campaign's promise ([] = it passed)."""
    why = []
    if r.error:
        why.append(f"harness: {r.error}")
    if not r.finished:
        why.append("run did not finish")
    if r.weights_match is False:
        why.append("final weights differ from the uninterrupted run")
    if r.finished and r.weights_match is None:
        why.append("final weights missing")
    if r.max_live_jobs > 1:
        why.append(f"{r.max_live_jobs} live jobs of one run at once")
    if r.bad_checkpoints:
        why.append(f"{r.bad_checkpoints} checkpoint(s) fail grpo-ckpt verify")
    return why + role_verdict(r)


def role_verdict(r: TrialResult) -> list[str]:
    """A role's fault that struck must be seen as that role's (ROLE_NAMED), a hang within
    HANG_LIMIT_S ([] for every other kind, and for a fault that never struck)."""
    if r.kind not in ROLE_NAMED or not r.struck:
        return []
    why = []
    missing = [w for w in ROLE_NAMED[r.kind] if w not in r.decision]
    if missing:
        why.append(f"the monitor's decision does not say {missing}: {r.decision!r}")
    if r.kind == "hang_generator" and (r.act_s is None or r.act_s > HANG_LIMIT_S):
        why.append(f"the monitor acted {r.act_s} s after the hang (limit {HANG_LIMIT_S:g} s)")
    return why


def summarize(results: list[TrialResult]) -> dict[str, Any]:
    """Totals over trials, and per fault kind."""

    def block(rs: list[TrialResult]) -> dict[str, Any]:
        rec = sorted(r.recover_s for r in rs if r.recover_s is not None)
        return {
            "trials": len(rs),
            "passed": sum(not verdict(r) for r in rs),
            "finished": sum(r.finished for r in rs),
            "weights_identical": sum(r.weights_match is True for r in rs),
            "jobs_submitted": sum(r.jobs_submitted for r in rs),
            "duplicate_job_trials": sum(r.max_live_jobs > 1 for r in rs),
            "bad_checkpoints": sum(r.bad_checkpoints for r in rs),
            "recover_s_median": rec[len(rec) // 2] if rec else None,
            "recover_s_max": rec[-1] if rec else None,
            "trial_wall_s_mean": round(sum(r.wall_s for r in rs) / len(rs), 1) if rs else None,
        }

    kinds = sorted({r.kind for r in results}, key=ALL_KINDS.index)
    failed = [{"index": r.index, "kind": r.kind, "why": verdict(r)} for r in results if verdict(r)]
    return {
        "total": block(results),
        "by_kind": {k: block([r for r in results if r.kind == k]) for k in kinds},
        "failed": failed,
    }


def markdown_table(summary: dict[str, Any]) -> str:
    """The per-kind table of bench/results/LOG.md from a campaign's ``summary``."""
    head = (
        "| kind | trials | passed | finished | weights identical | jobs | duplicate-job "
        "trials | bad checkpoints | recover median / max s | trial mean s |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )

    def row(name: str, b: dict[str, Any]) -> str:
        cells = [b[k] for k in ("trials", "passed", "finished", "weights_identical")]
        cells += [b["jobs_submitted"], b["duplicate_job_trials"], b["bad_checkpoints"]]
        cells += [f"{b['recover_s_median']} / {b['recover_s_max']}", b["trial_wall_s_mean"]]
        return f"| {name} | " + " | ".join(str(c) for c in cells) + " |"

    rows = [row(f"`{k}`", b) for k, b in summary["by_kind"].items()]
    return "\n".join([head, *rows, row("**total**", summary["total"])])
