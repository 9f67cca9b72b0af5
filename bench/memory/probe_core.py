"""A rank's probe records: GPU memory at phase boundaries, step timings, the byte counts of
parameter shards, gradients, optimizer state and FSDP2's unsharded gradients; written to
``$PROBE_OUT/probe_rank<R>.json``. The hooks that fill it are in ``hooks.py``."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

GIB = 2**30


def _env_int(name: str, default: int = 0) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class Probe:
    """Records of one rank; written to ``$PROBE_OUT/probe_rank<R>.json`` after every step."""

    def __init__(self, out: Path) -> None:
        import torch

        self.out = out
        self.rank = int(os.environ.get("RANK", "0"))
        self.cuda = torch.cuda.is_available()
        self.records: list[dict] = []
        self.steps: list[dict] = []
        self.step = 0  # 1-based while a step runs
        self.mb = -1
        self.trainer: Any = None
        self.t_update = 0.0
        self.overall_peak = 0
        self.history: dict | None = None
        self.profile: dict | None = None
        self.cur: dict = {}
        self.history_step = _env_int("PROBE_HISTORY_STEP")
        self.profile_step = _env_int("PROBE_PROFILE_STEP")
        self.switches = {
            k: os.environ[k]
            for k in ("PROBE_FSDP_SYNC_EACH", "PROBE_RESHARD_AFTER_FORWARD")
            if k in os.environ
        }

    # memory -------------------------------------------------------------
    def mem(self) -> dict:
        import torch

        if not self.cuda:
            return {}
        peak = torch.cuda.max_memory_allocated()
        self.overall_peak = max(self.overall_peak, peak)
        out = {
            "alloc_gib": round(torch.cuda.memory_allocated() / GIB, 3),
            "reserved_gib": round(torch.cuda.memory_reserved() / GIB, 3),
            "peak_since_last_gib": round(peak / GIB, 3),
        }
        torch.cuda.reset_peak_memory_stats()
        return out

    def record(self, phase: str, **extra: Any) -> None:
        rec = {"step": self.step, "phase": phase, **self.mem(), **extra}
        if self.mb >= 0:
            rec["mb"] = self.mb
        self.records.append(rec)

    def sizes(self) -> dict:
        """Bytes (GiB) of local parameter shards, gradients, optimizer state and FSDP2's
        unsharded gradients."""
        model = self.trainer.model if self.trainer else None
        if model is None:
            return {}
        out = {"params": 0, "grads": 0, "optim_state": 0, "fsdp_unsharded_grads": 0}
        for p in model.parameters():
            out["params"] += _local_bytes(p)
            if p.grad is not None:
                out["grads"] += _local_bytes(p.grad)
        opt = getattr(getattr(self.trainer, "opt", None), "optim", None)
        if opt is not None:
            for state in opt.state.values():
                for v in state.values():
                    if hasattr(v, "element_size") and v.dim() > 0:
                        out["optim_state"] += _local_bytes(v)
        fsdp = _fsdp_params(model)
        for fp in fsdp:
            acc = getattr(fp, "unsharded_accumulated_grad", None)
            if acc is not None:
                out["fsdp_unsharded_grads"] += _local_bytes(acc)
            unsharded = getattr(fp, "_unsharded_param", None)
            if unsharded is not None and unsharded.grad is not None:
                out["fsdp_unsharded_grads"] += _local_bytes(unsharded.grad)
        sized = {k + "_gib": round(v / GIB, 3) for k, v in out.items()}
        return {
            **sized,
            "fsdp_params": len(fsdp),
            "unsharded_grad_mib": round(out["fsdp_unsharded_grads"] / 2**20, 3),
        }

    def sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        doc = {
            "rank": self.rank,
            "switches": self.switches,
            "overall_peak_gib": round(self.overall_peak / GIB, 3),
            "steps": self.steps,
            "records": self.records,
            "history": self.history,
            "profile": self.profile,
        }
        tmp = self.out / f".probe_rank{self.rank}.tmp"
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.rename(self.out / f"probe_rank{self.rank}.json")


def _local_bytes(t: Any) -> int:
    t = getattr(t, "_local_tensor", t)
    return t.numel() * t.element_size()


def _fsdp_params(model: Any) -> list:
    out = []
    for m in model.modules():
        get = getattr(m, "_get_fsdp_state", None)
        if get is None:
            continue
        with contextlib.suppress(Exception):
            state = get()
            groups = getattr(state, "_fsdp_param_groups", None)
            if groups is None:
                group = getattr(state, "_fsdp_param_group", None)
                groups = [group] if group is not None else []
            for g in groups:
                out.extend(g.fsdp_params)
    return out
