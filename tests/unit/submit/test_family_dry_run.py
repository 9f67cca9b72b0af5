"""Every supported model family (docs/models.md), one by one: ``grpo-submit --profile h100x2
--config gsm8k model.name_or_path=random:bench/shapes/<dir> --dry-run`` names the engine
that will decode (read from the shape's config.json on the login node), before anything
queues."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_hpc.cli.submit import main
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[3]
SHAPES = ROOT / "bench" / "shapes"

NATIVE = {
    "qwen2.5-1.5b": "qwen2",
    "qwen3-0.6b": "qwen3",
    "qwen3-1.7b": "qwen3",
    "qwen3-4b": "qwen3",
    "qwen3-8b": "qwen3",
    "llama-3.2-1b": "llama",
    "llama-3.2-3b": "llama",
    "llama-3.1-8b": "llama",
    "gemma-3-1b": "gemma3_text",
    "gemma-3-4b": "gemma3_text",
    "phi-4-mini": "phi3",
    "olmo-2-1b": "olmo2",
    "smollm3-3b": "smollm3",
    "ministral-8b": "mistral",
}
"""Shape -> the model_type its rollout: line names: the issue's table, every family native
but the mixture of experts (docs/models.md). Ministral-8B-Instruct-2410's config.json says
``mistral`` (with a 32768-token sliding window)."""
HF_GENERATE = {
    "qwen3-30b-a3b": "HF generate, model_type qwen3_moe has no native implementation: "
    "rollouts about 7-14x slower",
}
"""Shape -> its rollout: line's text where HF generate decodes: what it takes and what that
costs (grpo_hpc.config.rollout_engine.HF_SLOWDOWN, measured)."""


def dry_run(shape: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """grpo-submit's main in this process (the CLI's own subprocess form is tested once
    below): its exit code and the ``rollout:`` lines it printed."""
    args = ["--profile", "h100x2", "--config", "gsm8k", "--dry-run", "--name", "d"]
    code = main([*args, f"model.name_or_path=random:{SHAPES / shape}"])
    out = capsys.readouterr().out
    return code, "\n".join(ln for ln in out.splitlines() if ln.startswith("rollout:"))


def test_every_shape_is_in_the_table() -> None:
    shapes = {p.parent.name for p in SHAPES.glob("*/config.json")}
    older = {"qwen2.5-0.5b", "qwen2.5-3b", "qwen2.5-7b", "tiny"}  # qwen2.5-1.5b stands for them
    assert shapes - older == set(NATIVE) | set(HF_GENERATE)


@pytest.mark.parametrize("shape", sorted(NATIVE))
def test_native_family_is_named(shape: str, logs_dir: Path, capsys) -> None:  # noqa: ANN001
    code, line = dry_run(shape, capsys)
    assert code == 0
    assert line == f"rollout: native ({NATIVE[shape]})"
    assert not logs_dir.exists()


@pytest.mark.parametrize("shape", sorted(HF_GENERATE))
def test_hf_generate_family_says_why_and_what_it_costs(
    shape: str,
    logs_dir: Path,
    capsys,  # noqa: ANN001
) -> None:
    code, line = dry_run(shape, capsys)
    assert code == 0
    assert line == f"rollout: {HF_GENERATE[shape]}"


def test_the_console_script_refuses_native_for_a_mixture_of_experts(logs_dir: Path) -> None:
    """As a user runs it: an explicit rollout.engine=native that cannot decode the model is
    refused before anything is written or queued (exit 2, one line)."""
    result = run_cli(
        "grpo_hpc.cli.submit:main",
        *("--profile", "h100x2", "--config", "gsm8k", "--dry-run", "--name", "d"),
        f"model.name_or_path=random:{SHAPES / 'qwen3-30b-a3b'}",
        "rollout.engine=native",
    )
    assert result.returncode == 2, result.stdout + result.stderr
    said = "rollout.engine=native cannot decode model_type 'qwen3_moe' (a mixture of experts)"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"grpo-submit: error: {said}")
    assert f"# refused at submission: {said}" in result.stdout
    assert not logs_dir.exists()


def test_phi_past_its_longrope_limit_is_told_before_queueing(
    logs_dir: Path,
    capsys,  # noqa: ANN001
) -> None:
    """Phi-4-mini's longrope switches to its long factors past 4096 positions, which the
    native engine does not implement: the submission measures the run's longest prompt as
    the trainer does (GSM8K's, 1164 tokens with the char tokenizer of a ``random:`` model)
    and decides on it; at a length cap one past the limit it says HF generate decodes,
    and an explicit native engine is refused in one line."""
    args = ["--profile", "h100x2", "--config", "gsm8k", "--dry-run", "--name", "d"]
    shape = f"model.name_or_path=random:{SHAPES / 'phi-4-mini'}"
    assert main([*args, shape, "rollout.max_new_tokens=2932"]) == 0
    out = capsys.readouterr().out
    assert "rollout: native (phi3)" in out  # 1164 + 2932 tokens: 4096, the limit
    assert main([*args, shape, "rollout.max_new_tokens=2933"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("rollout:")]
    assert line == [
        "rollout: HF generate, the native engine does not decode sequences of 4097 tokens "
        "(prompt + rollout.max_new_tokens) past longrope's original_max_position_embeddings="
        "4096 (its long factors are not native): rollouts about 7-14x slower"
    ]
    code = main([*args, shape, "rollout.max_new_tokens=2933", "rollout.engine=native"])
    assert code == 2
    assert "rollout.engine=native cannot decode sequences of 4097 tokens" in capsys.readouterr().err
    assert not logs_dir.exists()
