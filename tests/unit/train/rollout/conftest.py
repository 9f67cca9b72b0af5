"""Real tiny models the engine tests share (saved and loaded through ``from_pretrained``):
module-scoped, so each test module that uses one makes it once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_hpc.train.setup.models import LlamaShape, char_tokenizer, save_random_llama


def _load(path: Path):  # noqa: ANN202
    from grpo_hpc.train.setup.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(path, "sdpa", torch.device("cpu"))
    return model.eval(), tok


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    out = tmp_path_factory.mktemp("llama") / "m"
    save_random_llama(out, LlamaShape(64, 2, 4, 2, 128), seed=3)
    return _load(out)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """A random Qwen2 (q/k/v biases, untied head, 3 query heads per KV head)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = tmp_path_factory.mktemp("qwen2") / "m"
    tok = char_tokenizer()
    torch.manual_seed(5)
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        initializer_range=0.3,  # larger weights: greedy text that is not one repeated char
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # HF initialises biases to zero: make them matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return _load(out)
