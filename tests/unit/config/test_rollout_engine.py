"""The rollout engine decision (grpo_hpc.config.rollout_engine): one pure rule that
grpo-submit applies to config.json on the login node and the trainer to its loaded model."""

from __future__ import annotations

import pytest

from grpo_hpc.config.rollout_engine import (
    HF_SLOWDOWN,
    SUPPORTED_TYPES,
    choose,
    choose_for_config,
    native_problem,
    undecided,
)

QWEN2 = {"model_type": "qwen2", "hidden_act": "silu", "use_sliding_window": False}
QWEN3 = {"model_type": "qwen3", "hidden_act": "silu"}
GPT2 = {"model_type": "gpt2", "activation_function": "gelu_new"}
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_act": "silu", "num_experts": 128}
"""Qwen3-30B-A3B's architecture (tests/fixtures/families/qwen3_moe)."""
ACTS, DYNAMIC = "native engine knows silu, gelu_pytorch_tanh", "dynamic rotary scaling"
KNOWN = (
    "the native engine decodes model_types llama, qwen2, mistral, qwen3, olmo2, smollm3, "
    "ministral, phi3, gemma3_text"
)


@pytest.mark.parametrize(
    ("setting", "cfg", "cuda", "engine", "line"),
    [
        ("auto", QWEN2, True, "native", "rollout: native (qwen2)"),
        ("auto", QWEN3, True, "native", "rollout: native (qwen3)"),
        (
            "auto", GPT2, True, "hf",
            "rollout: HF generate, model_type gpt2 has no native implementation: "
            f"rollouts about {HF_SLOWDOWN} slower",
        ),
        (
            "auto", QWEN3_MOE, True, "hf",
            "rollout: HF generate, model_type qwen3_moe has no native implementation: "
            f"rollouts about {HF_SLOWDOWN} slower",
        ),
        (
            "auto", QWEN2, False, "hf",
            "rollout: HF generate (rollout.engine=auto on a CPU: the native engine pays on a "
            "GPU only)",
        ),
        (
            "auto", QWEN3_MOE, False, "hf",
            "rollout: HF generate (rollout.engine=auto on a CPU; model_type qwen3_moe has no "
            "native implementation either)",
        ),
        ("native", QWEN2, True, "native", "rollout: native (qwen2)"),
        ("native", QWEN2, False, "native", "rollout: native (qwen2), on a CPU"),
        ("hf", QWEN2, True, "hf", "rollout: HF generate (rollout.engine=hf)"),
        ("hf", QWEN3_MOE, True, "hf", "rollout: HF generate (rollout.engine=hf)"),
        ("hf", QWEN2, False, "hf", "rollout: HF generate (rollout.engine=hf)"),
        ("hf", GPT2, False, "hf", "rollout: HF generate (rollout.engine=hf)"),
    ],
)  # fmt: skip
def test_decision_table(setting: str, cfg: dict, cuda: bool, engine: str, line: str) -> None:
    choice = choose_for_config(setting, cfg, cuda)
    assert (choice.engine, choice.line, choice.refusal) == (engine, line, None)


@pytest.mark.parametrize("cuda", [True, False])
@pytest.mark.parametrize(
    ("cfg", "what"),
    [
        (QWEN3_MOE, "model_type 'qwen3_moe' (a mixture of experts)"),
        (GPT2, "model_type 'gpt2'"),
    ],
)
def test_explicit_native_that_cannot_run_is_refused_in_one_line(
    cfg: dict, what: str, cuda: bool
) -> None:
    """The refusal says what cannot be decoded, the path to take instead and its cost,
    and what the native engine does decode."""
    choice = choose_for_config("native", cfg, cuda)
    assert choice.refusal == (
        f"rollout.engine=native cannot decode {what}: use rollout.engine=hf or auto (HF "
        f"generate: rollouts about {HF_SLOWDOWN} slower on a GPU); {KNOWN}"
    )
    assert "\n" not in choice.refusal


@pytest.mark.parametrize(
    ("cfg", "problem"),
    [
        ({"model_type": "llama"}, None),
        ({"model_type": "mistral", "sliding_window": None}, None),
        ({"model_type": "mistral"}, None),  # transformers' default window (4096): decoded
        ({"model_type": "mistral", "sliding_window": 4096}, None),
        ({"model_type": "qwen2", "use_sliding_window": True}, None),
        ({"model_type": "ministral", "sliding_window": 4096}, None),
        ({"model_type": "qwen3", "head_dim": 128}, None),
        ({"model_type": "olmo2"}, None),
        ({"model_type": "smollm3", "no_rope_layers": [1, 1, 1, 0]}, None),
        ({"model_type": "phi3", "rope_scaling": {"type": "longrope"}}, None),
        ({"model_type": "gemma3_text", "hidden_activation": "gelu_pytorch_tanh"}, None),
        # Gemma's MLP reads hidden_activation; a leftover hidden_act does not count
        ({"model_type": "gemma3_text", "hidden_act": "silu", "hidden_activation": "gelu"},
         f"activation 'gelu' ({ACTS})"),
        ({"model_type": "gemma3_text", "final_logit_softcapping": 30.0}, "logit soft-capping"),
        ({"model_type": "gemma3_text", "attn_logit_softcapping": 50.0}, "logit soft-capping"),
        ({"model_type": "gemma3_text", "final_logit_softcapping": None}, None),
        ({"model_type": "gemma3_text", "use_bidirectional_attention": True},
         "bidirectional attention"),
        ({"model_type": "gemma3_text", "rope_parameters": {
            "full_attention": {"rope_type": "dynamic"}, "sliding_attention": {}}}, DYNAMIC),
        ({"model_type": "gemma3", "text_config": {}}, "model_type 'gemma3'"),
        ({"model_type": "llama", "hidden_act": "gelu"}, f"activation 'gelu' ({ACTS})"),
        ({"model_type": "llama", "rope_scaling": {"rope_type": "dynamic"}}, DYNAMIC),
        ({"model_type": "llama", "rope_scaling": {"type": "dynamic"}}, DYNAMIC),
        ({"model_type": "llama", "rope_scaling": {"rope_type": "llama3"}}, None),
        ({"model_type": "llama", "attention_bias": True},
         "attention biases (qwen2's q/k/v biases only)"),
        ({"model_type": "qwen2", "attention_bias": True}, None),
        ({"model_type": "llama", "mlp_bias": True}, "MLP biases"),
        (QWEN3_MOE, "model_type 'qwen3_moe' (a mixture of experts)"),
        ({"model_type": "mixtral", "num_local_experts": 8},
         "model_type 'mixtral' (a mixture of experts)"),
        ({}, "model_type None"),
    ],
)  # fmt: skip
def test_native_problem_from_config_json(cfg: dict, problem: str | None) -> None:
    assert native_problem(cfg) == problem


def test_the_fixture_families_configs() -> None:
    """The reduced-size configs the equality tests decode (tests/fixtures/families): every
    family native but the mixture of experts, whose auto line names HF generate and its
    cost."""
    import json

    from tests.fixtures.families.make import FAMILIES, HERE

    for name in FAMILIES:
        cfg = json.loads((HERE / name / "config.json").read_text())
        assert cfg["model_type"] in SUPPORTED_TYPES or name == "qwen3_moe"
        line = choose_for_config("auto", cfg, True).line
        assert line == (
            f"rollout: HF generate, model_type qwen3_moe has no native implementation: "
            f"rollouts about {HF_SLOWDOWN} slower"
            if name == "qwen3_moe"
            else f"rollout: native ({cfg['model_type']})"
        )


def test_a_transformers_config_object_is_read_as_the_trainer_sees_it() -> None:
    from transformers import Gemma3TextConfig, MistralConfig, Qwen2Config, Qwen3MoeConfig

    assert native_problem(Qwen2Config()) is None
    assert native_problem(MistralConfig()) is None  # default window 4096: decoded
    assert native_problem(Gemma3TextConfig()) is None
    assert native_problem(Gemma3TextConfig(final_logit_softcapping=30.0)) == "logit soft-capping"
    moe = "model_type 'qwen3_moe' (a mixture of experts)"
    assert native_problem(Qwen3MoeConfig()) == moe


def test_one_source_of_truth_for_the_native_engine() -> None:
    from grpo_hpc.train.rollout.native import weights

    assert weights.SUPPORTED_TYPES is SUPPORTED_TYPES
    assert weights.native_problem is native_problem


def test_undecided_says_why() -> None:
    line = undecided("'Org/m' is not in this machine's Hugging Face cache").line
    assert line == (
        "rollout: decided at step 0 (config.json not readable here: 'Org/m' is not in this "
        "machine's Hugging Face cache)"
    )


def test_choose_is_the_rule_for_a_known_problem() -> None:
    """The trainer passes shape_of's reason (a LoRA variant, say) in place of config.json's."""
    choice = choose("auto", "llama", "a LoRA variant on q_proj", True)
    assert choice.engine == "hf" and "does not decode a LoRA variant on q_proj" in choice.line


PHI4_MINI = "bench/shapes/phi-4-mini/config.json"
"""Phi-4-mini's config.json: longrope, original_max_position_embeddings=4096."""


def _phi4_mini() -> dict:
    import json
    from pathlib import Path

    return json.loads((Path(__file__).resolve().parents[3] / PHI4_MINI).read_text())


@pytest.mark.parametrize(
    ("tokens", "engine", "refused"),
    [(4096, "native", False), (4097, "native", True)],
)
def test_a_sequence_at_phi4_minis_position_limit_is_decoded_one_past_it_refused(
    tokens: int, engine: str, refused: bool
) -> None:
    """The longest sequence (longest prompt + max_new_tokens) decides near the limit: both
    grpo-submit and the trainer pass it, measured, to this one decision."""
    cfg = _phi4_mini()
    choice = choose_for_config("native", cfg, True, tokens)
    assert choice.engine == engine
    assert bool(choice.refusal) is refused
    auto = choose_for_config("auto", cfg, True, tokens)
    assert auto.engine == ("hf" if refused else "native")
    if refused:
        assert f"sequences of {tokens} tokens" in choice.refusal
        assert "original_max_position_embeddings=4096" in choice.refusal


def test_lora_on_lm_head_is_not_native_lora_on_the_projections_is() -> None:
    """The LoRA-target rule is part of the decision: the native engine folds LoRA on the
    decoder's projections only, so LoRA on ``lm_head`` decodes with HF generate (auto) or
    is refused (explicit native), on the login node as in the trainer."""
    llama = {"model_type": "llama", "hidden_act": "silu"}
    targets = ("q_proj", "v_proj", "lm_head")
    native = choose_for_config("native", llama, True, 0, targets)
    assert native.refusal is not None and "LoRA on lm_head" in native.refusal
    assert "\n" not in native.refusal
    auto = choose_for_config("auto", llama, True, 0, targets)
    assert auto.engine == "hf" and "LoRA on lm_head" in auto.line
    for ok in (("q_proj", "k_proj", "v_proj", "o_proj"), ("all-linear",), ("self_attn.q_proj",)):
        assert choose_for_config("native", llama, True, 0, ok).refusal is None
