"""Asynchronous GRPO (``algo.max_staleness=1``) across the two nodes of partition ``multi``
(slurm/up.sh --nodes 2), one process on each, through grpo-submit, torchrun's c10d
rendezvous and gloo:

* ``rollout.placement=split``: ranks are numbered node by node, so the trainer is rank 0
  on grpo-n1 and the generator rank 1 on grpo-n2 (the model it loads from the run
  directory, its messages and the weights' broadcast cross the nodes).

It ends, bit for bit (weights and optimizer), as the same seed's run of two processes
on one node does (on this machine, forked as torchrun starts them, tests/e2e/helpers.py;
the jobs themselves run under torchrun). One module fixture
makes the runs: the jobs side by side, the references beside them. (The thread placement
across the two nodes is two DDP ranks, each with its decode thread: until 2026-12-05 a
test here too, dropped to keep the CPU-bound suite within its time; what it joined is
proven apart: DDP across the nodes, tests/integration/test_multinode_slurm.py; the thread
placement on two DDP ranks, bit for bit, tests/e2e/test_async.py.)

Partial rollouts split across the nodes too (``rollout.partial_pool=2``: the trainer on
grpo-n1 keeps the pool, the generator on grpo-n2 advances it), on a model whose answers end
at many lengths: the final state of one process of the thread placement, to the bit.

Two generators across the nodes too (2 nodes of 2 processes: the trainers on grpo-n1, the
generators on grpo-n2), against the same seed's 2 + 2 split run on one node.

Then a split run loses grpo-n2 (profile ``nodes_wait_s: 5``): the node left holds one
process, which the trainer refuses (a trainer and a generator are needed), so the monitor
does not shrink the run onto it; the job Slurm requeued waits for both nodes, the monitor
says why in a ``nodes`` event, and once grpo-n2 is back the run ends as the reference.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from bench.faults import ending_model
from grpo_hpc.core.fsutil import read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState, read_progress

from ..e2e.helpers import assert_same, make_run, train
from .slurm_helpers import (
    cli,
    cluster_lock,
    cluster_state,
    describe,
    events,
    final_event,
    job_ids,
    kill_node,
    monitored,
    progress,
    restart_nodes,
    sacct_attempts,
    start_cli,
    step_nodes,
    submit,
    wait_for,
    wait_sacct,
    write_profile,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

PROFILE = "slurm-local-2node"  # 2 nodes x 1 process, fp32, gloo
STEPS = 4
RUN_ARGS = [
    "training.num_threads=1", f"training.max_steps={STEPS}",
    f"training.save_every_steps={STEPS}", "algo.max_staleness=1",
]  # fmt: skip


@dataclass
class Run:
    paths: RunPaths
    returncode: int
    output: str


@pytest.fixture(scope="module", autouse=True)
def _slurmctld_stays() -> Iterator[None]:
    """slurmctld must not be taken away under these jobs (slurm_helpers.cluster_lock)."""
    with cluster_lock(exclusive=False):
        yield


def _two_node_job(logs: Path, placement: str, name: str = "", extra: tuple = ()) -> Run:
    """``grpo-submit --wait`` on the two nodes, one process each (``extra``: more config)."""
    name = name or placement
    where = ["--config", "tiny", "--name", name, "--logs", str(logs), "--wait"]
    args = [*RUN_ARGS, f"rollout.placement={placement}", *extra]
    p = cli("cli.submit", "--profile", PROFILE, *where, *args, timeout=300)
    return Run(RunPaths(logs / name), p.returncode, p.stdout + p.stderr)


def _one_node_run(
    root: Path, placement: str, name: str = "", extra: tuple = (), nproc: int = 2
) -> Run:
    """The same seed's run of ``nproc`` processes on one node (not Slurm; forked from the
    test worker's trainer server as torchrun would start them, tests/e2e/trainer_fork.py):
    the local profile's config, which differs from the two-node profile's in nothing that
    trains (fp32, DDP, sdpa, one thread)."""
    paths = make_run(root, name or placement, *RUN_ARGS, *extra, nproc=nproc)
    text = paths.config.read_text()
    paths.config.write_text(text.replace("placement: thread", f"placement: {placement}"))
    p = train(paths, nproc)
    return Run(paths, p.returncode, p.stdout[-3000:] + p.stderr[-3000:])


def _partial(model: Path) -> tuple[str, ...]:
    """Partial rollouts on a model whose answers end at many lengths (continued answers)."""
    return (
        "algo.max_staleness=2", "rollout.partial_pool=2", f"model.name_or_path={model}",
        f"rollout.max_new_tokens={ending_model.MAX_NEW_TOKENS}",
    )  # fmt: skip


@pytest.fixture(scope="module")
def runs(two_nodes, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """``split`` on two nodes, ``split-ref`` on one; ``split-partial`` (partial rollouts)
    on two nodes and ``split-partial-ref``, its one process of the thread placement."""
    logs, local = tmp_path_factory.mktemp("nodes"), tmp_path_factory.mktemp("one-node")
    partial = _partial(ending_model.save(tmp_path_factory.mktemp("ending") / "model"))
    with ThreadPoolExecutor(max_workers=4) as pool:
        jobs = {"split": pool.submit(_two_node_job, logs, "split")}
        refs = {"split-ref": pool.submit(_one_node_run, local, "split")}
        jobs["split-partial"] = pool.submit(_two_node_job, logs, "split", "split-partial", partial)
        refs["split-partial-ref"] = pool.submit(
            _one_node_run, local, "thread", "split-partial-ref", partial, 1
        )
        return {name: f.result() for name, f in (jobs | refs).items()}


def _final_state(paths: RunPaths) -> tuple[dict, dict]:
    ckpt = paths.checkpoint(STEPS)
    return tuple(torch.load(ckpt / f, weights_only=False) for f in ("model.pt", "optim.pt"))


def _pulses(paths: RunPaths) -> dict[str, list[str]]:
    """rank -> the fields after pid and counter of its pulse file's first line (host,
    role); a generator's second line is its progress (rollout.progress_timeout_s), which
    its last pulse may or may not carry."""
    return {
        f.name: f.read_text().splitlines()[0].split()[2:]
        for f in paths.alive_dir.glob("*/rank[0-9]")
    }


def _finished_on_both_nodes(run: Run) -> None:
    assert run.returncode == 0, f"{run.output}\n{describe(run.paths)}"
    (job,) = job_ids(run.paths)
    assert wait_sacct(job, "COMPLETED", "FAILED", "CANCELLED", timeout=60) == "COMPLETED"
    assert step_nodes(job) == "grpo-n[1-2]", describe(run.paths)


def test_split_across_two_nodes_trains_what_one_node_trains(runs: dict[str, Run]) -> None:
    """The trainer on grpo-n1, the generator on grpo-n2 (their pulses say so), and the
    final weights and optimizer of the one-node split run, to the bit."""
    run, ref = runs["split"], runs["split-ref"]
    _finished_on_both_nodes(run)
    assert "trainer rank 0 on node 0, generator rank 1 on node 1" in run.output
    assert _pulses(run.paths) == {
        "rank0": ["grpo-n1", "trainer"],
        "rank1": ["grpo-n2", "generator"],
    }
    assert ref.returncode == 0, ref.output
    assert_same(_final_state(run.paths), _final_state(ref.paths))


def test_partial_rollouts_split_across_two_nodes_train_what_one_process_trains(
    runs: dict[str, Run],
) -> None:
    """Partial rollouts with the trainer on grpo-n1 keeping the pool and the generator on
    grpo-n2 advancing it (the pool crosses the nodes twice a step): the final weights and
    optimizer of one process of the thread placement, to the bit; answers were continued."""
    run, ref = runs["split-partial"], runs["split-partial-ref"]
    _finished_on_both_nodes(run)
    assert "each trainer's prompts of 2 steps in flight" in run.output
    assert ref.returncode == 0, ref.output
    assert_same(_final_state(run.paths), _final_state(ref.paths))
    rows = [r for r in read_jsonl(run.paths.metrics) if "reward/mean" in r]
    assert sum(r["partial/continued_rows"] for r in rows) > 0


MONITOR_ARGS = [
    "--interval", "1", "--step0-timeout", "120", "--heartbeat-timeout", "120",
    "--max-retries", "3", "--backoff", "1",
]  # fmt: skip


@pytest.fixture
def monitor(tmp_path: Path) -> Iterator[tuple[Path, Path, list]]:
    with monitored(tmp_path) as made:
        yield made


def test_a_split_run_that_lost_a_node_waits_for_it_rather_than_shrink(
    runs: dict[str, Run], monitor: tuple, tmp_path: Path
) -> None:
    logs, log, procs = monitor
    profile = write_profile(tmp_path / "wait.yaml", base=PROFILE, nodes_wait_s=5)
    slow = ["faults.enabled=true", "faults.step_sleep=1", "training.save_every_steps=2"]
    args = [*RUN_ARGS[1:], "rollout.placement=split", *slow]
    submit(logs, "lost", *args, profile=str(profile))
    paths = RunPaths(logs / "lost")
    explain = lambda: f"{describe(paths)}\n{log.read_text()}\n{cluster_state()}"  # noqa: E731
    procs.append(start_cli("cli.monitor", "--logs", str(logs), "lost", *MONITOR_ARGS, log=log))

    def trained() -> bool:
        rec = read_progress(paths.progress)
        return rec is not None and rec.step >= 2 and (paths.latest_checkpoint() or 0) >= 2

    wait_for("a checkpoint", trained, 180, interval=0.3, explain=explain)
    (job,) = job_ids(paths)
    kill_node("grpo-n2", reported=True)  # the generator's node
    held = lambda: [e for e in events(paths, "nodes") if "refuses" in e["reason"]]  # noqa: E731
    (why,) = wait_for("the monitor to hold the run", held, 120, explain=explain)
    assert (why["move"], why["nodes"], why["up"]) == ("wait", 2, 1), why
    assert "rollout.placement=split runs 1 generator and at least 1 trainer" in why["reason"]
    assert job_ids(paths) == [job], explain()  # nothing submitted on the node left
    restart_nodes()
    done = wait_for("DONE", lambda: final_event(paths), 300, explain=explain)
    assert done["action"] == "DONE", explain()
    assert job_ids(paths) == [job] and "short_of" not in read_jsonl(paths.jobs)[0]
    assert [s for s, _ in sacct_attempts(job)][:1] == ["NODE_FAIL"], sacct_attempts(job)
    rec = progress(paths)
    assert rec.state is TrainState.FINISHED and rec.step == STEPS
    assert_same(_final_state(paths), _final_state(runs["split-ref"].paths))


def test_two_generators_across_two_nodes_train_what_one_node_trains(
    two_nodes, tmp_path: Path
) -> None:
    """2 nodes of 2 processes, ``rollout.generators=2``: ranks 0-1 train on grpo-n1, the
    generators (ranks 2-3, trainer r served by generator r % 2) run on grpo-n2; the final
    weights and optimizer of the same seed's 2 + 2 split run on one node, to the bit."""
    profile = write_profile(tmp_path / "two-by-two.yaml", PROFILE, nproc_per_node=2)
    logs = tmp_path / "logs"
    args = [*RUN_ARGS, "rollout.placement=split", "rollout.generators=2"]

    def job() -> Run:
        where = ["--config", "tiny", "--name", "g2", "--logs", str(logs), "--wait"]
        p = cli("cli.submit", "--profile", str(profile), *where, *args, timeout=300)
        return Run(RunPaths(logs / "g2"), p.returncode, p.stdout + p.stderr)

    def reference() -> Run:
        paths = make_run(tmp_path / "one-node", "g2-ref", *RUN_ARGS, nproc=4)
        text = paths.config.read_text().replace("placement: thread", "placement: split")
        paths.config.write_text(text.replace("generators: 1", "generators: 2"))
        p = train(paths, 4)
        return Run(paths, p.returncode, p.stdout[-3000:] + p.stderr[-3000:])

    with ThreadPoolExecutor(max_workers=2) as pool:
        run_f, ref_f = pool.submit(job), pool.submit(reference)
        run, ref = run_f.result(), ref_f.result()
    _finished_on_both_nodes(run)
    assert "trainer ranks 0-1 on node 0, generator ranks 2-3 on node 1" in run.output, run.output
    assert _pulses(run.paths) == {
        "rank0": ["grpo-n1", "trainer", "0"],
        "rank1": ["grpo-n1", "trainer", "1"],
        "rank2": ["grpo-n2", "generator", "0"],
        "rank3": ["grpo-n2", "generator", "1"],
    }
    assert ref.returncode == 0, ref.output
    assert_same(_final_state(run.paths), _final_state(ref.paths))
