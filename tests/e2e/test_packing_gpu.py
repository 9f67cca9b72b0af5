"""Packed micro-batches on a GPU: PyTorch's varlen flash attention is there and agrees with
row-by-row SDPA (forward and backward), a packed bf16 update agrees with the padded one, and
the trainer runs packed in bf16 with the native engine."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from pathlib import Path

import pytest
import torch

from grpo_hpc.config.schema import AlgoConfig
from grpo_hpc.core.progress import TrainState, read_progress
from grpo_hpc.train.algo import packing
from grpo_hpc.train.algo.update import accumulate, split
from grpo_hpc.train.distributed.dist import DistInfo
from grpo_hpc.train.setup.models import load_model_and_tokenizer
from tests.unit.train.algo.test_packing import NEW, ROWS, _batch, _model_dir

from .helpers import make_run, train

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_varlen_attention_matches_row_by_row_sdpa() -> None:
    varlen = packing.varlen_kernel()
    assert varlen is not None, f"torch {torch.__version__} has no usable varlen_attn"
    torch.manual_seed(0)
    lengths = [300, 7, 129, 1, 64]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    t, heads, kv, d = sum(lengths), 12, 2, 128  # Qwen2.5-1.5B's heads
    q, k, v = (torch.randn(t, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for h in (heads, kv, kv))  # fmt: skip
    scale = d**-0.5
    out = varlen(q, k, v, cu.cuda(), max(lengths), scale)
    ref = packing._per_row(q, k, v, cu.tolist(), scale)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    want = torch.autograd.grad(ref, (q, k, v), g)
    for a, b in zip(got, want, strict=True):
        assert (a.float() - b.float()).norm() <= 2e-2 * b.float().norm()


def test_packed_bf16_update_matches_padded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fallbacks = []
    per_row = packing._per_row
    monkeypatch.setattr(packing, "_per_row", lambda *a: fallbacks.append(1) or per_row(*a))
    path = _model_dir(tmp_path, "qwen2")
    padded, _ = load_model_and_tokenizer(path, "sdpa", torch.device("cuda"))
    packed = copy.deepcopy(padded)
    packing.use_packed_attention(packed)
    batch = _batch(padded.config.vocab_size)
    batch = dataclasses.replace(batch, input_ids=batch.input_ids.cuda(),
                                attention_mask=batch.attention_mask.cuda(),
                                completion_mask=batch.completion_mask.cuda())  # fmt: skip
    adv = torch.linspace(-1.5, 2.0, len(ROWS), device="cuda")
    info = DistInfo(device=torch.device("cuda"))

    def autocast() -> contextlib.AbstractContextManager:
        return torch.autocast("cuda", dtype=torch.bfloat16)

    grads = []
    for model, algo in ((padded, AlgoConfig(micro_batch_size=3, packing=False)),
                        (packed, AlgoConfig(micro_batch_tokens=60, packing=True))):  # fmt: skip
        model.train()
        mbs = split(batch, list(range(len(ROWS))), adv, algo.micro_batch_size,
                    algo.micro_batch_tokens, algo.packing)  # fmt: skip
        accumulate(model, mbs, algo, info, NEW, None, autocast)
        grads.append({n: p.grad.float() for n, p in model.named_parameters()})
    # Under autocast the rotary embedding leaves q/k in fp32: the packed forward must still
    # take the varlen kernel (in bf16, as autocast's SDPA does), not fall back row by row.
    assert not fallbacks, f"{len(fallbacks)} packed attention calls fell back to per-row SDPA"
    for name, g in grads[0].items():
        diff = (grads[1][name] - g).norm()
        assert diff <= 3e-2 * g.norm() + 1e-6, name  # bf16 rounding, not a different math


def test_trainer_runs_packed_in_bf16(tmp_path: Path) -> None:
    paths = make_run(tmp_path, "packed", "algo.packing=true", "algo.micro_batch_tokens=700")
    text = paths.config.read_text().replace("precision: fp32", "precision: bf16")
    paths.config.write_text(text)
    result = train(paths)
    assert result.returncode == 0, result.stderr[-3000:]
    rec = read_progress(paths.progress)
    assert rec.state == TrainState.FINISHED and rec.step == rec.max_steps
    # compiled layers (auto on a GPU), built in Inductor's deterministic mode by default
    assert "dist.compile=true (auto)" in result.stdout
    assert "dist.deterministic_kernels=true" in result.stdout
