"""Full weights out of FSDP2 shards, one tensor at a time: an asynchronous run's copy of
the policy (the thread placement's shadow) and the weights a split run's trainers send
their generator (docs/async.md).

Each gather is a collective of the shard's own process group (its device mesh: every
rank of a thread-placement run, the trainers alone in a split run): every rank of that
group calls these functions at the same point with the same tensors, in the same order,
from the main thread (never the generator thread, whose collectives would meet the
update's on the same group).

Memory, designed for: the destination is already allocated (the shadow's own tensor), and
a tensor whose rows divide evenly over the ranks is all-gathered straight into it; one
whose rows do not is gathered into one padded buffer of that tensor, then copied. So the
peak beyond the destination is at most one tensor (the largest: the embedding,
4 x vocab x hidden bytes in fp32), never a second full copy of the model; on a GPU the
gather runs on the device, no host copy (under FSDP2 CPU offload the shard is moved to
the destination's device first).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as tdist

# torch 2.13 renamed all_gather_into_tensor (the older name warns there); a cluster's torch
# may predate the new one
_all_gather = getattr(tdist, "all_gather_single", None) or tdist.all_gather_into_tensor


def is_shard(t: torch.Tensor) -> bool:
    """Whether ``t`` is a DTensor (an FSDP2 shard), whose full value takes a collective."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def gather_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``src``'s full value into ``dst`` (same shape), bit for bit: a plain tensor copied;
    an FSDP2 shard all-gathered in its mesh's group (a collective: every rank of the group
    calls it with its own shard)."""
    with torch.no_grad():
        if not is_shard(src):
            dst.copy_(src)
            return
        from torch.distributed.tensor import Shard

        mesh = src.device_mesh
        if mesh.ndim != 1 or tuple(src.placements) != (Shard(0),):  # not FSDP2's 1-D layout
            dst.copy_(src.full_tensor())
            return
        _gather_rows(dst, src.to_local(), mesh.get_group(), mesh.size())


def _gather_rows(dst: torch.Tensor, local: torch.Tensor, group: object, ranks: int) -> None:
    """FSDP2 shards dim 0 as ``torch.chunk`` does: rank r holds rows [r*c, (r+1)*c) of
    c = ceil(rows / ranks) (the last ranks fewer, or none). Padding each shard to c rows
    and gathering them in rank order gives the full tensor in the first ``rows`` rows."""
    rows = dst.shape[0]
    per = -(-rows // ranks)
    local = local.to(dst.device)  # CPU offload: the shard is on the host
    direct = rows == per * ranks and dst.is_contiguous() and dst.dtype == local.dtype
    if direct:
        _all_gather(dst, local.contiguous(), group=group)
        return
    if local.shape[0] < per:
        padded = local.new_zeros((per, *local.shape[1:]))
        padded[: local.shape[0]] = local
        local = padded
    buf = local.new_empty((per * ranks, *local.shape[1:]))
    _all_gather(buf, local.contiguous(), group=group)
    dst.copy_(buf[:rows])


def unique_state(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``model``'s state-dict entries, each tensor once (tied weights, the embedding and
    the head, share one entry: the first name), in the state dict's order, which is the
    same on every rank and in a plain copy of the model."""
    seen: set[int] = set()
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) not in seen:
            seen.add(id(t))
            yield name, t


def copy_full_weights(src: torch.nn.Module, dst: torch.nn.Module) -> None:
    """``src``'s full weights (FSDP2 shards gathered, a tensor at a time) into ``dst``, a
    plain module of the same state-dict keys (collective under FSDP2)."""
    into = dst.state_dict(keep_vars=True)
    for name, t in unique_state(src):
        if into[name] is t:  # a frozen tensor the copy shares (making.plain_copy)
            continue
        gather_into(into[name].detach(), t.detach())
