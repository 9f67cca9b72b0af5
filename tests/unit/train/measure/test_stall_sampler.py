"""train/measure/stall_sampler.py with its real thread: a phase that runs long has the main
thread's stack sampled and written; phases at their usual pace cost nothing and write
nothing; warm-up runs set no baseline."""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

import pytest

from grpo_hpc.train.measure import stall_sampler
from grpo_hpc.train.measure.profiling import phase
from grpo_hpc.train.measure.stall_sampler import StallSampler, report, stack_of

SLACK_S = 0.5
"""The sampler's slack in these tests (the product's is 0.15 s): a usual-pace phase of
20 ms is taken for a stall only if the machine delays it by half a second."""


def the_slow_part(seconds: float, until=lambda: True) -> None:
    """Sleep ``seconds``, then on until ``until()`` holds."""
    end = time.monotonic() + seconds
    while time.monotonic() < end or not until():
        time.sleep(0.005)


def _samples(sampler: StallSampler) -> int:
    with sampler._lock:
        return sum(sampler._stacks.values())


def test_a_long_phase_is_sampled_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stall_sampler, "SLACK_S", SLACK_S)
    sampler = StallSampler(tmp_path / "torch_profile", rank=1, every_s=0.01)
    stall_sampler.install(sampler)
    try:
        for step in range(1, 6):  # steps 1-3: no median yet; 4-5 at the usual pace
            sampler.step = step
            with phase("generate"):
                # a warm-up step is no stall, though past what the median would allow
                the_slow_part(SLACK_S + 0.3 if step == 1 else 0.02)
        out = tmp_path / "torch_profile" / "stalls-rank1.txt"
        assert not out.exists()
        sampler.step = 6
        with phase("generate"):
            with phase("save"):  # a phase inside another: the outer one is timed
                # past the slack, and on until the sampler has taken ten samples
                the_slow_part(SLACK_S, until=lambda: _samples(sampler) >= 10)
    finally:
        stall_sampler.install(None)
    text = out.read_text()
    head, first = text.splitlines()[:2]
    m = re.fullmatch(
        r"step 6 rank 1 grpo/generate: ([0-9.]+) s \(median ([0-9.]+) s\), (\d+) samples", head
    )
    assert m, head
    took, usual, samples = float(m[1]), float(m[2]), int(m[3])
    assert usual < 0.3 and took >= SLACK_S and samples >= 10  # the usual pace, not the warm-up's
    assert "test_stall_sampler.py" in first and "the_slow_part" in first
    # the most common distinct stacks (at most TOP), each with its count of the samples
    counts = [int(ln.split("x")[0]) for ln in text.splitlines()[1:]]
    assert 0 < len(counts) <= stall_sampler.TOP and sum(counts) <= samples
    assert counts == sorted(counts, reverse=True)
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
