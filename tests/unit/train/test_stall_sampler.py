"""train/stall_sampler.py with its real thread: a phase that runs long has the main
thread's stack sampled and written; phases at their usual pace cost nothing and write
nothing; warm-up runs set no baseline."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from grpo_hpc.train import stall_sampler
from grpo_hpc.train.profiling import phase
from grpo_hpc.train.stall_sampler import StallSampler, report, stack_of


def the_slow_part(seconds: float) -> None:
    time.sleep(seconds)


def test_a_long_phase_is_sampled_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sampler = StallSampler(tmp_path / "torch_profile", rank=1, every_s=0.01)
    stall_sampler.install(sampler)
    try:
        for step in range(1, 6):  # steps 1-3: no median yet; 4-5 at the usual pace
            sampler.step = step
            with phase("generate"):
                the_slow_part(0.6 if step == 1 else 0.02)  # a warm-up step is no stall
        out = tmp_path / "torch_profile" / "stalls-rank1.txt"
        assert not out.exists()
        sampler.step = 6
        with phase("generate"):
            with phase("save"):  # a phase inside another: the outer one is timed
                the_slow_part(0.5)
    finally:
        stall_sampler.install(None)
    text = out.read_text()
    head, first = text.splitlines()[:2]
    assert head.startswith("step 6 rank 1 grpo/generate: 0.5") and "median 0.02 s" in head
    assert "test_stall_sampler.py" in first and "the_slow_part" in first
    assert int(first.split("x")[0]) >= 10  # ~0.33 s sampled every 10 ms
    assert "[Stall] step 6 rank 1 grpo/generate" in capsys.readouterr().out
    assert stall_sampler.current() is None


def test_no_sampler_no_cost_and_report_is_pure() -> None:
    assert stall_sampler.current() is None
    with phase("update"):  # only the profiler range: nothing else to do
        pass
    stacks = Counter({"a.py:1 f <- b.py:2 g": 3, "c.py:3 h": 1})
    text = report(7, 0, "grpo/update", 1.5, 0.9, stacks)
    assert text.splitlines() == [
        "step 7 rank 0 grpo/update: 1.50 s (median 0.90 s), 4 samples",
        "     3x a.py:1 f <- b.py:2 g",
        "     1x c.py:3 h",
    ]
    import sys

    assert stack_of(sys._getframe(), 1).startswith("test_stall_sampler.py:")
