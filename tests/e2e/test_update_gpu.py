"""The update on a GPU waits for the device no more often with more micro-batches: the host
queues the next micro-batch's forward while the GPU runs this one's backward.

A real 2-GPU run sampled the trainer's stack in its slow updates (bench/results/
weak_scaling_h100x4_2026-11-27.md): rank 0 sat in ``_stat_sums`` indexing a device tensor
with a host row index, a copy that waits for everything queued before it, once per
micro-batch. The row indices and advantages now go to the device when the batch is split.
Its first run on an H100 (same day) failed for a reason of its own: 3 waits with one
micro-batch, 8 with seven, the extra ones in transformers' packed-row detection, now skipped
inside our packed forward (grpo_hpc.train.algo.packing). Its second run (twentieth session)
still found them: this test had never switched the model to the packed attention, which is
where the trainer installs that skip, nor run under bf16 autocast, without which the packed
attention falls back to one SDPA per row (a host read of the row boundaries per layer); now
it does both, as the trainer does. Skipped where there is no GPU."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from grpo_hpc.config.schema import AlgoConfig
from grpo_hpc.train.algo import packing
from grpo_hpc.train.algo.update import accumulate, split
from grpo_hpc.train.distributed.dist import DistInfo
from grpo_hpc.train.rollout.engines import RolloutBatch
from grpo_hpc.train.setup.models import load_model_and_tokenizer
from tests.unit.train.algo.test_packing import NEW, ROWS, _batch, _model_dir

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _syncs(fn: Callable[[], object]) -> list[str]:
    """Where ``fn`` made the host wait for the GPU (torch's sync debug mode)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [f"{Path(w.filename).name}:{w.lineno}" for w in seen if "synchroniz" in str(w.message)]


def _on_gpu(batch: RolloutBatch) -> RolloutBatch:
    dev = torch.device("cuda")
    return RolloutBatch(
        batch.input_ids.to(dev),
        batch.attention_mask.to(dev),
        batch.completion_mask.to(dev),
        prompt_len=batch.prompt_len,
        texts=batch.texts,
        pad_token_id=batch.pad_token_id,
    )


def test_host_waits_do_not_grow_with_micro_batches(tmp_path: Path) -> None:
    # packed, as the trainer runs on a GPU (algo.packing auto): a padded forward hands
    # transformers an attention mask, whose own checks may read it on the host
    model, _ = load_model_and_tokenizer(_model_dir(tmp_path, "llama"), "sdpa", torch.device("cuda"))
    packing.use_packed_attention(model)  # as the trainer does when it packs
    model.train()
    batch = _on_gpu(_batch(model.config.vocab_size))
    adv = torch.linspace(-1.5, 2.0, len(ROWS))
    algo = AlgoConfig(packing=True)
    # bf16 autocast, as the trainer's GPU update runs: the packed attention's varlen kernel
    # takes half precision only (fp32 falls back to one SDPA per row, reading the row
    # boundaries on the host)
    bf16 = functools.partial(torch.autocast, "cuda", dtype=torch.bfloat16)

    def update(rows_per_micro: int) -> Callable[[], object]:
        mbs = split(batch, list(range(len(ROWS))), adv, rows_per_micro, 0, True)
        assert all(mb.rows.is_cuda and mb.advantages.is_cuda for mb in mbs)
        info = DistInfo(device=torch.device("cuda"))
        return lambda: accumulate(model, mbs, algo, info, NEW, None, bf16)

    update(1)()  # warm-up: the caching allocators' first blocks
    one, many = _syncs(update(len(ROWS))), _syncs(update(1))
    # (an H100, twentieth session: 2 waits with one micro-batch, the first-shape one included,
    # and 1 with seven: the read of the update's statistics at its end)
    assert len(many) <= len(one), f"one micro-batch waited at {one}, {len(ROWS)} at {many}"
