"""The bench's side of ``GRPO_HPC_EMULATE_GPU`` (a V100's decisions on a lent GPU): the
ladder's supercloud rows are planned as the trainer will run them (eager and unpacked, as on
a V100), a budget of another memory is refused before any row, and the stage's summary reads
what the trainer said it resolved."""

from __future__ import annotations

import argparse

import pytest
import torch

from bench.memory import emulated_summary, ladder
from bench.memory import ladder_plan as plan
from grpo_hpc.train.distributed import gpu

ARGS = argparse.Namespace(device="cuda", prompts=8, G=8, max_new=512, micro_tokens=4096)


@pytest.fixture
def h100(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.delenv(gpu.EMULATE_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    plan._capability.cache_clear()
    yield
    plan._capability.cache_clear()


def test_the_supercloud_rows_run_eager_under_the_switch(
    h100: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert plan.settings(ARGS, "supercloud", "full", 279).compiled_layers
    plan._capability.cache_clear()
    monkeypatch.setenv(gpu.EMULATE_ENV, "7.0:32")
    assert not plan.settings(ARGS, "supercloud", "full", 279).compiled_layers


def test_a_budget_of_another_memory_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gpu.EMULATE_ENV, "7.0:32")
    assert ladder.emulated_gpu(["supercloud"]) == "7.0:32"
    with pytest.raises(SystemExit, match="leave out the budgets of another cap \\(h100\\)"):
        ladder.emulated_gpu(["h100", "supercloud"])
    monkeypatch.setenv(gpu.EMULATE_ENV, "V100")
    with pytest.raises(SystemExit, match="expected CAPABILITY:GIB"):
        ladder.emulated_gpu(["supercloud"])
    monkeypatch.delenv(gpu.EMULATE_ENV)
    assert ladder.emulated_gpu(["h100"]) is None


LINES = [
    "[Device] GRPO_HPC_EMULATE_GPU=7.0:32: every decision is made for compute capability 7.0 "
    "on the real NVIDIA H200 (compute capability 9.0, 139.8 GiB), its allocator capped at "
    "32 GiB; the kernels are the real GPU's",
    "[Eval] step 0: greedy accuracy 0.010 (3/256), with an answer line 0.010 (12 s)",
    "[Speed] dist.compile=false (auto), algo.packing=false (auto), "
    "dist.deterministic_kernels=true, rollout: native (llama)",
    "[Kernels] dist.precision=fp16 with the grad scaler; update attention sdpa; native decode: "
    "compiled layers, CUDA graphs, matrix-product attention (compute capability 7.0)",
]


def _step(step: int, t: float, reward: float, mem: float) -> dict:
    return {"step": step, "time/step": t, "time/generate": 1.0, "time/train": t - 1,
            "reward/mean": reward, "reward/correctness": reward, "gpu_mem_gb": mem,
            "gen_len/mean": 300.0}  # fmt: skip


def test_the_summary_says_what_the_trainer_resolved() -> None:
    rows = [{"step": 0, "eval/accuracy": 0.01}]
    rows += [_step(i, 20.0 if i == 1 else 5.0, 0.1 * i, 9.0 + i / 10) for i in range(1, 11)]
    rows += [{"step": 10, "eval/accuracy": 0.05}]
    s = emulated_summary.summarize(rows, LINES, 32.0)
    assert s["resolved"] == {
        "emulated": "7.0:32",
        "real_gpu": "NVIDIA H200",
        "precision": "fp16",
        "update_attention": "sdpa",
        "decode": "native decode: compiled layers, CUDA graphs, matrix-product attention",
        "capability": "7.0",
        "compile": "false",
        "packing": "false",
        "micro_batch_tokens": None,  # given, not auto: [Speed] does not say it
        "engine": "rollout: native (llama)",
        "grad_scaler": True,
    }
    assert s["steps"] == 10 and s["peak_gib"] == 10.0 and s["within_cap"] is True
    assert s["median_s"]["time/step"] == 5.0  # the first (warm-up) step left out
    assert s["eval_accuracy"] == {"0": 0.01, "10": 0.05}
    assert s["reward_mean_first5"] == 0.3 and s["reward_mean_last5"] == 0.8
    assert len(s["lines"]) == 3


def test_a_run_that_died_before_its_first_step_still_summarizes() -> None:
    s = emulated_summary.summarize([], [], None)
    assert s["steps"] == 0 and s["peak_gib"] is None and s["gen_len_first_last"] is None
    assert s["resolved"]["grad_scaler"] is None
