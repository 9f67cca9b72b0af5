"""A model whose logits are more than its head's product (Gemma 2's final soft-capping)
trains on the model's own logits: the update's log-probs and gradients equal HF's plain
forward in fp32, and the soft-capping is shown to matter. Before, the fused head refused
such a model at step 0, after ``grpo-submit`` had told the user the run would go (HF
generate decodes it). The same model through the real trainer:
tests/e2e/test_model_logits_train.py."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from grpo_hpc.train.algo.logp_head import head_problem
from grpo_hpc.train.algo.update import completion_logp, split
from grpo_hpc.train.setup.models import char_tokenizer, load_model_and_tokenizer
from tests.fixtures.families.make import BASE
from tests.unit.train.algo.test_update_families import (
    ATOL,
    ROWS,
    _batch,
    _grads,
    _plain_logp,
    _spread,
)

CAP = 2.0
"""Gemma 2 ships 30.0; a cap near the logits' own scale makes it change every log-prob."""
GEMMA2 = {
    **BASE,
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "head_dim": 16,
    "hidden_activation": "gelu_pytorch_tanh",
    "query_pre_attn_scalar": 16,
    "sliding_window": 16,
    "final_logit_softcapping": CAP,
    "attn_logit_softcapping": 50.0,
    "tie_word_embeddings": True,
}


def _model(tmp: Path, cap: float | None) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    tmp.mkdir()
    (tmp / "config.json").write_text(json.dumps({**GEMMA2, "final_logit_softcapping": cap}))
    cfg = AutoConfig.from_pretrained(tmp)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    _spread(model, seed=1)
    model.save_pretrained(tmp)
    char_tokenizer(cfg.vocab_size).save_pretrained(tmp)
    loaded, _ = load_model_and_tokenizer(tmp, "sdpa", torch.device("cpu"))
    return loaded.train()


def test_soft_capped_logits_train_as_hf_computes_them(tmp_path: Path) -> None:
    capped = _model(tmp_path / "capped", CAP)
    assert "final_logit_softcapping" in (head_problem(capped) or "")
    batch = _batch(capped.config.vocab_size)
    mask = batch.completion_mask.bool()
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(5)) * mask
    (mb,) = split(batch, list(range(len(ROWS))), torch.zeros(len(ROWS)), 8, 0, packing=False)

    ref = _plain_logp(capped, batch)
    ref_grads = _grads(capped, ref, weights)
    got, entropy = completion_logp(capped, mb, with_entropy=True)
    got_grads = _grads(capped, got, weights)

    torch.testing.assert_close(got * mask, ref, rtol=0, atol=ATOL)
    assert ref_grads.keys() == got_grads.keys()
    for name, g in ref_grads.items():
        scale = float(g.abs().max())
        torch.testing.assert_close(got_grads[name], g, rtol=ATOL, atol=ATOL * scale, msg=name)
    assert entropy is not None and bool((entropy[mask] > 0).all())
    # The cap matters: the same weights without it score every token differently.
    uncapped = _model(tmp_path / "uncapped", None)
    assert head_problem(uncapped) is None
    plain = _plain_logp(uncapped, batch)
    assert float((plain - ref)[mask].abs().min()) > 1e-3
