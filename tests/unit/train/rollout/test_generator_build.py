"""A split run's generator finds the policy's weights on its own node: the run directory
as this process sees it, a converted model in this node's cache (``models.materialize``,
as a DDP rank of another node does), never the path trainer 0 loaded from."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from grpo_hpc.config.load import build_config
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.train.generator import build
from grpo_hpc.train.rollout.split import Hello
from grpo_hpc.train.rollout.types import EngineOptions
from grpo_hpc.train.setup import models


def test_the_generator_loads_the_weights_where_its_node_sees_them(tmp_path: Path) -> None:
    """Trainer 0 made the tiny model in its run directory; the generator's node mounts
    that directory elsewhere (the trainer's path does not exist there). The generator
    builds its model from its own view of the run directory, the same weights."""
    cfg = build_config("tiny", ["algo.max_staleness=1", "rollout.placement=split"])
    cfg.dist.nproc_per_node = 2
    cfg.model.attn_implementation = "sdpa"  # what the trainer resolved ``auto`` to and sent
    trainer_dir = tmp_path / "trainer-node" / "run"
    made = models.materialize(cfg.model, trainer_dir, cfg.training.seed)
    policy, _ = models.load_model_and_tokenizer(made, "sdpa", torch.device("cpu"))
    options = EngineOptions.for_run(cfg, torch.float32, synced=False, max_prompt_tokens=64)
    hello = Hello.of(cfg, options, torch.float32, policy)
    generator_dir = tmp_path / "generator-node" / "run"
    shutil.copytree(trainer_dir, generator_dir)
    shutil.rmtree(tmp_path / "trainer-node")  # not on the generator's node
    _, model, _, _ = build(hello, torch.device("cpu"), generator_dir)
    assert RunPaths(generator_dir).tiny_model.is_dir()
    mine, theirs = model.state_dict(), policy.state_dict()
    assert list(mine) == list(theirs)
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
