"""The pure decisions of grpo-export and grpo-eval: sizes, shards, names, step choice,
LoRA keys, pass@k."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from grpo_hpc.evaluate.local import ks_for, pass_at_k, summarize
from grpo_hpc.export import plan as ep


def test_parse_size() -> None:
    assert ep.parse_size("5GB") == 5 * 10**9
    assert ep.parse_size("500MB") == 500 * 10**6
    assert ep.parse_size("2GiB") == 2 * 2**30
    assert ep.parse_size("60kB") == 60_000
    assert ep.parse_size("1000") == 1000
    for bad in ("lots", "0", "5 parsecs", ""):
        with pytest.raises(ValueError):
            ep.parse_size(bad)


def test_dtype_defaults_to_the_runs_compute_dtype() -> None:
    assert ep.export_dtype(None, "bf16") == "bfloat16"
    assert ep.export_dtype(None, "fp32") == "float32"
    assert ep.export_dtype("fp16", "bf16") == "float16"


def test_shards_like_save_pretrained() -> None:
    specs = [ep.TensorSpec(f"t{i}", n, "float32") for i, n in enumerate([10, 10, 30, 5, 1])]
    shards = ep.plan_shards(specs, 80)  # bytes: 40 40 120 20 4
    assert [[t.name for t in s] for s in shards] == [["t0", "t1"], ["t2"], ["t3", "t4"]]
    assert ep.plan_shards(specs, 10**9) == [specs]
    assert ep.plan_shards([], 10) == []
    names = ep.shard_file_names(3)
    assert names == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert ep.shard_file_names(1) == ["model.safetensors"]
    index = ep.index_json(shards, names)
    assert index["metadata"]["total_size"] == 224
    assert index["weight_map"]["t2"] == names[1] and index["weight_map"]["t4"] == names[2]


def test_choose_step() -> None:
    assert ep.choose_step(None, [2, 4, 6], [2, 4]) == 4
    assert ep.choose_step(2, [2, 4, 6], [2, 4]) == 2
    with pytest.raises(ValueError, match="incomplete"):
        ep.choose_step(6, [2, 4, 6], [2, 4])
    with pytest.raises(ValueError, match="no checkpoint step-8 \\(complete: 2, 4\\)"):
        ep.choose_step(8, [2, 4, 6], [2, 4])
    with pytest.raises(ValueError, match="no complete checkpoint"):
        ep.choose_step(None, [6], [])


def test_lora_keys() -> None:
    keys = [
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight",
        "base_model.model.lm_head.weight",
    ]
    pairs, others = ep.lora_pairs(keys)
    assert [p.module for p in pairs] == ["model.layers.0.self_attn.q_proj"]
    assert others == ["base_model.model.lm_head.weight"]
    assert (
        ep.adapter_key(keys[0]) == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    )
    with pytest.raises(ValueError, match="lora_A only"):
        ep.lora_pairs(keys[:1])
    assert ep.lora_scaling(16, 32) == 2.0
    assert ep.hf_name("base_model.model.lm_head.weight") == "lm_head.weight"
    assert ep.tied_keys(True) == {"lm_head.weight"} and ep.tied_keys(False) == set()


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - math.comb(7, 2) / math.comb(10, 2))
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)
    assert ks_for(1) == [1] and ks_for(8) == [1, 2, 4, 8] and ks_for(6) == [1, 2, 4, 6]


def test_summarize() -> None:
    greedy = summarize([[1.0], [0.0], [1.0]], [[1.0], [0.0], [0.0]])
    assert (greedy["accuracy"], greedy["correct"], greedy["problems"]) == (2 / 3, 2, 3)
    assert greedy["accuracy_strict"] == 1 / 3 and "pass@k" not in greedy
    sampled = summarize([[1.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]])
    assert sampled["accuracy"] == 0.25
    assert sampled["pass@k"] == {"1": 0.25, "2": 0.5}


def test_adapter_base_names_what_from_pretrained_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adapter_config.json's base_model_name_or_path: a hub model's id; otherwise the
    absolute directory the run's weights came from, never the built-in alias."""
    run_tiny = tmp_path / "logs" / "run" / "tiny_model"
    assert ep.adapter_base(run_tiny, None) == str(run_tiny)
    converted = tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    assert ep.adapter_base(converted, None) == str(converted)
    monkeypatch.chdir(tmp_path)  # a config's relative path, made absolute
    assert ep.adapter_base(Path("models/mine"), None) == str(tmp_path / "models" / "mine")
    snapshot = tmp_path / "hub" / "models--org--m" / "snapshots" / "abc123"
    assert ep.adapter_base(snapshot, "org/m") == "org/m"
