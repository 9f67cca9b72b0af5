"""bench/decode/agreement.py's figures: each row's first difference between HF
generate's and the native engine's greedy tokens, the near-tie rule at it, and the fp32
judge; on a stand-in model whose logits are a table indexed by the last token."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch

from bench.common import shape_dir, shape_names
from bench.decode import agreement as decode

V = 6


class TableModel(torch.nn.Module):
    """Logits at each position: row ``input_ids[t]`` of a [V, V] table."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(table)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.table[input_ids])


def batch(rows: list[list[int]], prompt_len: int = 2) -> SimpleNamespace:
    ids = torch.tensor(rows)
    return SimpleNamespace(
        input_ids=ids, attention_mask=torch.ones_like(ids), prompt_len=prompt_len
    )


def table() -> torch.Tensor:
    t = torch.zeros(V, V)
    t[1, 2], t[1, 3] = 5.0, 4.95  # after token 1: 2 and 3 nearly tie
    t[4, 5], t[4, 0] = 5.0, 1.0  # after token 4: 5 by far
    return t


def no_autocast() -> contextlib.AbstractContextManager:
    return torch.autocast("cpu", enabled=False)


def test_first_differences_and_near_ties() -> None:
    # prompt [0, 0]; row 0 differs at completion position 1 (after token 1: a near-tie),
    # row 1 at position 1 (after token 4: margin 4), row 2 never
    hf = batch([[0, 0, 1, 2, 2], [0, 0, 4, 5, 5], [0, 0, 1, 2, 2]])
    native = batch([[0, 0, 1, 3, 3], [0, 0, 4, 0, 5], [0, 0, 1, 2, 2]])
    f = decode.first_differences(TableModel(table()), hf, native, no_autocast)
    assert (f["compared_tokens"], f["rows"]) == (3, 3)
    assert f["first_diff_min"] == 1 and f["first_diff_median"] == 1
    assert abs(f["identical_frac"] - 1 / 3) < 1e-6
    tie, far = f["diverged"]
    assert (tie["row"], tie["pos"], tie["near_tie"]) == (0, 1, True)
    assert abs(tie["margin"] - 0.05) < 1e-5 and abs(tie["gap"] - 0.05) < 1e-5
    assert (far["row"], far["near_tie"], far["margin"]) == (1, False, 4.0)
    assert f["near_tie_frac"] == 0.5 and "within_bf16_error" not in tie  # fp32: no judge


def test_the_fp32_judge_runs_on_low_precision_weights_and_puts_them_back() -> None:
    model = TableModel(table()).to(torch.bfloat16)
    hf, native = batch([[0, 0, 1, 2], [0, 0, 4, 5]]), batch([[0, 0, 1, 3], [0, 0, 4, 0]])
    f = decode.first_differences(model, hf, native, no_autocast)
    tie, far = f["diverged"]
    # bf16 -> fp32 is exact: the low-precision forward errs by 0 here
    assert tie["within_bf16_error"] and tie["hf_lowp_error"] == 0.0
    assert not far["within_bf16_error"] and far["gap_fp32"] == 4.0
    assert f["within_bf16_error_frac"] == 0.5
    assert model.table.dtype == torch.bfloat16


def test_every_bench_shapes_config_is_a_shape() -> None:
    names = shape_names()
    assert {"qwen3-1.7b", "gemma-3-1b", "phi-4-mini", "qwen2.5-0.5b", "tiny"} <= set(names)
    assert shape_dir("qwen2.5-0.5b") is None  # the Qwen2.5 names keep their random Llama
    assert (shape_dir("smollm3-3b") / "config.json").is_file()
