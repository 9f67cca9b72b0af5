"""A rank of ``test_ddp_compile.py`` (forked as torchrun starts one, or under torchrun):
decoder layers compiled (dynamic shapes) inside DDP, as the trainer builds them
(``models.compile_layers`` then ``dist.wrap``), with gradient checkpointing recomputing
through the compiled layers, give each rank the single-process eager gradient of the
whole batch after DDP's all-reduce.

Argument: the tiny model's directory. Each rank trains its own rows in micro-batches of 2
(rank 1's last holds 1 row: two widths, one compilation serves them); rank 0 then compares
the all-reduced gradients with an eager copy's gradient over all rows, computed alone."""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as torch_dist
from torch._dynamo.utils import counters

from grpo_hpc.config.schema import AlgoConfig, DistConfig
from grpo_hpc.train.algo.update import accumulate, split
from grpo_hpc.train.distributed import dist
from grpo_hpc.train.distributed.dist import DistInfo
from grpo_hpc.train.setup.models import (
    compile_layers,
    enable_checkpointing,
    load_model_and_tokenizer,
)
from tests.unit.train.algo.test_packing import NEW, ROWS, _batch


def main(model_dir: Path) -> None:
    torch_dist.init_process_group("gloo")
    rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
    info = DistInfo(rank, world, rank, torch.device("cpu"))
    eager, _ = load_model_and_tokenizer(model_dir, "sdpa", info.device)
    assert enable_checkpointing(eager, 1) == eager.config.num_hidden_layers
    eager.train()
    compiled = copy.deepcopy(eager)
    assert compile_layers(compiled) == eager.config.num_hidden_layers
    model = dist.wrap(compiled, DistConfig(strategy="ddp"), info)
    batch = _batch(eager.config.vocab_size)
    adv = torch.linspace(-1.5, 2.0, len(ROWS))
    algo = AlgoConfig(micro_batch_size=2, packing=False)
    mine = list(range(rank, len(ROWS), world))
    compile_in_turn(compiled, rank, model_dir.parent / "rank0-compiled")
    counters.clear()
    accumulate(model, split(batch, mine, adv[mine], 2), algo, info, NEW, None,
               contextlib.nullcontext)  # fmt: skip
    assert counters["stats"]["unique_graphs"] > 0, "no compiled code ran"
    # A graph break inside the layer leaves most of it eager while a graph still counts
    # (transformers 5.23-5.25 broke it at the kernels package's wrapper: 2-4 calls captured
    # of the layer's ~116): the layer must compile whole.
    breaks = dict(counters["graph_break"])
    assert not breaks, f"compiled layers break their graph: {list(breaks)[:1]}"
    assert all(layer._compiled_call_impl is not None for layer in compiled.model.layers)
    assert all(layer.gradient_checkpointing for layer in compiled.model.layers)
    assert torch._dynamo.config.optimize_ddp is False
    if rank == 0:
        rows = list(range(len(ROWS)))
        accumulate(eager, split(batch, rows, adv, 2), algo, DistInfo(), NEW, None,
                   contextlib.nullcontext)  # fmt: skip
        got = dict(model.module.named_parameters())
        for name, p in eager.named_parameters():
            torch.testing.assert_close(got[name].grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
        print(f"compiled layers under DDP: {len(got)} gradients match eager on {world} ranks")
    torch_dist.barrier()
    torch_dist.destroy_process_group()
    # Leave without tearing the DDP model down: its reducer keeps the gloo group alive, and
    # freeing it joins gloo's worker thread with the GIL held while that thread may still
    # be freeing the last all-reduce's Python-owned tensors (which needs the GIL). Under
    # load it deadlocked after the check had passed (py-spy: ~ProcessGroupGloo in
    # std::thread::join; the gloo thread in ~AsyncBarrierWork waiting for the GIL).
    sys.stdout.flush()
    os._exit(0)


def compile_in_turn(compiled: torch.nn.Module, rank: int, marker: Path) -> None:
    """Rank 1 compiles from Inductor's cache after rank 0 filled it, instead of beside it.

    With a cold cache (a fresh machine, as CI's) both ranks compiled the same layer
    forward, backward and recompute at once, ~30 s of CPU each here. Rank 0's first
    micro-batch runs without a collective after DDP's buffer broadcast (no_sync: its
    gradients are all-reduced after the last one), so rank 1 waits for it just after that
    broadcast, in a hook on the embedding (outside the compiled layers), until rank 0's
    first backward has accumulated into the embedding, the last weight a backward reaches.
    Rank 1 then traces the same layers itself (Dynamo, the graph-break check below) and
    takes rank 0's forward and backward from the cache (it still compiles the graphs of
    its one-row micro-batch, a width rank 0 never has). Bounded: should rank 0 never get
    there (a failed rank 0 ends the group at once, trainer_fork.supervise), rank 1
    compiles on its own after 240 s, within the test's 300."""
    embed = compiled.get_input_embeddings()
    if rank == 0:
        embed.weight.register_post_accumulate_grad_hook(lambda _w: marker.touch())
        return

    def wait_for_rank0(_module: torch.nn.Module, _args: tuple) -> None:
        deadline = time.monotonic() + 240
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    embed.register_forward_pre_hook(wait_for_rank0)  # later forwards find the marker at once


def cli(argv: list[str]) -> None:
    """The entry point for a forked rank (tests/e2e/trainer_fork.py): the model's directory."""
    main(Path(argv[0]))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
