"""The training forward sees exactly what generation saw (right-aligned rows)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpo_hpc.train.loss import selective_log_softmax
from grpo_hpc.train.rollout import RolloutBatch
from grpo_hpc.train.update import MicroBatch, completion_logp, right_align


def test_right_align_moves_left_pads_to_the_end() -> None:
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [4, 5, 6, 7, 8, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    new_ids, new_mask, start = right_align(ids, mask, prompt_len=3, pad_id=0)
    assert new_ids.tolist() == [[5, 6, 7, 8, 0, 0], [4, 5, 6, 7, 8, 0]]
    assert new_mask.tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]]
    assert start.tolist() == [1, 3]


def test_completion_logp_matches_unpadded_forward() -> None:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
    )
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
