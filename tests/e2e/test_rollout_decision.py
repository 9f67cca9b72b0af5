"""grpo-submit --dry-run and the trainer decide the rollout engine alike, from the same
inputs (the model's config, the run's longest prompt measured with the job's tokenizer,
the modules LoRA adapts): an explicit ``rollout.engine=native`` that cannot work is refused
at submission with the very line the trainer would refuse it with after the queue wait."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_hpc.tasks.char_tokenizer import char_tokenizer
from grpo_hpc.tasks.problems import longest_prompt_tokens
from tests.e2e.helpers import env, make_run, train

from ..slowdown import guard

ROOT = Path(__file__).resolve().parents[2]
MAX_NEW = 8


def _small_phi4_mini(out: Path) -> Path:
    """Phi-4-mini's config.json (bench/shapes: longrope, 4096 positions before its long
    factors), at a size a CPU builds in a second."""
    cfg = json.loads((ROOT / "bench/shapes/phi-4-mini/config.json").read_text())
    cfg.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2)
    cfg.update(num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    half = int(64 // 4 * cfg["partial_rotary_factor"]) // 2  # rotary dims / 2
    for key in ("long_factor", "short_factor"):
        cfg["rope_scaling"][key] = cfg["rope_scaling"][key][:half]
    out.mkdir()
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _data_with_longest_prompt(path: Path, tokens: int) -> Path:
    """GSM8K-format rows whose longest prompt (with the char tokenizer the job uses for a
    ``random:`` model) is ``tokens`` long; the rest short."""
    short = {"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}
    probe = longest_prompt_tokens(char_tokenizer(), [{"question": "x"}])
    long_q = "1" * (tokens - probe + 1)  # one character, one token
    rows = [short] * 5 + [{**short, "question": long_q}] + [short] * 6  # a training row
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _dry_run(tmp_path: Path, overrides: list[str]) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "grpo_hpc.cli.submit",
        "--profile",
        "local",
        "--config",
        "tiny",
        "--name",
        "dry",
        "--logs",
        str(tmp_path / "logs"),
        "--dry-run",
        *overrides,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=guard(120))


def _refusal(text: str) -> str:
    """The refusal line, as the dry run or the trainer says it."""
    lines = [line for line in text.splitlines() if "rollout.engine=native cannot" in line]
    assert lines, text[-3000:]
    return lines[-1][lines[-1].index("rollout.engine=native cannot") :]


@pytest.mark.parametrize("case", ["past-the-position-limit", "lora-on-lm_head"])
def test_dry_run_refuses_an_explicit_native_engine_as_the_trainer_does(
    tmp_path: Path, case: str
) -> None:
    common = ["rollout.engine=native", f"rollout.max_new_tokens={MAX_NEW}"]
    if case == "past-the-position-limit":
        # the longest prompt + max_new_tokens is 4097: one past Phi-4-mini's 4096 (a dry
        # run that assumed a 320-token prompt said "native" here)
        model = _small_phi4_mini(tmp_path / "phi4")
        data = _data_with_longest_prompt(tmp_path / "long.jsonl", 4097 - MAX_NEW)
        overrides = [
            f"model.name_or_path=random:{model}",
            f"data.source={data}",
            "data.num_eval=2",
            "data.num_val=2",
            "data.num_train=0",
            *common,
        ]
        said = "sequences of 4097 tokens"
    else:
        overrides = ["model.lora_rank=4", "model.lora_target_modules=[q_proj,lm_head]", *common]
        said = "LoRA on lm_head"
    dry = _dry_run(tmp_path, overrides)
    assert dry.returncode == 2, dry.stdout + dry.stderr
    at_submission = _refusal(dry.stdout + dry.stderr)
    assert said in at_submission

    paths = make_run(tmp_path / "runs", "trained", *overrides)
    trained = train(paths)
    assert trained.returncode == 2, trained.stdout[-2000:] + trained.stderr[-2000:]
    assert _refusal(trained.stdout + trained.stderr) == at_submission
