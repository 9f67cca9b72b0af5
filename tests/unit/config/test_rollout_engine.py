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
SILU, DYNAMIC = "native engine knows silu", "dynamic rotary scaling"


@pytest.mark.parametrize(
    ("setting", "cfg", "cuda", "engine", "line"),
    [
        ("auto", QWEN2, True, "native", "rollout: native (qwen2)"),
        (
            "auto", QWEN3, True, "hf",
            "rollout: HF generate, model_type qwen3 has no native implementation: "
            f"rollouts about {HF_SLOWDOWN} slower",
        ),
        (
            "auto", QWEN2, False, "hf",
            "rollout: HF generate (rollout.engine=auto on a CPU: the native engine pays on a "
            "GPU only)",
        ),
        (
            "auto", QWEN3, False, "hf",
            "rollout: HF generate (rollout.engine=auto on a CPU; model_type qwen3 has no "
            "native implementation either)",
        ),
        ("native", QWEN2, True, "native", "rollout: native (qwen2)"),
        ("native", QWEN2, False, "native", "rollout: native (qwen2), on a CPU"),
        ("hf", QWEN2, True, "hf", "rollout: HF generate (rollout.engine=hf)"),
        ("hf", QWEN3, True, "hf", "rollout: HF generate (rollout.engine=hf)"),
        ("hf", QWEN2, False, "hf", "rollout: HF generate (rollout.engine=hf)"),
        ("hf", QWEN3, False, "hf", "rollout: HF generate (rollout.engine=hf)"),
    ],
)  # fmt: skip
def test_decision_table(setting: str, cfg: dict, cuda: bool, engine: str, line: str) -> None:
    choice = choose_for_config(setting, cfg, cuda)
    assert (choice.engine, choice.line, choice.refusal) == (engine, line, None)


@pytest.mark.parametrize("cuda", [True, False])
def test_explicit_native_that_cannot_run_is_refused_in_one_line(cuda: bool) -> None:
    choice = choose_for_config("native", QWEN3, cuda)
    assert choice.refusal == (
        "rollout.engine=native cannot decode model_type 'qwen3' (native engine knows llama, "
        "qwen2, mistral): use rollout.engine=hf or auto (HF generate), or a "
        "llama/qwen2/mistral model without a sliding window"
    )
    assert "\n" not in choice.refusal


@pytest.mark.parametrize(
    ("cfg", "problem"),
    [
        ({"model_type": "llama"}, None),
        ({"model_type": "mistral", "sliding_window": None}, None),
        # transformers' MistralConfig default (4096) when config.json leaves it out
        ({"model_type": "mistral"}, "sliding-window attention"),
        ({"model_type": "mistral", "sliding_window": 4096}, "sliding-window attention"),
        ({"model_type": "qwen2", "use_sliding_window": True}, "sliding-window attention"),
        ({"model_type": "qwen2", "sliding_window": 4096}, None),  # off without use_...
        ({"model_type": "llama", "hidden_act": "gelu"}, f"activation 'gelu' ({SILU})"),
        ({"model_type": "llama", "rope_scaling": {"rope_type": "dynamic"}}, DYNAMIC),
        ({"model_type": "llama", "rope_scaling": {"type": "dynamic"}}, DYNAMIC),
        ({"model_type": "llama", "rope_scaling": {"rope_type": "llama3"}}, None),
        ({}, "model_type None (native engine knows llama, qwen2, mistral)"),
    ],
)  # fmt: skip
def test_native_problem_from_config_json(cfg: dict, problem: str | None) -> None:
    assert native_problem(cfg) == problem


def test_mistral_sliding_window_refused_for_native_and_told_for_auto() -> None:
    cfg = {"model_type": "mistral", "sliding_window": 4096}
    assert choose_for_config("native", cfg, True).refusal.startswith(
        "rollout.engine=native cannot decode sliding-window attention: "
    )
    assert choose_for_config("auto", cfg, True).line == (
        "rollout: HF generate, the native engine does not decode sliding-window attention: "
        f"rollouts about {HF_SLOWDOWN} slower"
    )


def test_a_transformers_config_object_is_read_as_the_trainer_sees_it() -> None:
    from transformers import MistralConfig, Qwen2Config

    assert native_problem(Qwen2Config()) is None
    assert native_problem(MistralConfig()) == "sliding-window attention"  # default 4096
    assert native_problem(MistralConfig(sliding_window=None)) is None


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
