"""The training forward sees exactly what generation saw (right-aligned rows), and the
micro-batch split changes nothing but memory."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpo_hpc.config.schema import AlgoConfig
from grpo_hpc.train.algo.loss import selective_log_softmax
from grpo_hpc.train.algo.update import MicroBatch, accumulate, completion_logp, right_align, split
from grpo_hpc.train.distributed.dist import DistInfo
from grpo_hpc.train.rollout.engines import RolloutBatch


def test_right_align_moves_left_pads_to_the_end() -> None:
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [4, 5, 6, 7, 8, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    new_ids, new_mask, start = right_align(ids, mask, prompt_len=3, pad_id=0)
    assert new_ids.tolist() == [[5, 6, 7, 8, 0, 0], [4, 5, 6, 7, 8, 0]]
    assert new_mask.tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]]
    assert start.tolist() == [1, 3]


def _small_llama_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
    )


def test_completion_logp_matches_unpadded_forward() -> None:
    torch.manual_seed(0)
    cfg = _small_llama_config()
    model = LlamaForCausalLM(cfg).eval()
    prompts = [[7, 8], [9, 10, 11, 12]]  # ragged prompts, left-padded to 4
    completions = [[13, 14, 15], [16, 17, 0]]  # second one ended early (masked tail)
    ids = torch.tensor([[0, 0, *prompts[0], *completions[0]], [*prompts[1], *completions[1]]])
    cmask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    mask = torch.cat([torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]), cmask], 1)
    batch = RolloutBatch(ids, mask, cmask, prompt_len=4, texts=["", ""], pad_token_id=0)
    mb = MicroBatch(batch, torch.tensor([0, 1]), torch.zeros(2))
    with torch.no_grad():
        logp, _ = completion_logp(model, mb)
        for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            alone = torch.tensor([p + c])
            logits = model(input_ids=alone).logits[:, len(p) - 1 : -1]
            expected = selective_log_softmax(logits, torch.tensor([c]))[0]
            n = int(cmask[row].sum())
            torch.testing.assert_close(logp[row, :n], expected[:n], rtol=1e-5, atol=1e-5)


def _ragged_batch(lengths: list[int], prompt: int = 3, new: int = 6) -> RolloutBatch:
    """Rows with full prompts and completions of the given lengths (then padding)."""
    g = torch.Generator().manual_seed(1)
    n = len(lengths)
    ids = torch.randint(1, 50, (n, prompt + new), generator=g)
    cmask = (torch.arange(new).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).long()
    ids[:, prompt:] *= cmask
    mask = torch.cat([torch.ones(n, prompt, dtype=torch.long), cmask], 1)
    return RolloutBatch(ids, mask, cmask, prompt_len=prompt, texts=[""] * n, pad_token_id=0)


def test_split_by_token_budget_counts_padded_tokens() -> None:
    batch = _ragged_batch([6, 1, 1, 2, 6, 6])  # rows of 9, 4, 4, 5, 9, 9 real tokens
    mbs = split(batch, list(range(6)), torch.zeros(6), max_rows=8, max_tokens=18)
    # 9+4 -> 2 rows x 9 = 18 fits; a third row would make 27 > 18.
    assert [mb.rows.tolist() for mb in mbs] == [[0, 1], [2, 3], [4, 5]]
    assert [mb.extent for mb in mbs] == [(6, 9), (2, 5), (6, 9)]
    rows_only = split(batch, list(range(6)), torch.zeros(6), max_rows=4, max_tokens=0)
    assert [mb.rows.tolist() for mb in rows_only] == [[0, 1, 2, 3], [4, 5]]
    alone = split(batch, [0, 4], torch.zeros(2), max_rows=8, max_tokens=5)
    assert [mb.rows.tolist() for mb in alone] == [[0], [4]]  # longer than the budget


def test_gradient_does_not_depend_on_the_micro_batch_split() -> None:
    torch.manual_seed(0)
    cfg = _small_llama_config()
    model = LlamaForCausalLM(cfg).to(torch.float64)
    batch = _ragged_batch([6, 1, 3, 2, 6, 5])
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0], dtype=torch.float64)
    grads = []
    for max_rows, budget in ((6, 0), (8, 18), (1, 0)):
        mbs = split(batch, list(range(6)), adv, max_rows, budget)
        stats = accumulate(model, mbs, AlgoConfig(), DistInfo(), 6, None, contextlib.nullcontext)
        grads.append([p.grad.clone() for p in model.parameters()])
        model.zero_grad(set_to_none=True)
        assert stats["clip_frac"] == 0.0 and "rollout/logp_diff" not in stats
        # the step's size: the same tokens and rows however they are split
        completion_tokens = float(batch.completion_mask.sum())
        assert stats["train/tokens"] == completion_tokens and stats["train/sequences"] == 6
        assert stats["train/micro_batches"] == len(mbs)
    for other in grads[1:]:
        for a, b in zip(grads[0], other, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def _grads_and_stats(
    batch: RolloutBatch, adv: torch.Tensor, algo: AlgoConfig
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    torch.manual_seed(0)
    model = LlamaForCausalLM(_small_llama_config())
    mbs = split(batch, list(range(len(adv))), adv, max_rows=8)
    stats = accumulate(model, mbs, algo, DistInfo(), 6, None, contextlib.nullcontext)
    return {n: p.grad.clone() for n, p in model.named_parameters()}, stats


def _with_engine_logp(batch: RolloutBatch, shift: float | torch.Tensor) -> RolloutBatch:
    """The batch as the native engine returns it, its log-probs the trainer's minus
    ``shift`` (an engine that gave every sampled token exp(-shift) times the probability;
    a ``[rows, 1]`` tensor: one shift per row)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(_small_llama_config())
    mb = MicroBatch(batch, torch.arange(batch.input_ids.shape[0]), torch.zeros(1))
    with torch.no_grad():
        logp, _ = completion_logp(model, mb)
    batch.sampled_logp = (logp - shift) * batch.completion_mask
    return batch


def test_truncated_importance_sampling_weights_each_token() -> None:
    """algo.tis_cap: the weight is min(pi_old / pi_engine, cap). An engine that gave every
    token a quarter of the trainer's probability makes the ratio 4: capped at 2, the
    gradient is exactly twice the uncorrected one; an engine that agrees changes nothing.
    The engine-vs-trainer KL is k3 = e^d - d - 1 with d = log 4."""
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0])
    off, off_stats = _grads_and_stats(_ragged_batch([6, 2, 4, 5]), adv, AlgoConfig())
    agree = _with_engine_logp(_ragged_batch([6, 2, 4, 5]), 0.0)
    same, same_stats = _grads_and_stats(agree, adv, AlgoConfig(tis_cap=2.0))
    for name, g in off.items():
        torch.testing.assert_close(same[name], g, rtol=1e-5, atol=1e-7)
    assert same_stats["rollout/engine_kl"] == pytest.approx(0.0, abs=1e-9)
    assert "rollout/engine_kl" not in off_stats  # HF generate: no engine log-probs

    shift = math.log(4.0)
    quarter = _with_engine_logp(_ragged_batch([6, 2, 4, 5]), shift)
    doubled, stats = _grads_and_stats(quarter, adv, AlgoConfig(tis_cap=2.0))
    for name, g in off.items():
        torch.testing.assert_close(doubled[name], 2 * g, rtol=1e-5, atol=1e-7)
    assert stats["rollout/engine_kl"] == pytest.approx(math.exp(shift) - shift - 1, rel=1e-5)
    # the importance weights as applied: every token's ratio 4, capped at 2, all cut
    assert stats["rollout/is_weight_mean"] == pytest.approx(2.0, rel=1e-5)
    assert stats["rollout/is_weight_max"] == pytest.approx(4.0, rel=1e-5)
    assert stats["rollout/is_clipped_frac"] == 1.0
    assert same_stats["rollout/is_weight_mean"] == pytest.approx(1.0, rel=1e-6)
    assert same_stats["rollout/is_clipped_frac"] == 0.0


def test_an_asynchronous_run_corrects_with_cap_2_unless_told_otherwise() -> None:
    """algo.tis_cap unset: a synchronous run leaves the loss alone, an asynchronous one
    (algo.max_staleness >= 1) weights tokens by min(pi_old / pi_sampler, 2); a cap set
    by hand wins either way, 0 included."""
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0])
    off, sync_stats = _grads_and_stats(
        _with_engine_logp(_ragged_batch([6, 2, 4, 5]), math.log(4.0)), adv, AlgoConfig()
    )
    stale = _with_engine_logp(_ragged_batch([6, 2, 4, 5]), math.log(4.0))
    doubled, stats = _grads_and_stats(stale, adv, AlgoConfig(max_staleness=1))
    for name, g in off.items():
        torch.testing.assert_close(doubled[name], 2 * g, rtol=1e-5, atol=1e-7)
    assert sync_stats["rollout/is_clipped_frac"] == 0.0  # uncapped: reported, not applied
    assert sync_stats["rollout/is_weight_mean"] == pytest.approx(4.0, rel=1e-5)
    assert stats["rollout/is_clipped_frac"] == 1.0
    assert AlgoConfig(max_staleness=2, tis_cap=0.0).importance_cap == 0.0
    assert AlgoConfig(max_staleness=0, tis_cap=3.0).importance_cap == 3.0


def test_off_policy_sequence_masking_drops_stale_negative_completions() -> None:
    """algo.offpolicy_mask = delta: a completion trains nothing when its advantage is
    negative and mean_t log(pi_sampler / pi_old) > delta; every other completion trains as
    before. Row 1 (negative, the sampler 0.5 nats per token surer than the trainer) is
    dropped: the gradient is the one with its advantage 0, the normaliser unchanged. Row 0
    drifted as far but its advantage is positive; row 3 is negative but within delta."""
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0])
    drift = torch.tensor([[0.5], [0.5], [0.01], [0.01]])  # log pi_sampler - log pi_old
    lengths = [6, 2, 4, 5]
    algo = AlgoConfig(tis_cap=0.0, offpolicy_mask=0.1)
    masked, stats = _grads_and_stats(_with_engine_logp(_ragged_batch(lengths), -drift), adv, algo)
    expected, _ = _grads_and_stats(
        _ragged_batch(lengths), torch.tensor([1.0, 0.0, 0.25, -1.0]), algo
    )
    for name, g in expected.items():
        torch.testing.assert_close(masked[name], g, rtol=1e-5, atol=1e-7)
    assert stats["rollout/offpolicy_masked_frac"] == 0.25
    # off (0, the default) or a delta above every drift: nothing dropped, nothing reported
    plain, plain_stats = _grads_and_stats(_ragged_batch(lengths), adv, AlgoConfig(tis_cap=0.0))
    for delta in (0.0, 0.6):
        algo = AlgoConfig(tis_cap=0.0, offpolicy_mask=delta)
        kept, kept_stats = _grads_and_stats(
            _with_engine_logp(_ragged_batch(lengths), -drift), adv, algo
        )
        for name, g in plain.items():
            torch.testing.assert_close(kept[name], g, rtol=1e-5, atol=1e-7)
        assert ("rollout/offpolicy_masked_frac" in kept_stats) == (delta > 0)
    assert "rollout/offpolicy_masked_frac" not in plain_stats
