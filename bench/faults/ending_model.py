"""A random tiny Llama whose answers end at many lengths (the ``tiny`` config's model shape,
its EOS row of the tied output layer scaled up): with the plain random model nearly every
row runs to the cap, so partial rollouts (``rollout.partial_pool``) would never continue an
answer. The fault campaign's ``--ending-model`` runs on it; the end-to-end tests' fixture
``ending_model`` (tests/e2e/conftest.py) is this model."""

from __future__ import annotations

from pathlib import Path

import torch

from grpo_hpc.train.setup.models import LlamaShape, load_model_and_tokenizer, save_random_llama

EOS_SCALE = 12.0
"""The EOS row's scale: a third to two thirds of the rows end before a 48-token cap
(measured on this model: lengths 5 .. 30 and 4 of 16 at the cap)."""
MAX_NEW_TOKENS = 48
"""The cap the scale was measured at (what runs on this model should use)."""


def save(out: Path, eos_scale: float = EOS_SCALE, seed: int = 0) -> Path:
    """The model saved at ``out`` (``from_pretrained`` reads it); returns ``out``."""
    save_random_llama(out, LlamaShape(64, 2, 4, 2, 128), seed=seed)
    model, tok = load_model_and_tokenizer(out, "sdpa", torch.device("cpu"))
    with torch.no_grad():
        model.get_output_embeddings().weight[tok.eos_token_id] *= eos_scale
    model.save_pretrained(out)
    return out
