"""torchrun worker for ``test_gpu.py::test_sharded_adamw_matches_unsharded``: the trainer's
AdamW choice over FSDP2-sharded parameters steps exactly like plain AdamW on the full ones."""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed as torch_dist
from torch.distributed.fsdp import fully_shard

from grpo_hpc.config.schema import Config
from grpo_hpc.train.algo.optimization import _fused
from grpo_hpc.train.distributed.dist import DistInfo


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch_dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    cfg = Config()
    cfg.dist.strategy = "fsdp"
    fused = _fused(DistInfo(rank, world, rank, device), cfg)
    torch.manual_seed(0)
    full = torch.nn.Sequential(torch.nn.Linear(96, 160), torch.nn.Linear(160, 8)).to(device)
    sharded = copy.deepcopy(full)
    for layer in sharded:
        fully_shard(layer)
    fully_shard(sharded)
    opt_full = torch.optim.AdamW(full.parameters(), lr=1e-2, foreach=False)
    opt_sharded = torch.optim.AdamW(sharded.parameters(), lr=1e-2, fused=fused)
    for _ in range(3):
        x = torch.randn(8, 96, device=device)
        for model, opt in ((full, opt_full), (sharded, opt_sharded)):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    for p, q in zip(full.parameters(), sharded.parameters(), strict=True):
        torch.testing.assert_close(p, q.full_tensor(), rtol=1e-5, atol=1e-6)
    if rank == 0:
        print(f"sharded AdamW (fused={fused}) matches after 3 steps on {world} rank(s)")
    torch_dist.destroy_process_group()


if __name__ == "__main__":
    main()
