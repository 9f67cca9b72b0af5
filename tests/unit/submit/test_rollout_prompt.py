"""The longest prompt grpo-submit gives the rollout-engine decision: measured as the
trainer measures it, or, where the model's tokenizer cannot be loaded on the login node,
assumed and said so on the ``rollout:`` line."""

from __future__ import annotations

import shutil
from pathlib import Path

from grpo_hpc.config.load import build_config
from grpo_hpc.config.profiles import load_profile
from grpo_hpc.submit import preflight

PHI4_MINI = Path(__file__).resolve().parents[3] / "bench/shapes/phi-4-mini"


def test_a_tokenizer_not_loadable_here_is_said_with_what_was_assumed(tmp_path: Path) -> None:
    """A Phi-4-mini directory with a config.json and no tokenizer: the decision still uses
    the memory estimate's 320-token prompt, and the line says it was assumed, and why."""
    model = tmp_path / "phi4"
    model.mkdir()
    shutil.copy(PHI4_MINI / "config.json", model / "config.json")
    cfg = build_config("gsm8k", [f"model.name_or_path={model}", "rollout.max_new_tokens=64"])
    choice = preflight.rollout_choice(cfg, load_profile("h100x2"))
    assert choice.engine == "native" and choice.refusal is None
    assert (
        "; longest prompt assumed 320 tokens (the tokenizer or data not readable here: "
        in choice.line
    )


def test_the_longest_prompt_is_measured_only_where_the_decision_reads_it() -> None:
    """A model without a position limit for the native engine (a Llama): no tokenizer is
    loaded, nothing assumed; Phi-4-mini's is measured with the job's tokenizer."""
    llama = build_config("gsm8k", ["model.name_or_path=tiny"])
    assert preflight.prompt_tokens(llama, {"model_type": "llama"}) == (0, "")
    phi = build_config("gsm8k", [f"model.name_or_path=random:{PHI4_MINI}"])
    config_json = preflight.model_config_json(phi.model)[0]
    assert preflight.prompt_tokens(phi, config_json) == (1164, "")  # GSM8K, char tokenizer
