"""The native engine's CUDA path on every model family it decodes (docs/models.md), at the reduced
sizes of tests/fixtures/families, in bf16 as a GPU rollout runs: the compiled decode
functions, CUDA graphs and the Triton attention kernel (windowed layers of Mistral,
Ministral and Gemma 3 pass each row's window start as its lower bound) against the
eager native path (plain attention, no compile, no graphs), and the sampled tokens'
log-probs against a plain forward pass. The fp32 equality with HF ``generate`` is proven
on the CPU (tests/unit/train/rollout/test_native_families.py, whose random models --
weights that make the tokens vary -- these tests reuse); only what runs on CUDA alone is
tested here. Skipped where there is no GPU.

The random weights (large, as the CPU test draws them so that tokens vary) make bf16 noisy:
on the CPU in bf16 the native engine's greedy tokens left HF's within 0-42 tokens in
most rows, at positions where the two tokens' exact (fp32) logits differed by at most
0.24 and by less than twice HF's own bf16 error there. So each path is judged against the
exact answer, fp32 over the same weights, as tests/e2e/test_update_families_gpu.py judges
the update: a row of the compiled path may leave the eager one only where the two tokens'
fp32 logits are within max(0.125, 2 x the bf16 forward's largest logit error) of each
other (bench/decode/run.py's "within bf16 error"), and the sampled tokens' bf16 log-probs
must be about as close to fp32 as HF's own bf16 forward is (on the CPU: 1.0-1.25x in
mean, up to 1.6x at the largest)."""

from __future__ import annotations

import pytest
import torch

from grpo_hpc.train.algo.update import MicroBatch, completion_logp
from grpo_hpc.train.rollout.native import attention, forward
from grpo_hpc.train.rollout.native.engine import NativeEngine
from grpo_hpc.train.setup.models import load_model_and_tokenizer
from tests.fixtures.families.make import save_varied
from tests.unit.train.rollout.test_native_families import NATIVE, NEW, PROMPTS, WINDOWED

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
CUDA = torch.device("cuda")
BF16 = torch.bfloat16


@pytest.fixture(scope="module", params=NATIVE)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    path = save_varied(request.param, tmp_path_factory.mktemp("families"))
    model, tok = load_model_and_tokenizer(path, "sdpa", CUDA)
    return request.param, model.eval(), tok


def outside_bf16_error(model, eager, fast) -> list[tuple[int, int, float, float]]:  # noqa: ANN001
    """(row, first differing position, fp32 gap of the two tokens, bf16 forward's largest
    logit error) of each row where the greedy batches differ by more than bf16 can tell
    apart (module docstring); both paths share the prefix up to that position."""
    p = eager.prompt_len
    diff = eager.input_ids[:, p:] != fast.input_ids[:, p:]
    ids, mask = eager.input_ids, eager.attention_mask
    with torch.no_grad():
        exact = model(input_ids=ids, attention_mask=mask).logits.float()
        with torch.autocast(CUDA.type, dtype=BF16):
            low = model(input_ids=ids, attention_mask=mask).logits.float()
    out = []
    for row in diff.any(1).nonzero()[:, 0].tolist():
        t = int(diff[row].int().argmax())
        x = exact[row, p - 1 + t]
        gap = (x[eager.input_ids[row, p + t]] - x[fast.input_ids[row, p + t]]).item()
        err = (low[row, p - 1 + t] - x).abs().max().item()
        if abs(gap) > max(0.125, 2 * err):
            out.append((row, t, gap, err))
    return out


def test_compiled_graphs_and_fused_attention_decode_as_the_eager_path(family) -> None:  # noqa: ANN001
    name, model, tok = family
    fast = NativeEngine(model, tok, NEW, 1.0, 1.0, 600, dtype=BF16)
    eager = NativeEngine(
        model, tok, NEW, 1.0, 1.0, 600, dtype=BF16, compile=False, use_graphs=False
    )
    assert fast.fns is not forward.EAGER and fast.graphed
    assert fast.fns.attend is attention.fused_attention, "the Triton kernel is not in use"
    a = eager.generate(PROMPTS, 2, greedy=True)
    b = fast.generate(PROMPTS, 2, greedy=True)
    assert a.prompt_len == b.prompt_len and a.input_ids.shape == b.input_ids.shape
    assert fast.totals["captures"] > 0
    assert not outside_bf16_error(model, a, b), name
    if name in WINDOWED:  # the prompts + 64 tokens span several windows: they mattered
        assert a.input_ids.shape[1] > 2 * model.config.sliding_window


def test_bf16_logp_as_close_to_fp32_as_hf_bf16_forward(family) -> None:  # noqa: ANN001
    name, model, tok = family
    native = NativeEngine(model, tok, NEW, 1.0, 1.0, 600, dtype=BF16)
    torch.manual_seed(0)
    batch = native.generate(PROMPTS, 4)
    rows = batch.input_ids.shape[0]
    mb = MicroBatch(batch, torch.arange(rows), torch.zeros(rows))
    m = batch.completion_mask.bool()
    with torch.no_grad():
        exact, _ = completion_logp(model, mb)
        with torch.autocast(CUDA.type, dtype=BF16):
            hf, _ = completion_logp(model, mb)
    ours, theirs = (batch.sampled_logp - exact)[m].abs(), (hf - exact)[m].abs()
    assert ours.mean() <= 1.5 * theirs.mean() + 0.005, (name, ours.mean(), theirs.mean())
    assert ours.max() <= 2.5 * theirs.max() + 0.05, (name, ours.max(), theirs.max())
