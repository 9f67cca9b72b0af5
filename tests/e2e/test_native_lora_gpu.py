"""LoRA in the native engine on a GPU (CUDA graphs, compiled layers), Qwen2.5-0.5B shape with
random weights: fp32 greedy tokens equal peft's HF generate, and in bf16 (the base in bf16,
fp32 adapters, as the trainer loads a LoRA policy) the engine's log-probs agree with the
training forward within the tolerance of full fine-tuning (tests/e2e/test_native_gpu.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_hpc.train.algo.update import MicroBatch, completion_logp
from grpo_hpc.train.rollout.engines import HFEngine
from grpo_hpc.train.rollout.native.engine import NativeEngine
from grpo_hpc.train.setup.models import load_model_and_tokenizer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
PROMPTS = [f"Question {i}: what is {7 * i} plus {3 * i + 1}?" for i in range(8)]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bench.common import build_model

    out = tmp_path_factory.mktemp("qwen") / "m"
    build_model(out, "qwen2.5-0.5b")
    return out


def _peft(model_dir: Path, dtype: torch.dtype, targets: list[str] = TARGETS):  # noqa: ANN202
    from peft import LoraConfig, get_peft_model

    model, tok = load_model_and_tokenizer(model_dir, "sdpa", torch.device("cuda"), dtype=dtype)
    torch.manual_seed(1)
    cfg = LoraConfig(r=16, lora_alpha=32, target_modules=targets, init_lora_weights=False)
    peft = get_peft_model(model, cfg).eval()  # adapters upcast to fp32 (peft's default)
    return peft, tok


def test_lora_fp32_greedy_tokens_equal_peft_generate(model_dir: Path) -> None:
    peft, tok = _peft(model_dir, torch.float32)
    hf = HFEngine(peft, tok, 48, 1.0, 1.0, 600).generate(PROMPTS, 2, greedy=True)
    native = NativeEngine(peft, tok, 48, 1.0, 1.0, 600, dtype=torch.float32)
    assert torch.equal(hf.input_ids, native.generate(PROMPTS, 2, greedy=True).input_ids)


@pytest.mark.parametrize("targets", [TARGETS, ["q_proj", "k_proj", "v_proj", "o_proj"]])
def test_lora_bf16_logp_match_the_training_forward(model_dir: Path, targets: list[str]) -> None:
    """Every projection adapted (all folded), and the default targets (the MLP and the
    embedding read in place from the frozen bf16 base, gate/up fused in place; the
    engine released and rebuilt once, as rollout.release_engine_memory does)."""
    peft, tok = _peft(model_dir, torch.bfloat16, targets)
    native = NativeEngine(peft, tok, 64, 1.0, 1.0, 600, dtype=torch.bfloat16)
    torch.manual_seed(0)
    native.generate(PROMPTS, 4)
    native.release()
    batch = native.generate(PROMPTS, 4)
    rows = batch.input_ids.shape[0]
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        logp, _ = completion_logp(peft, MicroBatch(batch, torch.arange(rows), torch.zeros(rows)))
    diff = (logp - batch.sampled_logp)[batch.completion_mask.bool()].abs()
    assert diff.mean() < 0.02 and diff.max() < 0.15, (diff.mean(), diff.max())
