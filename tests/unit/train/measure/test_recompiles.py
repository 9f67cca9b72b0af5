"""The trainer's record of torch.compile's graphs (a recompilation makes a step slow): the
counter it reads, and the training-log line a recompilation after warm-up gets."""

from __future__ import annotations

import torch

from grpo_hpc.train.measure.tracking import (
    WARMUP_STEPS,
    compiled_graphs,
    recompile_line,
    recompile_reasons,
)


def test_the_counter_grows_when_a_new_shape_recompiles() -> None:
    before = compiled_graphs()
    torch._dynamo.reset()
    f = torch.compile(lambda x: x * 2 + 1, backend="eager", dynamic=False)
    f(torch.ones(3))
    once = compiled_graphs()
    f(torch.ones(3))  # same shape: no new graph
    assert compiled_graphs() == once > before
    seen = len(recompile_reasons())
    f(torch.ones(5))  # a new static shape: a recompilation
    assert compiled_graphs() == once + 1
    why = recompile_reasons()[seen:]  # Dynamo's own guard failure names the shape
    assert len(why) == 1 and "<lambda>" in why[0] and "size mismatch" in why[0], why


def test_a_line_only_for_new_graphs_after_warm_up() -> None:
    assert recompile_line(WARMUP_STEPS, 3, 9) is None  # warm-up builds its graphs
    assert recompile_line(WARMUP_STEPS + 1, 9, 9) is None  # steady
    line = recompile_line(WARMUP_STEPS + 3, 9, 11)
    assert line is not None and "step 5" in line and "2 new graph(s)" in line
    assert "(11 in all)" in line


def test_the_line_names_why() -> None:
    why = [f"forward (models.py:{i}): tensor 'x' size mismatch" for i in range(3)]
    line = recompile_line(WARMUP_STEPS + 1, 9, 10, why)
    assert line is not None and "why: forward (models.py:0)" in line
    assert "models.py:1" in line and "models.py:2" not in line and "(+1 more)" in line


def test_in_a_multi_rank_job_the_line_names_the_rank_that_recompiled() -> None:
    """Only the rank that met the new shape holds Dynamo's reason; it prints its own line
    (rank 0 alone printed the job's count, without a reason, when rank 1 recompiled)."""
    line = recompile_line(WARMUP_STEPS + 5, 18, 20, ["chunk_stats (logp_head.py:58): x"], rank=1)
    assert line is not None and line.startswith(f"[Compile] step {WARMUP_STEPS + 5} (rank 1):")
    assert "why: chunk_stats" in line
    assert "(rank" not in (recompile_line(WARMUP_STEPS + 5, 18, 20) or "")
