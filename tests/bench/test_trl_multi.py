"""bench/trl/multi.py's pure parts: the accelerate config a TRL user would launch with, the
merge of the ranks' results, and the check that the Trainer really sharded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.trl import multi as trl_multi


def test_fsdp2_config_shards_the_decoder_layers_with_checkpointing() -> None:
    cfg = trl_multi.accelerate_config("fsdp2", 2, "bf16", "LlamaDecoderLayer", cpu=False)
    assert cfg["distributed_type"] == "FSDP" and cfg["num_processes"] == 2
    assert cfg["mixed_precision"] == "bf16" and cfg["use_cpu"] is False
    fsdp = cfg["fsdp_config"]
    assert fsdp["fsdp_version"] == 2
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    assert fsdp["fsdp_activation_checkpointing"] is True  # TRL's gradient checkpointing, here
    assert fsdp["fsdp_offload_params"] is False


def test_fsdp1_and_ddp_configs() -> None:
    fsdp1 = trl_multi.accelerate_config("fsdp1", 4, "fp16", "Qwen2DecoderLayer", cpu=False)
    assert fsdp1["fsdp_config"]["fsdp_version"] == 1
    assert fsdp1["fsdp_config"]["fsdp_reshard_after_forward"] == "FULL_SHARD"
    ddp = trl_multi.accelerate_config("ddp", 2, "fp32", "X", cpu=True)
    assert ddp["distributed_type"] == "MULTI_GPU" and ddp["mixed_precision"] == "no"
    assert "fsdp_config" not in ddp
    with pytest.raises(ValueError, match="unknown TRL mode"):
        trl_multi.accelerate_config("deepspeed", 2, "bf16", "X", cpu=False)


def test_layer_class_from_the_models_architecture(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    assert trl_multi.layer_class(tmp_path) == "Qwen2DecoderLayer"


def test_merge_takes_rank_zeros_times_and_the_largest_peak() -> None:
    ranks = [
        {"s_per_step_median": 2.0, "peak_gib": 30.0},
        {"s_per_step_median": 2.1, "peak_gib": 31.5},
    ]
    merged = trl_multi.merge(ranks)
    assert merged["s_per_step_median"] == 2.0 and merged["peak_gib"] == 31.5
    assert merged["peak_gib_per_rank"] == [30.0, 31.5]
    with pytest.raises(ValueError):
        trl_multi.merge([])


def test_an_unsharded_model_is_named() -> None:
    plain = {"class": "Qwen2ForCausalLM", "dtensor_params": 0}
    assert "unsharded" in trl_multi.not_distributed("fsdp2", plain)
    assert trl_multi.not_distributed("fsdp2", plain | {"dtensor_params": 338}) is None
    assert trl_multi.not_distributed("fsdp1", {"class": "FullyShardedDataParallel"}) is None
    assert trl_multi.not_distributed("ddp", {"class": "DistributedDataParallel"}) is None
    assert trl_multi.not_distributed("ddp", plain) is not None
