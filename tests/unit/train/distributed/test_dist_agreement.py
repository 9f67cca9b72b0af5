"""The small agreements between ranks the trainer logs each step (``dist.max_over_ranks``,
``dist.spread``), on two real gloo processes."""

from __future__ import annotations

from pathlib import Path

import torch.distributed as torch_dist
import torch.multiprocessing as mp

from grpo_hpc.train.distributed import dist


def _rank(rank: int, store: str, out: str) -> None:
    torch_dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    info = dist.DistInfo(rank=rank, world_size=2)
    # rank 0 compiled 3 graphs and captured 0; rank 1 compiled 2 and captured 5
    got = dist.max_over_ranks([3.0, 0.0] if rank == 0 else [2.0, 5.0], info)
    skew = dist.spread(1.0 if rank == 0 else 1.75, info)
    Path(out, f"rank{rank}").write_text(f"{got[0]} {got[1]} {skew}")
    torch_dist.barrier()  # as test_gather.py: no rank tears the group down under its peer
    torch_dist.destroy_process_group()


def test_max_over_ranks_and_spread_on_two_processes(tmp_path: Path) -> None:
    mp.spawn(_rank, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}").read_text() == "3.0 5.0 0.75"


def test_one_process_needs_no_group() -> None:
    assert dist.max_over_ranks([1.0, 2.0], dist.DistInfo()) == [1.0, 2.0]
    assert dist.spread(4.0, dist.DistInfo()) == 0.0
