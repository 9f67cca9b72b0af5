"""``optim.state=int8``: torchao's AdamW8bit where asked, a one-line error where torchao is
missing or FSDP2 would shard a weight unevenly, and state digests of its int8 moments.

torchao is in the test extra (setup.cfg, as peft is): the tests that use it import it and
fail where it is missing (a broken test install), never skip; the refusals run without it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from grpo_hpc.config.schema import Config
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.train.algo.optimization import adamw, uneven_shards
from grpo_hpc.train.distributed.dist import DistInfo
from grpo_hpc.train.state import state_digest


def _torchao() -> None:
    """torchao's AdamW8bit, which the test extra installs: an ImportError here is a failure."""
    import torchao.optim  # noqa: F401


def _named(seed: int = 0) -> tuple[torch.nn.Module, list[tuple[str, torch.nn.Parameter]]]:
    """One weight that AdamW8bit quantizes (>= 4096 values, whole blocks of 256): its step
    compiles once per parameter shape (torch.compile, dynamic=False), ~4 s of CPU each, so
    the layers of other shapes that used to sit here (biases, a small second weight) only
    compiled fp32 Adam steps again."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(256, 64, bias=False)
    return model, list(model.named_parameters())


def _cfg(state: str, strategy: str = "ddp") -> Config:
    cfg = Config()
    cfg.optim.state, cfg.dist.strategy = state, strategy
    return cfg


def test_int8_builds_torchaos_adamw8bit_and_fp32_torchs() -> None:
    _torchao()
    _, named = _named()
    assert type(adamw(named, _cfg("int8"), DistInfo())).__name__ == "AdamW8bit"
    assert type(adamw(named, _cfg("fp32"), DistInfo())) is torch.optim.AdamW


def test_missing_torchao_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchao.optim", None)  # import fails as if absent
    _, named = _named()
    with pytest.raises(ConfigError, match=r"optim.state=int8 needs torchao .*grpo-hpc\[lowmem\]"):
        adamw(named, _cfg("int8"), DistInfo())


def test_uneven_shards_named_and_refused_under_fsdp2_only() -> None:
    shapes = {"embed": (103, 64), "q": (64, 64), "bias": (7,), "scalar": ()}
    assert uneven_shards(shapes, 2) == ["embed", "bias"]
    assert uneven_shards(shapes, 1) == []
    _, named = _named()
    odd = [("embed", torch.nn.Parameter(torch.zeros(103, 4)))]
    with pytest.raises(ConfigError, match="embed has 103 rows"):
        adamw(odd, _cfg("int8", "fsdp"), DistInfo(world_size=2))
    _torchao()
    assert adamw(odd, _cfg("int8", "ddp"), DistInfo(world_size=2))  # DDP shards nothing


def test_digest_of_int8_moments_survives_a_round_trip_and_sees_one_code(tmp_path: Path) -> None:
    _torchao()
    model, named = _named()
    opt = adamw(named, _cfg("int8"), DistInfo())
    model(torch.randn(4, 256)).square().mean().backward()
    opt.step()
    moment = opt.state[named[0][1]]["exp_avg"]
    assert type(moment).__name__ == "OptimState8bit"
    before = state_digest.sha(opt.state_dict())
    torch.save(opt.state_dict(), tmp_path / "o.pt")
    assert state_digest.sha(torch.load(tmp_path / "o.pt", weights_only=False)) == before
    moment.codes.view(-1)[0] ^= 1  # one code of one moment
    assert state_digest.sha(opt.state_dict()) != before


def test_a_rollback_to_the_start_restarts_int8_moments_as_a_fresh_optimizer() -> None:
    """A rollback to the start zeroes the optimizer's state in place (on_collapse's
    _restart_optimizer); torchao's int8 moments implement no zero_ (it raised
    NotImplementedError: a run with optim.state=int8 crashed at its first collapse). After
    the restart, a step must be the first step of a fresh optimizer, bit for bit."""
    from grpo_hpc.train.supervision.on_collapse import _restart_optimizer

    _torchao()
    model, named = _named()
    opt = adamw(named, _cfg("int8"), DistInfo())
    model(torch.randn(4, 256)).square().mean().backward()
    opt.step()
    _restart_optimizer(opt)
    state = opt.state[named[0][1]]
    assert float(state["step"]) == 0
    assert state["exp_avg"].dequantize().abs().max() == 0
    assert state["exp_avg_sq"].dequantize().abs().max() == 0
    fresh_model, fresh_named = _named()
    fresh_model.load_state_dict(model.state_dict())
    fresh = adamw(fresh_named, _cfg("int8"), DistInfo())
    x = torch.randn(4, 256)
    for m, o in ((model, opt), (fresh_model, fresh)):
        o.zero_grad()
        m(x).square().mean().backward()
        o.step()
    assert torch.equal(model.weight, fresh_model.weight)
