"""LoRA in the native engine: adapters folded into the packed weights (W + scaling B A) give
the peft model's own greedy tokens and log-probs (fp32, CPU), and unsupported LoRA setups
fall back to HF generate."""

from __future__ import annotations

import pytest
import torch

from grpo_hpc.core.errors import ConfigError
from grpo_hpc.train.algo.update import MicroBatch, completion_logp
from grpo_hpc.train.rollout.engines import EngineOptions, HFEngine, pick_engine
from grpo_hpc.train.rollout.native.engine import NativeEngine
from grpo_hpc.train.setup.models import char_tokenizer

PROMPTS = ["What is 2+3?", "Compute 17 plus 25, then give the answer.", "9*9="]
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _qwen2(seed: int = 5):  # noqa: ANN202
    """A random Qwen2 (q/k/v biases, untied head, grouped KV heads) and its tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = char_tokenizer()
    tok.padding_side = "left"
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False,
        initializer_range=0.3, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg).eval(), tok


def _lora(model, targets=ALL, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)  # init_lora_weights=False: B is random too, so the delta matters
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False, **kw)
    peft = get_peft_model(model, cfg).eval()
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_B" in n:
                p.mul_(8.0)  # a delta as large as the weights: a test that can fail
    return peft


@pytest.fixture(scope="module")
def lora_model():  # noqa: ANN201
    model, tok = _qwen2()
    return _lora(model), tok


def test_folded_greedy_tokens_equal_peft_generate(lora_model) -> None:  # noqa: ANN001
    peft, tok = lora_model
    hf = HFEngine(peft, tok, 32, 1.0, 1.0, 60).generate(PROMPTS, 2, greedy=True)
    native = NativeEngine(peft, tok, 32, 1.0, 1.0, 60)
    got = native.generate(PROMPTS, 2, greedy=True)
    assert len(set(got.texts)) > 1, "degenerate test: every completion is the same"
    assert torch.equal(hf.input_ids, got.input_ids) and hf.texts == got.texts
    with peft.disable_adapter():  # the adapters change what is generated
        base = NativeEngine(peft, tok, 32, 1.0, 1.0, 60).generate(PROMPTS, 2, greedy=True)
    assert base.texts != got.texts


def test_folded_logp_equals_the_peft_forward(lora_model) -> None:  # noqa: ANN001
    peft, tok = lora_model
    torch.manual_seed(0)
    batch = NativeEngine(peft, tok, 24, 0.7, 0.9, 60).generate(PROMPTS, 4)
    rows = batch.input_ids.shape[0]
    with torch.no_grad():
        logp, _ = completion_logp(peft, MicroBatch(batch, torch.arange(rows), torch.zeros(rows)))
    mask = batch.completion_mask.bool()
    # (W + BA)x and Wx + B(Ax) round differently in fp32: agreement to ~1e-4 relative.
    torch.testing.assert_close(batch.sampled_logp[mask], logp[mask], atol=1e-5, rtol=2e-4)


def test_refill_follows_adapter_updates(lora_model) -> None:  # noqa: ANN001
    peft, tok = lora_model
    engine = NativeEngine(peft, tok, 16, 1.0, 1.0, 60)
    before = engine.generate(PROMPTS, 1, greedy=True).texts
    saved = {n: p.detach().clone() for n, p in peft.named_parameters() if "lora_A" in n}
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_A" in n:
                p.mul_(-1.0)  # what an optimizer step does: the next rollout must see it
    after = engine.generate(PROMPTS, 1, greedy=True).texts
    ref = HFEngine(peft, tok, 16, 1.0, 1.0, 60).generate(PROMPTS, 1, greedy=True).texts
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if n in saved:
                p.copy_(saved[n])
    assert after == ref and after != before


@pytest.mark.parametrize(
    ("targets", "kw"),
    [(["q_proj", "lm_head"], {}), (["q_proj", "v_proj"], {"use_dora": True})],
)
def test_unsupported_lora_falls_back_to_hf(targets: list[str], kw: dict) -> None:
    model, _ = _qwen2()
    peft = _lora(model, targets, **kw)
    opts = EngineOptions(8, 1.0, 1.0, 60, lora=True)
    assert pick_engine("auto", peft, opts) == "hf"
    with pytest.raises(ConfigError, match="use rollout.engine=hf"):
        pick_engine("native", peft, opts)


def test_plain_lora_picks_native_when_asked() -> None:
    model, _ = _qwen2()
    assert pick_engine("native", _lora(model), EngineOptions(8, 1.0, 1.0, 60, lora=True)) == (
        "native"
    )


def test_frozen_base_is_read_in_place_not_copied() -> None:
    """Adapters on q and v only: o, down, gate/up (fused in place), k... are the base's own
    memory, the base's values are unchanged by the fusing, and tokens still equal peft's."""
    model, tok = _qwen2()
    peft = _lora(model, ["q_proj", "v_proj"])
    before = {k: v.clone() for k, v in peft.state_dict().items()}
    engine = NativeEngine(peft, tok, 24, 1.0, 1.0, 60)
    layers = peft.get_base_model().model.layers
    for dst, layer in zip(engine.packed.layers, layers, strict=True):
        att, mlp = layer.self_attn, layer.mlp
        assert dst.wdown.data_ptr() == mlp.down_proj.weight.data_ptr()
        assert dst.wo.data_ptr() == att.o_proj.weight.data_ptr()
        assert dst.wgu.data_ptr() == mlp.gate_proj.weight.data_ptr()
        assert dst.wgu[mlp.gate_proj.weight.shape[0] :].data_ptr() == mlp.up_proj.weight.data_ptr()
        assert dst.wqkv.data_ptr() != att.q_proj.weight.data_ptr()  # q is adapted: folded copy
    after = peft.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    hf = HFEngine(peft, tok, 24, 1.0, 1.0, 60).generate(PROMPTS, 2, greedy=True)
    assert engine.generate(PROMPTS, 2, greedy=True).texts == hf.texts
    fused = engine.packed.layers[0].wgu.data_ptr()
    engine.release()  # the engine lets go of its copies; the base keeps its fused buffer
    assert engine.generate(PROMPTS, 2, greedy=True).texts == hf.texts
    assert engine.packed.layers[0].wgu.data_ptr() == fused  # reused, not fused again


def test_a_replaced_base_weight_is_copied_in() -> None:
    """If something swaps a shared weight for a new tensor, the next refill copies it into
    the engine's buffer: decoding follows the model, never a stale tensor."""
    model, tok = _qwen2()
    peft = _lora(model, ["q_proj", "v_proj"])
    engine = NativeEngine(peft, tok, 24, 1.0, 1.0, 60)
    before = engine.generate(PROMPTS, 1, greedy=True).texts
    down = peft.get_base_model().model.layers[0].mlp.down_proj
    torch.manual_seed(3)
    down.weight = torch.nn.Parameter(torch.randn_like(down.weight), requires_grad=False)
    ref = HFEngine(peft, tok, 24, 1.0, 1.0, 60).generate(PROMPTS, 1, greedy=True).texts
    assert ref != before, "degenerate test: the new weight changes nothing"
    assert engine.generate(PROMPTS, 1, greedy=True).texts == ref
