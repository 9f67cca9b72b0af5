"""Selective gradient checkpointing (``model.checkpoint_every``): which layers recompute,
and that recomputing changes no gradient (a real model from ``from_pretrained``, CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_hpc.train.setup.models import LlamaShape, enable_checkpointing, save_random_llama


def _model(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).train()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckpt") / "m"
    save_random_llama(out, LlamaShape(32, 4, 4, 2, 64), seed=7)
    return out


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    ids = torch.arange(1, 25).view(2, 12)
    model(input_ids=ids, labels=ids).loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def _counted(forward, calls: list[int], i: int):  # noqa: ANN001, ANN202
    def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls[i] += 1
        return forward(*args, **kwargs)

    return run


CASES = [(1, [1, 1, 1, 1]), (2, [1, 0, 1, 0]), (3, [1, 0, 0, 1])]


@pytest.mark.parametrize(("every", "flags"), CASES)
def test_one_layer_in_n_recomputes_and_gradients_are_unchanged(
    model_dir: Path, every: int, flags: list[int]
) -> None:
    plain = _grads(_model(model_dir))
    model = _model(model_dir)
    assert enable_checkpointing(model, every) == sum(flags)
    assert [int(layer.gradient_checkpointing) for layer in model.model.layers] == flags
    calls = [0] * len(flags)  # the MLP runs inside the layer: twice where it is recomputed
    for i, layer in enumerate(model.model.layers):  # (module hooks do not fire in a recompute)
        layer.mlp.forward = _counted(layer.mlp.forward, calls, i)
    for a, b in zip(plain, _grads(model), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert calls == [1 + f for f in flags]
