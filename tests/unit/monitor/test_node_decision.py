"""Carrying on with the nodes that are left: the pure node decision row by row, then the
monitor's shell around it (a run's profile and config on disk, Slurm faked) through a
node loss, the wait, the run on fewer nodes, and the return to all of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from grpo_hpc.config.load import build_config, to_yaml
from grpo_hpc.config.profiles import ConfigError, load_profile, profile_to_dict
from grpo_hpc.config.validate import split_problem
from grpo_hpc.core.fsutil import append_jsonl, read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.runs import JobView
from grpo_hpc.monitor.attempts import record_adopted
from grpo_hpc.monitor.decision import Action, ActionKind, FailureClass
from grpo_hpc.monitor.loop import monitor_pass, worth_saying
from grpo_hpc.monitor.node_loss import _case as node_case
from grpo_hpc.monitor.node_loss import short_since
from grpo_hpc.monitor.nodes import NodeFacts, NodeMove, plan_nodes, should_regrow, usable_nodes
from grpo_hpc.submit.job import attempt_nodes

from .test_monitor_decide import FAST, NOW, FakeSlurm, Killed, jobs_of, make_run, rec

K, C, M = ActionKind, FailureClass, NodeMove


def facts(**kw: object) -> NodeFacts:
    base: dict = dict(full_nodes=4, last_nodes=4, up_nodes=4, short_since=None,
                      procs_per_node=2, prompts_per_step=16, nodes_wait_s=600.0)  # fmt: skip
    return NodeFacts(**{**base, **kw})


@pytest.mark.parametrize(
    ("kw", "move", "nodes", "says"),
    [
        (dict(nodes_wait_s=None, up_nodes=2), M.FULL, 4, ""),  # off: wait in the queue
        (dict(full_nodes=1, last_nodes=1, up_nodes=0), M.FULL, 1, ""),  # one node: nothing to do
        (dict(), M.FULL, 4, ""),
        (dict(last_nodes=2), M.GROW, 4, "back to all 4 (last attempt on 2)"),
        (dict(up_nodes=0, short_since=NOW - 9999), M.WAIT, 4, "0 of the 4 nodes up"),
        (dict(up_nodes=3, short_since=NOW - 100), M.WAIT, 4, "waiting 8 min more"),
        (dict(up_nodes=3), M.WAIT, 4, "waiting 10 min more"),  # first seen now
        # 3 nodes x 2 ranks do not split 16 prompts: the next smaller count that does
        (dict(up_nodes=3, short_since=NOW - 600), M.SHRINK, 2, "on 2 node(s), global batch"),
        (dict(up_nodes=2, short_since=NOW - 700), M.SHRINK, 2, "(16 prompts, 4 per rank)"),
        (dict(up_nodes=1, short_since=NOW - 700, prompts_per_step=6), M.SHRINK, 1, "3 per rank"),
        (dict(up_nodes=3, short_since=NOW - 700, prompts_per_step=5), M.WAIT, 4, "does not split"),
    ],
)
def test_plan_nodes_table(kw: dict, move: NodeMove, nodes: int, says: str) -> None:
    plan = plan_nodes(facts(**kw), NOW)
    assert (plan.move, plan.nodes) == (move, nodes) and says in plan.reason


def test_usable_nodes_keeps_whole_groups_per_rank() -> None:
    assert [usable_nodes(up, 8, 8, 64) for up in (8, 7, 5, 4, 3, 2, 1, 0)] == [
        8,
        4,
        4,
        4,
        2,
        2,
        1,
        0,
    ]
    assert usable_nodes(16, 4, 1, 12) == 4  # never more than the profile's nodes


def _split_refusals(nodes: int, per_node: int) -> dict[int, str]:
    """What the trainer of a split run refuses on fewer nodes (node_loss.read_facts's)."""
    cfg = build_config("tiny", ["algo.max_staleness=1", "rollout.placement=split"])
    cfg.dist.nproc_per_node = per_node
    out = {k: split_problem(cfg, k * per_node) for k in range(1, nodes)}
    return {k: why for k, why in out.items() if why}


def test_a_split_run_waits_for_its_nodes_not_for_a_job_its_trainer_refuses() -> None:
    """2 nodes x 1 process, split (trainer on one, generator on the other): one node left
    holds one process, which the trainer refuses (a trainer and a generator are needed),
    so the run waits for its nodes after nodes_wait_s, saying why, instead of a resubmission
    that exits 2. On 4 nodes the generator takes no share of the batch: 3 nodes left are
    2 trainers, which split 4 prompts (a thread run's 3 ranks do not)."""
    split = dict(full_nodes=2, last_nodes=2, up_nodes=1, procs_per_node=1, prompts_per_step=4,
                 short_since=NOW - 700, generators=1, refused=_split_refusals(2, 1))  # fmt: skip
    plan = plan_nodes(facts(**split), NOW)
    assert (plan.move, plan.nodes, plan.wait_s) == (M.WAIT, 2, 0.0), plan
    assert plan.reason.startswith("1 of the 2 nodes up, but the trainer refuses fewer: ")
    assert "1 generator and at least 1 trainer process, not 1" in plan.reason
    assert plan.reason.endswith("; waiting for all 2")
    four = split | dict(full_nodes=4, last_nodes=4, up_nodes=3, refused=_split_refusals(4, 1))
    plan = plan_nodes(facts(**four), NOW)
    assert (plan.move, plan.nodes) == (M.SHRINK, 3) and "2 per rank" in plan.reason
    thread = four | dict(generators=0, refused={})
    assert plan_nodes(facts(**thread), NOW).nodes == 2


def test_should_regrow_only_a_short_run_whose_nodes_are_back() -> None:
    assert should_regrow(facts(last_nodes=2, up_nodes=4))
    assert not should_regrow(facts(last_nodes=2, up_nodes=3))
    assert not should_regrow(facts(last_nodes=4, up_nodes=4))
    assert not should_regrow(facts(last_nodes=2, up_nodes=4, nodes_wait_s=None))


def test_short_since_counts_from_the_first_shortage_until_the_nodes_are_back() -> None:
    ev = lambda t, move: {"time": t, "phase": "nodes", "move": move}  # noqa: E731
    assert short_since([]) is None
    assert short_since([ev(1, "wait"), {"time": 2, "phase": "decision"}, ev(3, "shrink")]) == 1
    assert short_since([ev(1, "wait"), ev(3, "shrink"), ev(5, "grow")]) is None
    assert short_since([ev(1, "wait"), ev(5, "grow"), ev(7, "wait")]) == 7


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("nodes_wait_s", -1, "nodes_wait_s must be a number of seconds >= 0"),
        ("nodes_wait_s", "900", "nodes_wait_s must be a number, written unquoted"),
        ("link_gbps", 0, "link_gbps must be > 0"),
    ],
)
def test_profile_refuses_bad_node_keys(tmp_path: Path, key: str, value: object, says: str) -> None:
    data = {**profile_to_dict(load_profile("slurm-local-2node")), key: value}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=says):
        load_profile(str(tmp_path / "p.yaml"))


# ------------------------------------------------------------------------ the shell


class NodeCluster(FakeSlurm):
    """FakeSlurm plus the partition's nodes in service and resubmission on fewer nodes."""

    def __init__(self, up: int) -> None:
        super().__init__()
        self.up, self.sinfo_calls, self.on_nodes = up, 0, []
        self.ending: set[str] = set()  # ended in accounting, still listed by squeue

    def queued(self) -> set[str]:
        return super().queued() | self.ending

    def up_nodes(self, partition: str | None) -> int:
        self.sinfo_calls += 1
        return self.up

    def resubmit_on(self, paths: RunPaths, reason: str, nodes: int) -> str:
        self.on_nodes.append(nodes)
        job = self.resubmit(paths, reason)
        *before, entry = read_jsonl(paths.jobs)  # recorded as submit.job.record_job does
        entry |= {"nodes": nodes, **({"short_of": 4} if nodes < 4 else {})}
        paths.jobs.write_text("".join(json.dumps(e) + "\n" for e in [*before, entry]))
        return job

    def backend(self):  # noqa: ANN201
        b = super().backend()
        b.up_nodes, b.resubmit_on = self.up_nodes, self.resubmit_on
        return b


def four_node_run(root: Path, s: NodeCluster, state: str, wait_s: float | None) -> RunPaths:
    """A run of 4 nodes x 1 process, 4 prompts per step, its job (100) in ``state``."""
    p = make_run(root, "r", "100", state, s, progress=rec(state=rec().state))
    profile = {**profile_to_dict(load_profile("slurm-local-2node")), "nodes": 4}
    profile["nodes_wait_s"] = wait_s
    p.profile.write_text(yaml.safe_dump(profile))
    p.config.write_text(to_yaml(build_config("tiny", ["rollout.prompts_per_step=4"])))
    entry = read_jsonl(p.jobs)[0]
    p.jobs.write_text("")
    append_jsonl(p.jobs, {**entry, "nodes": 4})
    return p


def node_events(p: RunPaths) -> list[tuple[str, int, int]]:
    return [(e["move"], e["nodes"], e["up"]) for e in read_jsonl(p.events) if e["phase"] == "nodes"]


def test_a_requeued_job_waits_for_its_node_then_runs_on_the_nodes_left_then_on_all(
    tmp_path: Path,
) -> None:
    s = NodeCluster(up=2)  # Slurm requeued job 100 after NODE_FAIL: pending for 4 nodes
    p = four_node_run(tmp_path, s, "PENDING", wait_s=600)
    (o,) = monitor_pass([p], FAST, lambda: NOW, s.backend())
    assert o.action.kind is K.NONE and "2 of the 4 nodes up: waiting 10 min more" in o.action.reason
    assert not worth_saying(o)  # a plain NONE: grpo-monitor prints nothing
    (o,) = monitor_pass([p], FAST, lambda: NOW + 300, s.backend())
    assert o.action.kind is K.NONE and "waiting 5 min more" in o.action.reason
    assert jobs_of(p) == ["100"] and node_events(p) == [("wait", 4, 2)]

    (o,) = monitor_pass([p], FAST, lambda: NOW + 601, s.backend())
    assert (o.action.kind, o.action.failure_class) == (K.CANCEL_AND_RESUBMIT, C.NODE_FAIL)
    assert "on 2 node(s), global batch kept (4 prompts, 2 per rank)" in o.action.reason
    assert s.cancelled == ["100"] and s.on_nodes == [2] and jobs_of(p) == ["100", "201"]
    assert read_jsonl(p.jobs)[-1]["reason"] == "monitor: node_fail (on 2 node(s))"
    assert node_events(p) == [("wait", 4, 2), ("shrink", 2, 2)]

    s.states["201"] = "RUNNING"  # trains on 2 nodes; then the lost nodes return
    (o,) = monitor_pass([p], FAST, lambda: NOW + 700, s.backend())
    assert o.action.kind is K.NONE and jobs_of(p) == ["100", "201"]
    s.up = 4
    (o,) = monitor_pass([p], FAST, lambda: NOW + 800, s.backend())
    assert (o.action.kind, o.action.failure_class) == (K.CANCEL_AND_RESUBMIT, C.NODES_BACK)
    assert (
        "4 nodes up again, job 201 trains on 2: checkpoint and resume on all 4" in o.action.reason
    )
    assert s.cancelled == ["100", "201"] and s.on_nodes == [2] and jobs_of(p)[-1] == "202"
    assert "nodes" not in read_jsonl(p.jobs)[-1]  # the profile's own count (FakeSlurm.resubmit)
    assert node_events(p) == [("wait", 4, 2), ("shrink", 2, 2), ("grow", 4, 4)]

    s.states["202"] = "COMPLETED"  # on all 4 nodes, nothing more to decide about nodes
    calls = s.sinfo_calls
    s.states["202"] = "RUNNING"
    monitor_pass([p], FAST, lambda: NOW + 900, s.backend())
    assert s.sinfo_calls == calls  # a full run asks no sinfo


def test_an_ended_node_fail_job_is_resubmitted_on_the_nodes_left_after_the_wait(
    tmp_path: Path,
) -> None:
    s = NodeCluster(up=3)  # NODE_FAIL and not requeued (a site with JobRequeue=0)
    p = four_node_run(tmp_path, s, "NODE_FAIL", wait_s=120)
    (o,) = monitor_pass([p], FAST, lambda: NOW, s.backend())
    assert o.action.kind is K.WAIT and "3 of the 4 nodes up: waiting 2 min more" in o.action.reason
    (o,) = monitor_pass([p], FAST, lambda: NOW + 121, s.backend())
    assert o.action.kind is K.RESUBMIT and s.on_nodes == [2]  # 3 x 1 rank: 4 prompts do not split
    assert node_events(p) == [("wait", 4, 3), ("shrink", 2, 3)]


def test_a_split_run_on_two_nodes_is_not_resubmitted_on_the_one_left(tmp_path: Path) -> None:
    """The monitor's shell, a split run of 2 nodes x 1 process ended NODE_FAIL with one
    node up: it waits out nodes_wait_s, then keeps waiting (no job on the node left, which
    the trainer would refuse), the refusal in a ``nodes`` event; the node back, it
    resubmits on both."""
    s = NodeCluster(up=1)
    p = make_run(tmp_path, "r", "100", "NODE_FAIL", s, progress=rec(state=rec().state))
    profile = {**profile_to_dict(load_profile("slurm-local-2node")), "nodes_wait_s": 120}
    p.profile.write_text(yaml.safe_dump(profile))
    over = ["algo.max_staleness=1", "rollout.placement=split", "rollout.prompts_per_step=4"]
    p.config.write_text(to_yaml(build_config("tiny", over)))
    (o,) = monitor_pass([p], FAST, lambda: NOW, s.backend())
    assert o.action.kind is K.WAIT and "waiting 2 min more" in o.action.reason
    (o,) = monitor_pass([p], FAST, lambda: NOW + 121, s.backend())
    assert o.action.kind is K.WAIT and s.on_nodes == [] and jobs_of(p) == ["100"], o.action
    assert "the trainer refuses fewer: rollout.placement=split runs 1 generator" in o.action.reason
    held = [e for e in read_jsonl(p.events) if e["phase"] == "nodes"]
    assert [(e["move"], e["nodes"], e["up"]) for e in held] == [("wait", 2, 1), ("wait", 2, 1)]
    assert "the trainer refuses fewer" in held[-1]["reason"]
    monitor_pass([p], FAST, lambda: NOW + 200, s.backend())  # said once
    assert len([e for e in read_jsonl(p.events) if e["phase"] == "nodes"]) == 2
    s.up = 2
    (o,) = monitor_pass([p], FAST, lambda: NOW + 300, s.backend())
    assert o.action.kind is K.RESUBMIT and s.on_nodes == [] and len(jobs_of(p)) == 2, o.action


def test_off_by_default_a_pending_job_waits_for_all_its_nodes(tmp_path: Path) -> None:
    s = NodeCluster(up=1)
    p = four_node_run(tmp_path, s, "PENDING", wait_s=None)
    for t in (0, 10_000):
        (o,) = monitor_pass([p], FAST, lambda t=t: NOW + t, s.backend())
        assert o.action.kind is K.NONE
    assert jobs_of(p) == ["100"] and s.cancelled == [] and node_events(p) == []


@pytest.mark.parametrize(
    ("state", "action", "entry", "case"),
    [
        ("NODE_FAIL", Action(K.RESUBMIT, C.NODE_FAIL), {}, "resubmit"),
        ("NODE_FAIL", Action(K.WAIT, C.NODE_FAIL), {}, "resubmit"),  # in its backoff
        ("FAILED", Action(K.WAIT, C.CRASH), {}, None),
        ("PENDING", Action(K.NONE), {"nodes": 4}, "queued"),  # requeued after NODE_FAIL
        ("REQUEUED", Action(K.NONE), {"nodes": 4}, "queued"),
        ("PENDING", Action(K.NONE), {"nodes": 1}, None),
        # ended, its allocation not yet released: neither cancelled nor replaced
        ("COMPLETING", Action(K.NONE), {"nodes": 4}, None),
        ("COMPLETING", Action(K.NONE), {"nodes": 2, "short_of": 4}, None),
        ("RUNNING", Action(K.NONE), {"nodes": 2, "short_of": 4}, "short"),
        ("RUNNING", Action(K.NONE), {"nodes": 4}, None),
    ],
)
def test_which_runs_the_node_decision_acts_on(
    state: str, action: Action, entry: dict, case: str | None
) -> None:
    assert node_case(JobView("100", state), action, entry) == case


def test_a_job_completing_after_a_node_failure_is_waited_for_not_cancelled(
    tmp_path: Path,
) -> None:
    """NODE_FAIL in accounting while squeue still lists the job (its part on the nodes left
    is still being killed, seen for 40 s on the test cluster): however long nodes_wait_s has
    run out, the pass neither cancels it nor submits on the nodes left, nor asks sinfo; it
    says why in its decision event. Once Slurm has requeued it (pending), the wait is over
    and it is replaced on the nodes left."""
    s = NodeCluster(up=2)
    p = four_node_run(tmp_path, s, "NODE_FAIL", wait_s=0)
    s.ending.add("100")  # job_view: an end in accounting, still in squeue -> COMPLETING
    (o,) = monitor_pass([p], FAST, lambda: NOW, s.backend())
    assert o.action.kind is K.NONE and o.job_id == "100", o.action
    assert "COMPLETING: Slurm has not released its nodes yet" in o.action.reason
    assert worth_saying(o)  # grpo-monitor prints it, though it does nothing
    assert s.cancelled == [] and s.on_nodes == [] and jobs_of(p) == ["100"]
    assert s.sinfo_calls == 0 and node_events(p) == []
    (ev,) = [e for e in read_jsonl(p.events) if e["phase"] == "decision"]
    assert (ev["slurm_state"], ev["action"]) == ("COMPLETING", "NONE")
    assert not [e for e in read_jsonl(p.events) if e["phase"] == "intent"]

    s.ending.clear()
    s.states["100"] = "PENDING"  # requeued: its nodes are released
    (o,) = monitor_pass([p], FAST, lambda: NOW + 5, s.backend())
    assert (o.action.kind, o.action.failure_class) == (K.CANCEL_AND_RESUBMIT, C.NODE_FAIL)
    assert s.cancelled == ["100"] and s.on_nodes == [2]


@pytest.mark.parametrize(
    ("full", "asked", "record"),
    [(4, None, (4, None)), (4, 2, (2, 4)), (4, 1, (1, 4)), (4, 4, (4, None)), (1, None, (1, None))],
)
def test_attempt_record_says_the_nodes_it_was_submitted_on(
    full: int, asked: int | None, record: tuple[int, int | None]
) -> None:
    assert attempt_nodes(full, asked) == record


def test_a_job_adopted_after_a_shrink_is_recorded_on_its_nodes_and_grows_back(
    tmp_path: Path,
) -> None:
    """A monitor killed between sbatch (on the 2 nodes left of 4) and jobs.jsonl: the next
    pass adopts that job through submit.job.adopt, recorded on 2 nodes ``short_of`` 4 as
    a submission is (on the test cluster it was recorded with the profile's 4: the run was
    then taken for a full one and never went back to all its nodes)."""
    s = NodeCluster(up=2)
    p = four_node_run(tmp_path, s, "NODE_FAIL", wait_s=0)
    s.kill_before_record = True
    with pytest.raises(Killed):
        monitor_pass([p], FAST, lambda: NOW, s.backend())
    assert s.on_nodes == [2] and jobs_of(p) == ["100"]  # job 201 in Slurm, not recorded
    s.kill_before_record = False
    backend = s.backend()
    backend.adopt = record_adopted  # the real record (submit.job.adopt), not the fake's
    (o,) = monitor_pass([p], FAST, lambda: NOW + 5, backend)
    assert o.new_job_id == "201" and s.on_nodes == [2]  # adopted, not submitted again
    last = read_jsonl(p.jobs)[-1]
    assert (last["job_id"], last["nodes"], last.get("short_of")) == ("201", 2, 4), last

    s.states["201"], s.up = "RUNNING", 4  # the lost nodes are back: grow to all 4
    (o,) = monitor_pass([p], FAST, lambda: NOW + 60, backend)
    assert (o.action.kind, o.action.failure_class) == (K.CANCEL_AND_RESUBMIT, C.NODES_BACK)
