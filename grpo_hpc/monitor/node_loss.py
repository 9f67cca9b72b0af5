"""The monitor's shell around the node decision (grpo_hpc/monitor/nodes.py): reads what it
rests on (the run's profile and config, the partition's nodes in service, the run's
``nodes`` events) and turns the pass's action into one on the nodes that are left.

Only a run whose profile has ``nodes > 1`` and sets ``nodes_wait_s`` is touched, and only
when the pass is about to resubmit it, or while it trains on fewer nodes than its
profile's: one ``sinfo`` call then, none in the steady state of a full run.

Each change of the node decision is one ``nodes`` event in events.jsonl (``move``:
wait, shrink, grow, full; ``up``/``full`` nodes; the reason), which is also where the
wait for a lost node is counted from (:func:`short_since`), so a restarted monitor keeps
counting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from grpo_hpc.config.load import load_resolved
from grpo_hpc.config.profiles import load_run_profile
from grpo_hpc.config.validate import async_ranks_problem
from grpo_hpc.core import events as event_log
from grpo_hpc.core.events import Event, Phase
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.runs import COMPLETING, RUNNING_STATES, JobView
from grpo_hpc.core.slurm import ACTIVE_STATES
from grpo_hpc.monitor.decision import RESUBMIT_KINDS, Action, ActionKind, FailureClass
from grpo_hpc.monitor.nodes import NodeFacts, NodeMove, NodePlan, plan_nodes, should_regrow

NODES_PHASE = Phase.NODES
"""``phase`` of the node decision's events."""
SHORT_MOVES = (NodeMove.WAIT.value, NodeMove.SHRINK.value)
LOSS_CLASSES = (FailureClass.NODE_FAIL, FailureClass.LOST)


def short_since(events: list[dict[str, Any]]) -> float | None:
    """When the run's current shortage of nodes was first seen (pure): the first wait or
    shrink ``nodes`` event after the last full or grow one."""
    since = None
    for ev in events:
        if ev.get("phase") != NODES_PHASE:
            continue
        if ev.get("move") in SHORT_MOVES:
            since = float(ev["time"]) if since is None else since
        else:
            since = None
    return since


def read_facts(
    paths: RunPaths,
    jobs: list[dict[str, Any]],
    events: list[dict[str, Any]],
    up_nodes: Callable[[str | None], int],
) -> NodeFacts | None:
    """The facts of a run the node decision applies to; None for any other run (one node,
    ``nodes_wait_s`` unset, a run directory without its profile)."""
    if not paths.profile.is_file() or not paths.config.is_file():
        return None
    profile = load_run_profile(paths)
    if profile.nodes <= 1 or profile.nodes_wait_s is None:
        return None
    cfg = load_resolved(paths.config)
    ppn = profile.procs_per_node
    refused = {
        k: why for k in range(1, profile.nodes) if (why := async_ranks_problem(cfg, k * ppn))
    }
    return NodeFacts(
        full_nodes=profile.nodes,
        last_nodes=int(jobs[-1].get("nodes") or profile.nodes) if jobs else profile.nodes,
        up_nodes=up_nodes(profile.partition),
        short_since=short_since(events),
        procs_per_node=profile.procs_per_node,
        prompts_per_step=cfg.rollout.prompts_per_step,
        nodes_wait_s=profile.nodes_wait_s,
        generators=cfg.rollout.generators if cfg.rollout.placement == "split" else 0,
        refused=refused,
    )


def _record(paths: RunPaths, events: list[dict[str, Any]], job: JobView, plan: NodePlan,
            facts: NodeFacts, t: float) -> None:  # fmt: skip
    """A ``nodes`` event when the decision changed (the first shortage, a shrink, a grow)."""
    last = next((e for e in reversed(events) if e.get("phase") == NODES_PHASE), None)
    moved = None if last is None else last.get("move")
    if plan.move is NodeMove.FULL and moved in (None, NodeMove.GROW.value):
        return  # no shortage began, or a grow already ended it
    if moved == plan.move.value and not _held_anew(last, plan):
        return
    more = {"move": plan.move.value, "nodes": plan.nodes, "up": facts.up_nodes,
            "full": facts.full_nodes}  # fmt: skip
    ev = Event(t, job.job_id, Phase.NODES, reason=plan.reason, extra=more)
    event_log.append(paths.events, ev)
    events.append(ev.row())


def _held_anew(last: dict[str, Any] | None, plan: NodePlan) -> bool:
    """A wait with no end of its own (the config runs on no fewer nodes: e.g. a split run
    left without room for a trainer and its generator) after another wait: a new event,
    its reason saying why the run is not resubmitted on the nodes left (pure)."""
    held = plan.move is NodeMove.WAIT and not plan.wait_s
    return held and last is not None and last.get("reason") != plan.reason


def _case(job: JobView, action: Action, entry: dict[str, Any]) -> str | None:
    """Which of the node decision's cases a run is in (pure): ``resubmit`` (the pass is
    about to resubmit it, or waits to after a node failure), ``queued`` (its multi-node job
    waits in the queue, e.g. requeued by Slurm after NODE_FAIL), ``short`` (it trains on
    fewer nodes than its profile's); None: not the node decision's business, which a
    COMPLETING job never is (after a node failure its allocation still holds the nodes
    left: it is neither cancelled nor replaced before Slurm releases them)."""
    loss_wait = action.kind is ActionKind.WAIT and action.failure_class in LOSS_CLASSES
    if action.kind in RESUBMIT_KINDS or loss_wait:
        return "resubmit"
    if action.kind is not ActionKind.NONE or job.state == COMPLETING:
        return None
    if job.state in RUNNING_STATES:
        return "short" if entry.get("short_of") is not None else None
    if job.state in ACTIVE_STATES and int(entry.get("nodes") or 1) > 1:
        return "queued"
    return None


def on_nodes_left(
    paths: RunPaths,
    job: JobView,
    action: Action,
    jobs: list[dict[str, Any]],
    events: list[dict[str, Any]],
    t: float,
    up_nodes: Callable[[str | None], int],
) -> tuple[Action, int | None]:
    """The pass's action for the nodes that are up, and the node count to resubmit on
    (None: the profile's). A resubmission, or a job waiting in the queue for nodes that
    are down, waits up to ``nodes_wait_s`` for them, then goes on the nodes left; a job
    training on fewer nodes is checkpointed (cancelled: the trainer saves on SIGTERM) once
    all of them are up again, and resubmitted on all."""
    case = _case(job, action, jobs[-1]) if jobs else None
    facts = read_facts(paths, jobs, events, up_nodes) if case else None
    if facts is None:
        return action, None
    if case == "short":
        if not should_regrow(facts):
            return action, None
        _record(paths, events, job, plan_nodes(facts, t), facts, t)  # GROW: the shortage ends
        why = (
            f"{facts.up_nodes} nodes up again, job {job.job_id} trains on {facts.last_nodes}: "
            f"checkpoint and resume on all {facts.full_nodes}"
        )
        return Action(ActionKind.CANCEL_AND_RESUBMIT, FailureClass.NODES_BACK, why, True), None
    plan = plan_nodes(facts, t)
    if case == "queued" and facts.up_nodes >= facts.last_nodes and plan.move is not NodeMove.GROW:
        if plan.move is NodeMove.FULL:
            _record(paths, events, job, plan, facts, t)  # a shortage seen before is over
        return action, None  # its nodes are up: it waits for its turn, not for a node
    _record(paths, events, job, plan, facts, t)
    if plan.move is NodeMove.FULL or (case == "resubmit" and action.kind is ActionKind.WAIT):
        return action, None
    if plan.move is NodeMove.WAIT:
        if case == "queued" or action.cancel:  # a stalled job is cancelled all the same
            return dataclasses.replace(action, reason=f"{action.reason}; {plan.reason}"), None
        wait = Action(ActionKind.WAIT, action.failure_class, f"{action.reason}; {plan.reason}")
        return dataclasses.replace(wait, wait_s=plan.wait_s), None
    if case == "queued":
        if plan.move is NodeMove.SHRINK and plan.nodes >= facts.last_nodes:
            return action, None
        why = f"job {job.job_id} {job.state} for {facts.last_nodes} node(s); {plan.reason}"
        cls = FailureClass.NODES_BACK if plan.move is NodeMove.GROW else FailureClass.NODE_FAIL
        return Action(ActionKind.CANCEL_AND_RESUBMIT, cls, why, True), plan.nodes
    return dataclasses.replace(action, reason=f"{action.reason}; {plan.reason}"), plan.nodes
