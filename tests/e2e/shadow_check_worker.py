"""torchrun worker for ``test_async_fsdp.py``: the real trainer (``grpo_hpc.train``'s own
main) on a run directory, with each rank checking, right after every copy of the weights
into its generating copy (the shadow), that the copy is a plain module holding the
policy's full weights bit for bit, gathered here by DTensor's own ``full_tensor`` (not the
pipeline's gather). Each rank writes ``<run>/shadow-rank<R>.txt``: one line per copy,
``<equal tensors> <tensors> <changed since the last copy: 0/1>``."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from grpo_hpc.train.__main__ import main
from grpo_hpc.train.rollout.pipeline import RolloutPipeline

_copy = RolloutPipeline._copy_weights


def _checked(self: RolloutPipeline) -> None:
    _copy(self)
    from torch.distributed.tensor import DTensor

    shadow = self.shadow.state_dict()
    assert not any(isinstance(t, DTensor) for t in shadow.values()), "the shadow is sharded"
    equal = 0
    for name, t in self.policy.state_dict().items():
        full = t.full_tensor() if isinstance(t, DTensor) else t  # collective: every rank
        equal += int(torch.equal(shadow[name], full))
    before = getattr(self, "_seen", None)
    now = {k: v.clone() for k, v in shadow.items()}
    changed = before is not None and any(not torch.equal(before[k], now[k]) for k in now)
    self._seen = now
    rank = self.collector.info.rank
    out = Path(sys.argv[1]) / f"shadow-rank{rank}.txt"
    with out.open("a") as f:
        f.write(f"{equal} {len(shadow)} {int(changed)}\n")


if __name__ == "__main__":
    RolloutPipeline._copy_weights = _checked
    sys.exit(main(sys.argv[1:]))
