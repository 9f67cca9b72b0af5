"""Packed micro-batches (algo.packing): the rows of a micro-batch as one sequence with
row-confined attention give the padded path's loss and gradients, on real tiny Llama and
Qwen2 models loaded through from_pretrained."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import pytest
import torch

from grpo_hpc.config.schema import AlgoConfig
from grpo_hpc.train.algo import packing
from grpo_hpc.train.algo.update import accumulate, split
from grpo_hpc.train.distributed.dist import DistInfo
from grpo_hpc.train.rollout.engines import RolloutBatch
from grpo_hpc.train.setup.models import (
    LlamaShape,
    char_tokenizer,
    enable_checkpointing,
    load_model_and_tokenizer,
    save_random_llama,
)

SHAPES = Path(__file__).resolve().parents[4] / "bench" / "shapes"
PROMPT, NEW = 12, 24
# (real prompt tokens, completion tokens): very different lengths, an empty completion too.
ROWS = [(12, 24), (3, 1), (7, 17), (1, 24), (12, 0), (5, 9), (2, 3)]


def _model_dir(tmp: Path, arch: str) -> Path:
    """A random tiny model saved as a HF directory (weights + char tokenizer)."""
    out = tmp / arch
    if arch == "llama":
        save_random_llama(out, LlamaShape(64, 2, 4, 2, 128), seed=0)
        return out
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(SHAPES / "tiny")  # Qwen2: q/k/v biases
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    char_tokenizer(cfg.vocab_size).save_pretrained(out)
    return out


def padded_batch(vocab: int, rows: list[tuple[int, int]], prompt: int, new: int) -> RolloutBatch:
    """Left-padded prompts then right-padded completions, as the rollout engines return:
    ``rows`` of (prompt tokens, completion tokens) within ``prompt`` + ``new`` columns."""
    g = torch.Generator().manual_seed(3)
    n = len(rows)
    ids = torch.zeros(n, prompt + new, dtype=torch.long)
    mask = torch.zeros_like(ids)
    cmask = torch.zeros(n, new, dtype=torch.long)
    for r, (p, c) in enumerate(rows):
        ids[r, prompt - p : prompt + c] = torch.randint(10, vocab, (p + c,), generator=g)
        mask[r, prompt - p : prompt + c] = 1
        cmask[r, :c] = 1
    return RolloutBatch(ids, mask, cmask, prompt_len=prompt, texts=[""] * n, pad_token_id=0)


def _batch(vocab: int) -> RolloutBatch:
    return padded_batch(vocab, ROWS, PROMPT, NEW)


def _grads(model: torch.nn.Module, batch: RolloutBatch, algo: AlgoConfig) -> tuple[dict, dict]:
    adv = torch.linspace(-1.5, 2.0, len(ROWS))
    mbs = split(batch, list(range(len(ROWS))), adv, algo.micro_batch_size,
                algo.micro_batch_tokens, algo.packing)  # fmt: skip
    assert all((mb.lengths is not None) == algo.packing for mb in mbs)
    stats = accumulate(model, mbs, algo, DistInfo(), NEW, None, contextlib.nullcontext)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return stats, grads


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_packed_gradients_equal_padded_in_fp32(
    tmp_path: Path, arch: str, checkpointing: bool
) -> None:
    path = _model_dir(tmp_path, arch)
    padded, _ = load_model_and_tokenizer(path, "sdpa", torch.device("cpu"))
    packed = copy.deepcopy(padded)
    assert packing.use_packed_attention(packed) == packing.ATTN_NAME
    for m in (padded, packed):
        m.train()
        if checkpointing:  # the recompute in backward must see the row boundaries too
            enable_checkpointing(m, 1)
    batch = _batch(padded.config.vocab_size)
    # Budgets that split both paths in several micro-batches (3 rows, or 60 real tokens).
    ref_stats, ref = _grads(padded, batch, AlgoConfig(micro_batch_size=3, packing=False))
    stats, got = _grads(packed, batch, AlgoConfig(micro_batch_size=8, micro_batch_tokens=60,
                                                  packing=True))  # fmt: skip
    assert stats["loss"] == pytest.approx(ref_stats["loss"], rel=1e-5)
    assert stats["entropy"] == pytest.approx(ref_stats["entropy"], rel=1e-5)
    assert ref.keys() == got.keys()
    for name, g in ref.items():
        scale = float(g.abs().max())
        assert scale > 0, name  # every parameter is trained, nothing is vacuous
        torch.testing.assert_close(got[name], g, rtol=1e-5, atol=1e-5 * scale, msg=name)


def test_split_counts_real_tokens_when_packing() -> None:
    batch = _batch(1000)  # rows of 36, 4, 24, 25, 12, 14, 5 real tokens
    rows = list(range(len(ROWS)))
    packed = split(batch, rows, torch.zeros(len(ROWS)), 8, 60, packing=True)
    assert [mb.rows.tolist() for mb in packed] == [[0, 1], [2, 3], [4, 5, 6]]
    assert packed[0].lengths == ((12, 24), (3, 1))
    # The padded budget counts rows x longest: 36 + 36 > 60 splits after every long row.
    padded = split(batch, rows, torch.zeros(len(ROWS)), 8, 60)
    assert [mb.rows.tolist() for mb in padded] == [[0], [1, 2], [3, 4], [5, 6]]
    assert all(mb.lengths is None for mb in padded)


def test_pack_layout() -> None:
    ids = torch.tensor([[0, 5, 6, 7, 8, 0], [4, 5, 6, 9, 0, 0]])  # prompt_len 3
    p = packing.pack(ids, 3, [(2, 2), (3, 1)], columns=2)
    assert p.input_ids.tolist() == [[5, 6, 7, 8, 4, 5, 6, 9]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]
    assert p.cu_seqlens.tolist() == [0, 4, 8] and p.max_len == 4
    # Row 0's completion (7, 8) is predicted at 1, 2; row 1's (9) at 6, then clamped.
    assert p.head_positions.tolist() == [[1, 2], [6, 7]]


def test_no_dense_mask_while_packed_and_sdpa_otherwise() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.masking_utils import create_causal_mask

    cfg = AutoConfig.from_pretrained(SHAPES / "tiny")
    model = AutoModelForCausalLM.from_config(cfg)
    packing.use_packed_attention(model)
    emb = torch.zeros(1, 6, cfg.hidden_size)
    pos = torch.tensor([[0, 1, 2, 0, 1, 2]])
    args = (model.config, emb, None, None, pos)  # no 2D mask, no cache, packed positions
    with packing.packed_forward():
        assert create_causal_mask(*args) is None
    # Outside a packed forward it is transformers' own sdpa mask (here block-diagonal).
    mask = create_causal_mask(*args)
    assert mask is not None and not bool(mask[0, 0, 3, 2])
    # A forward that says it is packed but loses the row boundaries fails loudly.
    with packing.packed_forward(), pytest.raises(RuntimeError, match="cu_seq_lens_q"):
        model(input_ids=torch.ones(1, 6, dtype=torch.long), position_ids=pos)


def test_transformers_pack_detection_is_skipped_only_in_a_packed_forward(tmp_path: Path) -> None:
    """It reads a device tensor on the host (a wait per forward on a GPU); our packed
    forward carries the boundaries itself (tests/e2e/test_update_gpu.py counts the waits)."""
    import transformers.masking_utils as masking

    model, _ = load_model_and_tokenizer(_model_dir(tmp_path, "llama"), "sdpa", torch.device("cpu"))
    packing.use_packed_attention(model)
    two_rows = torch.tensor([[0, 1, 2, 0, 1]])
    assert masking.find_packed_sequence_indices(two_rows).tolist() == [[0, 0, 0, 1, 1]]
    with packing.packed_forward():
        assert masking.find_packed_sequence_indices(two_rows) is None
