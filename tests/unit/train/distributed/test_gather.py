"""Full weights out of FSDP2 shards (``gather.copy_full_weights``) on two real gloo
processes: rows that divide evenly over the ranks (gathered straight into the copy), rows
that do not (5 rows: 3 and 2), and fewer rows than ranks (1 row: rank 1 holds none), each
equal, bit for bit, to the unsharded tensor and to DTensor's own ``full_tensor``."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp

from grpo_hpc.train.distributed.gather import copy_full_weights, is_shard


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 4),  # 4 rows: even
        torch.nn.Linear(4, 5),  # 5 rows: 3 and 2
        torch.nn.Linear(5, 1),  # 1 row: rank 1 has none
    )


def _rank(rank: int, store: str, out: str) -> None:
    from torch.distributed.fsdp import fully_shard

    torch_dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    whole = _model()
    sharded = copy.deepcopy(whole)
    for layer in sharded:
        fully_shard(layer)
    fully_shard(sharded)
    assert all(is_shard(p) for p in sharded.parameters())
    target = _model()
    with torch.no_grad():
        for p in target.parameters():
            p.zero_()
    copy_full_weights(sharded, target)
    got = target.state_dict()
    same = all(torch.equal(got[k], v) for k, v in whole.state_dict().items())
    own = all(torch.equal(got[k], v.full_tensor()) for k, v in sharded.state_dict().items())
    Path(out, f"rank{rank}").write_text(f"{same} {own} {len(got)}")
    # both ranks done with the group before either tears it down: a rank that destroyed it
    # while its peer still used it aborted now and then ("terminate called without an
    # active exception", SIGABRT) on the loaded 2-core machine
    torch_dist.barrier()
    torch_dist.destroy_process_group()


def test_shards_gathered_whole_even_and_uneven(tmp_path: Path) -> None:
    mp.spawn(_rank, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}").read_text() == "True True 6"


def test_plain_weights_are_copied() -> None:
    src, dst = _model(), torch.nn.Sequential(*(copy.deepcopy(m) for m in _model()))
    with torch.no_grad():
        for p in src.parameters():
            p.add_(1.0)
    copy_full_weights(src, dst)
    assert all(torch.equal(a, b) for a, b in zip(src.parameters(), dst.parameters(), strict=True))
