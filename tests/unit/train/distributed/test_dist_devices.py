"""Which device a model computes on, and which process-group backends a run joins: under
FSDP2 CPU offload the parameters live in host memory while every forward runs on the GPU
(inputs built on the parameters' device made the 7B ladder row fail with a device mismatch
in ``gather``), and the offloaded gradients need a CPU backend for clipping."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from grpo_hpc.config.schema import DistConfig
from grpo_hpc.train.distributed import dist


def _linear_with_mesh(device_type: str | None) -> torch.nn.Module:
    lin = torch.nn.Linear(2, 2)
    if device_type is not None:
        lin.weight.device_mesh = SimpleNamespace(device_type=device_type)
    return lin


def test_plain_and_sharded_on_the_same_device_compute_where_the_parameters_are() -> None:
    assert dist.compute_device(_linear_with_mesh(None)) == torch.device("cpu")
    assert dist.compute_device(_linear_with_mesh("cpu")) == torch.device("cpu")


def test_offloaded_shards_compute_on_the_mesh_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert dist.compute_device(_linear_with_mesh("cuda")) == torch.device("cuda", 1)


@pytest.mark.parametrize(
    ("backend", "cuda", "offload", "want"),
    [
        ("auto", False, False, "gloo"),
        ("auto", False, True, "gloo"),
        ("auto", True, False, "nccl"),
        ("auto", True, True, "cpu:gloo,cuda:nccl"),
        ("gloo", True, True, "gloo"),
    ],
)
def test_backend(backend: str, cuda: bool, offload: bool, want: str) -> None:
    cfg = DistConfig(backend=backend, cpu_offload=offload)
    assert dist._backend(cfg, cuda) == want
