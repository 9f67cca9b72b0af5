"""How many nodes a multi-node run's next attempt asks for, as a pure function.

A run whose node was lost either waits for its full allocation (the default: Slurm queues
it until enough nodes are up again) or, where its profile sets ``nodes_wait_s``, carries on
with the nodes that are left once the lost one has not come back within that many seconds,
and returns to the full allocation when the nodes are back. The global batch is kept:
``rollout.prompts_per_step`` stays what the config says, so each of the fewer ranks trains
more groups (and more micro-batches) per step; a node count whose ranks do not divide the
prompts evenly is skipped for the next smaller one.

:func:`plan_nodes` decides for a run the monitor is about to resubmit; first match wins
(``up``: the partition's nodes in service now; ``full``: the profile's ``nodes``):

=======================================  ==========  ========================================
situation                                move        nodes of the next attempt
=======================================  ==========  ========================================
one-node profile, or ``nodes_wait_s``    FULL        ``full`` (Slurm waits for the nodes)
  unset
up >= full                               FULL        ``full``; GROW where the last job had fewer
no node up                               WAIT        - (until one is)
fewer than ``full`` up for less than     WAIT        - (the seconds left)
  ``nodes_wait_s``
fewer than ``full`` up for longer        SHRINK      the most nodes <= up whose training
                                                     ranks divide ``prompts_per_step`` and
                                                     that the trainer does not refuse
no such count                            WAIT        - (the config cannot run on fewer nodes:
                                                     the reason says why, e.g. a split run
                                                     left without a trainer and a generator)
=======================================  ==========  ========================================

A ``rollout.placement=split`` run's last ``generators`` ranks train nothing: the global
batch is shared by the others, and a count of nodes whose processes cannot hold at least
one trainer and the generators (``config.validate.split_problem``) is one the trainer
refuses at start-up (exit 2); resubmitting on it would only fail again, so the run waits
for its nodes instead.

:func:`should_regrow` decides for a run that is training on fewer nodes than its profile
asks: once ``full`` nodes are up again, the monitor asks the job to checkpoint and exit
(the trainer's stop signal), and the resubmission that follows is FULL.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from grpo_hpc.monitor.decision import fmt_duration


class NodeMove(str, enum.Enum):
    """What happens to a run's node count at its next attempt."""

    FULL = "full"
    """The profile's nodes (waiting in Slurm's queue for them where they are not up)."""
    GROW = "grow"
    """Back to the profile's nodes after an attempt on fewer."""
    SHRINK = "shrink"
    """Fewer nodes than the profile's: a node was lost and not back in time."""
    WAIT = "wait"
    """Do not resubmit yet: a lost node may still come back (or none is up)."""


@dataclass(frozen=True)
class NodeFacts:
    """What the node decision rests on (read by the monitor's shell)."""

    full_nodes: int
    """The profile's ``nodes``."""
    last_nodes: int
    """Nodes the run's newest job asked for."""
    up_nodes: int
    """Nodes of the profile's partition in service now (not down, drained or failing)."""
    short_since: float | None
    """When the monitor first saw fewer than ``full_nodes`` up for this run (None: not)."""
    procs_per_node: int
    """torchrun processes per node."""
    prompts_per_step: int
    """The global batch in prompts (``rollout.prompts_per_step``), kept on any node count."""
    nodes_wait_s: float | None
    """The profile's limit: None (off) keeps the full allocation whatever happens."""
    generators: int = 0
    """Ranks of a ``rollout.placement=split`` run that generate (the last ones): they take
    no share of the global batch (0: every rank trains)."""
    refused: Mapping[int, str] = field(default_factory=dict)
    """Node counts below ``full_nodes`` the trainer refuses to start on, with its reason
    (``config.validate.async_ranks_problem`` on that many processes): e.g. one node of one
    process for a split run, which needs a trainer and a generator."""


@dataclass(frozen=True)
class NodePlan:
    """The node decision for one run."""

    move: NodeMove
    """What happens."""
    nodes: int
    """Nodes of the next attempt (the profile's for WAIT)."""
    reason: str
    """One human line: what was seen and why this count."""
    wait_s: float = 0.0
    """For WAIT: seconds left of ``nodes_wait_s`` (0 when there is no end to it)."""


def usable_nodes(
    up: int, full: int, procs_per_node: int, prompts_per_step: int, generators: int = 0,
    refused: Mapping[int, str] | None = None,
) -> int:  # fmt: skip
    """The most nodes, at most ``min(up, full)``, that the trainer does not refuse and
    whose training ranks (all but ``generators``) split the global batch into whole groups
    per rank (pure); 0 when none does."""
    for k in range(min(up, full), 0, -1):
        trainers = k * procs_per_node - generators
        if k in (refused or {}) or trainers < 1:
            continue
        if prompts_per_step % trainers == 0:
            return k
    return 0


def _refusal(f: NodeFacts) -> str | None:
    """Why the trainer would refuse the most nodes that are up, if it would (pure)."""
    return next((f.refused[k] for k in range(f.up_nodes, 0, -1) if k in f.refused), None)


def plan_nodes(f: NodeFacts, now: float) -> NodePlan:
    """The node count of a run's next attempt (pure; the table in the module docstring)."""
    full = f.full_nodes
    if full <= 1 or f.nodes_wait_s is None:
        return NodePlan(NodeMove.FULL, full, "")
    if f.up_nodes >= full:
        if f.last_nodes < full:
            why = (
                f"{f.up_nodes} nodes up again: back to all {full} (last attempt on {f.last_nodes})"
            )
            return NodePlan(NodeMove.GROW, full, why)
        return NodePlan(NodeMove.FULL, full, "")
    short = f"{f.up_nodes} of the {full} nodes up"
    if f.up_nodes <= 0:
        return NodePlan(NodeMove.WAIT, full, f"{short}: waiting for one to return")
    waited = now - (f.short_since if f.short_since is not None else now)
    left = f.nodes_wait_s - waited
    if left > 0:
        limit = fmt_duration(f.nodes_wait_s)
        why = f"{short}: waiting {fmt_duration(left)} more for the rest (nodes_wait_s {limit})"
        return NodePlan(NodeMove.WAIT, full, why, wait_s=left)
    ppn = f.procs_per_node
    k = usable_nodes(f.up_nodes, full, ppn, f.prompts_per_step, f.generators, f.refused)
    refusal = _refusal(f) if k == 0 else None
    if refusal is not None:
        # resubmitted there, the trainer exits 2 at start-up: the lost nodes are the way on
        why = f"{short}, but the trainer refuses fewer: {refusal}; waiting for all {full}"
        return NodePlan(NodeMove.WAIT, full, why)
    if k == 0:
        why = (
            f"{short}, but rollout.prompts_per_step={f.prompts_per_step} does not split "
            f"over fewer nodes of {f.procs_per_node} process(es): waiting for all {full}"
        )
        return NodePlan(NodeMove.WAIT, full, why)
    per_rank = f.prompts_per_step // (k * ppn - f.generators)
    why = (
        f"{short} for {fmt_duration(waited)} >= nodes_wait_s {fmt_duration(f.nodes_wait_s)}: "
        f"on {k} node(s), global batch kept ({f.prompts_per_step} prompts, {per_rank} per rank)"
    )
    return NodePlan(NodeMove.SHRINK, k, why)


def should_regrow(f: NodeFacts) -> bool:
    """Whether a run training on fewer nodes than its profile's should checkpoint now, so
    its next attempt runs on all of them again (pure): the feature is on, the job has
    fewer nodes than ``full``, and ``full`` nodes are up."""
    return f.nodes_wait_s is not None and f.last_nodes < f.full_nodes <= f.up_nodes
