"""Digests of a rank's training state, to show that a resumed attempt starts from exactly
what its checkpoint saved (GPU kernels are not bit-deterministic, so a faulted
GPU run cannot be judged by its final weights; its resume can).

With ``faults.state_digest`` the trainer writes, per rank, one JSON file at every save
(``save-step<S>-rank<R>.json``: the state about to be written) and one after every resume
(``resume-<launch>-step<S>-rank<R>.json``: the state as it was loaded, RNG restored). Each
holds a sha256 per part: ``model`` (this rank's parameters and buffers; its FSDP2 shards),
``optim`` (its optimizer state), ``rng`` (Python, NumPy, torch CPU and CUDA generators),
``data`` (step, sampler position, scheduler, breaker streaks). Equal digests mean equal
bytes, dtypes and shapes of every tensor. The trainer's cost: one device-to-host copy of
the rank's state per save, which is why it is a test switch and not the default.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_hpc.core.fsutil import atomic_write_text


def _feed(h: Any, obj: Any) -> None:  # noqa: ANN401 - any nest of state
    """Hash ``obj`` into ``h``: tensors by dtype, shape and bytes (a DTensor by its local
    shard), containers in a fixed order, everything else by its repr."""
    if isinstance(obj, torch.Tensor):
        t = obj.to_local() if hasattr(obj, "to_local") else obj
        if hasattr(t, "__tensor_flatten__"):  # a tensor subclass (torchao's int8 moments)
            names, meta = t.__tensor_flatten__()
            h.update(f"S{type(t).__name__}{meta!r}".encode())
            _feed(h, {name: getattr(t, name) for name in names})
            return
        t = t.detach().contiguous().cpu()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, np.ndarray):
        h.update(f"N{obj.dtype}{obj.shape}".encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, dict):
        h.update(b"{")
        for k in sorted(obj, key=str):
            h.update(repr(k).encode())
            _feed(h, obj[k])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for x in obj:
            _feed(h, x)
        h.update(b"]")
    else:
        h.update(repr(obj).encode())


def sha(obj: Any) -> str:  # noqa: ANN401
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def digest(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, rng: dict, data: dict
) -> dict[str, str]:
    """The four parts' sha256. The optimizer's state is taken in parameter order (its
    own ids differ between processes, its order does not)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    optim = [optimizer.state.get(p, {}) for p in params]
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return {
        "model": sha(model.state_dict()),
        "optim": sha([optim, groups]),
        "rng": sha(rng),
        "data": sha(data),
    }


def write(folder: Path, name: str, parts: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / f"{name}.json", json.dumps(parts, sort_keys=True) + "\n")


def mismatches(saved: dict[str, str], resumed: dict[str, str]) -> list[str]:
    """The parts whose digests differ (pure); empty when the resume was exact."""
    return sorted(k for k in saved.keys() | resumed.keys() if saved.get(k) != resumed.get(k))


def compare_folder(folder: Path) -> tuple[int, list[str]]:
    """Every ``resume-<launch>-step<S>-rank<R>`` digest in ``folder`` against the
    ``save-step<S>-rank<R>`` one: (resumes compared, ``file: parts`` that differ)."""
    n, bad = 0, []
    for f in sorted(folder.glob("resume-*.json")):
        _, step, rank = f.stem.rsplit("-", 2)
        saved = folder / f"save-{step}-{rank}.json"
        n += 1
        if not saved.exists():
            bad.append(f"{f.name}: no save digest")
            continue
        diff = mismatches(json.loads(saved.read_text()), json.loads(f.read_text()))
        if diff:
            bad.append(f"{f.name}: {','.join(diff)}")
    return n, bad
