"""A split run's roles and refusals (pure): which rank does what, what the trainer's
checkpoint files and random stream are named by, what a lost rank's reason calls it, and
what the release refuses."""

from __future__ import annotations

import pytest

from grpo_hpc.config.load import build_config
from grpo_hpc.config.roles import GENERATOR, TRAINER, Role, generator_of, role_of, trainers_of
from grpo_hpc.config.validate import split_evaluation_problem, split_problem
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.train.supervision.liveness import describe, lost_reason


def test_trainers_come_first_and_the_generator_last() -> None:
    cfg = build_config("tiny", ["rollout.placement=split", "algo.max_staleness=1"])
    assert role_of(cfg, 0, 2) == Role(TRAINER, 0, 1, 1, 1)
    assert role_of(cfg, 1, 2) == Role(GENERATOR, 0, 1, 1, 1)
    assert role_of(cfg, 1, 3) == Role(TRAINER, 1, 2, 2, 1)  # two DDP trainers, then the generator
    assert role_of(cfg, 2, 3) == Role(GENERATOR, 0, 1, 2, 1)
    assert role_of(cfg, 0, 2).records_progress and not role_of(cfg, 1, 2).records_progress
    # the thread placement: every rank trains, each its own index
    thread = build_config("tiny", ["algo.max_staleness=1"])
    assert role_of(thread, 1, 2) == Role(TRAINER, 1, 2, 2, 0)


def test_trainer_r_is_served_by_generator_r_mod_g() -> None:
    """The mapping (pure): the trainers dealt round the generators, each generator's
    trainers in rank order; every trainer served by exactly one generator, and every
    generator serving one at least where G <= T."""
    assert [generator_of(r, 2) for r in range(5)] == [0, 1, 0, 1, 0]
    assert [trainers_of(g, 5, 2) for g in range(2)] == [(0, 2, 4), (1, 3)]
    assert trainers_of(0, 3, 1) == (0, 1, 2)  # one generator serves every trainer
    for t in range(1, 6):
        for g in range(1, t + 1):
            served = [r for i in range(g) for r in trainers_of(i, t, g)]
            assert sorted(served) == list(range(t)) and all(trainers_of(i, t, g) for i in range(g))


def test_each_process_knows_its_peers_and_its_label() -> None:
    """2 trainers and 2 generators: trainer r talks to global rank 2 + r % 2 and generator
    g to trainer g; trainer 0 greets both generators, each generator's first trainer stops
    it; reasons name which generator where there are several."""
    cfg = build_config(
        "tiny", ["rollout.placement=split", "algo.max_staleness=1", "rollout.generators=2"]
    )
    four = [role_of(cfg, rank, 4) for rank in range(4)]
    assert four[1] == Role(TRAINER, 1, 2, 2, 2) and four[3] == Role(GENERATOR, 1, 2, 2, 2)
    assert [r.peers for r in four] == [(2,), (3,), (0,), (1,)]
    assert [r.label for r in four] == ["trainer 0", "trainer 1", "generator 0", "generator 1"]
    assert four[0].generator_ranks == (2, 3)
    assert [r.stops_generator for r in four] == [True, True, False, False]
    five = [role_of(cfg, rank, 5) for rank in range(5)]  # 3 trainers: generator 0 serves two
    assert [r.peers for r in five] == [(3,), (4,), (3,), (0, 2), (1,)]
    assert [r.stops_generator for r in five[:3]] == [True, True, False]
    one = build_config("tiny", ["rollout.placement=split", "algo.max_staleness=1"])
    assert role_of(one, 2, 3).label == "generator" and role_of(one, 0, 3).label == "trainer 0"


def test_a_lost_rank_is_named_by_the_role_its_pulse_wrote() -> None:
    assert describe(1, "4242 17 node2 generator\n") == "generator (rank 1 on node2)"
    assert describe(3, "4242 17 node2 generator 1\n") == "generator 1 (rank 3 on node2)"
    assert describe(1, "4242 17 node2\n") == "rank 1"  # a run without roles, as before
    assert describe(1, None) == "rank 1"
    names = {1: describe(1, "4242 17 node2 generator")}
    line = lost_reason([1], 60, 14, names=names)
    assert line.startswith(
        "generator (rank 1 on node2) stopped answering (no pulse for 60 s) at step 14"
    )


@pytest.mark.parametrize(
    ("overrides", "ranks", "said"),
    [
        ([], 2, "needs algo.max_staleness >= 1"),
        (["algo.max_staleness=1"], 1, "1 generator and at least 1 trainer process, not 1"),
        (["algo.max_staleness=1", "rollout.generators=2"], 3, "no trainer to serve: set rollout."),
        (["algo.max_staleness=1", "rollout.generators=2"], 2, "2 generators and at least 1"),
        (["algo.max_staleness=1", "rollout.generators=0"], 2, "must be at least 1"),
        (["algo.max_staleness=1", "rollout.dynamic_sampling=true"], 2, "dynamic_sampling"),
    ],
)
def test_what_the_split_refuses(overrides: list[str], ranks: int, said: str) -> None:
    cfg = build_config("tiny", overrides)
    cfg.rollout.placement = "split"
    if not any(o.startswith("dist.nproc_per_node") for o in overrides):
        cfg.dist.nproc_per_node = ranks  # one node of them
    problem = split_problem(cfg, ranks)
    assert problem is not None and said in problem, problem


def test_the_config_refuses_a_synchronous_split_and_accepts_an_asynchronous_one() -> None:
    with pytest.raises(ConfigError, match="rollout.placement=split generates ahead"):
        build_config("tiny", ["rollout.placement=split"])
    cfg = build_config("tiny", ["rollout.placement=split", "algo.max_staleness=1"])
    cfg.dist.nproc_per_node = 3
    assert split_problem(cfg, 2) is None and split_problem(cfg, 3) is None  # 1 or 2 trainers
    cfg.rollout.generators, cfg.dist.nproc_per_node = 2, 5
    assert split_problem(cfg, 4) is None and split_problem(cfg, 5) is None  # 2 or 3 trainers
    cfg.dist.strategy = "fsdp"  # FSDP2 trainers: the weights gathered before they travel
    assert split_problem(cfg, 4) is None
    with pytest.raises(ConfigError, match="is not one of thread, split"):
        build_config("tiny", ["rollout.placement=process"])


def test_the_split_runs_across_nodes() -> None:
    """Ranks are numbered node by node: on 2 nodes of 1 process the trainer is the first
    node's, the generator the second's; on 2 of 2, ranks 0-2 train and rank 3 generates
    (with two generators, ranks 2-3: the second node)."""
    cfg = build_config("tiny", ["algo.max_staleness=1"])
    cfg.rollout.placement = "split"
    for per_node, nodes in ((1, 2), (2, 2), (1, 3)):
        cfg.dist.nproc_per_node = per_node
        assert split_problem(cfg, per_node * nodes) is None, (per_node, nodes)
    assert role_of(cfg, 0, 2) == Role(TRAINER, 0, 1, 1, 1)
    assert role_of(cfg, 1, 2) == Role(GENERATOR, 0, 1, 1, 1)
    assert role_of(cfg, 2, 4) == Role(TRAINER, 2, 3, 3, 1)
    assert role_of(cfg, 3, 4) == Role(GENERATOR, 0, 1, 3, 1)
    # two generators on 2 nodes of 2: the second node's processes both generate
    cfg.rollout.generators, cfg.dist.nproc_per_node = 2, 2
    assert split_problem(cfg, 4) is None
    assert [role_of(cfg, r, 4).name for r in range(4)] == [TRAINER, TRAINER, GENERATOR, GENERATOR]


@pytest.mark.parametrize(
    ("strategy", "trainers", "eval_every", "engine", "refused"),
    [
        ("fsdp", 2, 2, "hf", True),  # HF generate's all-reduce would wait for the generator
        ("fsdp", 2, 2, "native", False),  # gathers once in the trainers' group, then alone
        ("fsdp", 2, 0, "hf", False),  # no evaluation
        ("fsdp", 1, 2, "hf", False),  # one trainer: nothing sharded, nothing to keep in step
        ("ddp", 2, 2, "hf", False),  # DDP generates alone
    ],
)
def test_fsdp2_trainers_of_a_split_run_evaluate_with_the_native_engine(
    strategy: str, trainers: int, eval_every: int, engine: str, refused: bool
) -> None:
    cfg = build_config("tiny", ["algo.max_staleness=1", f"dist.strategy={strategy}"])
    cfg.rollout.placement, cfg.training.eval_every = "split", eval_every
    problem = split_evaluation_problem(cfg, trainers, engine)
    assert (problem is not None) == refused, problem
    if refused:
        assert "set rollout.engine=native, training.eval_every=0, or dist.strategy=ddp" in problem
    cfg.rollout.placement = "thread"  # the thread placement's ranks all join the all-reduce
    assert split_evaluation_problem(cfg, trainers, engine) is None
