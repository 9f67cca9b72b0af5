"""train/compile_pool.py: Inductor's real compile pool (its sidecar process) ended at a
step boundary; nothing to do where no pool runs (the CPU trainer's usual case: Inductor
compiles C++ kernels in-process)."""

from __future__ import annotations

import os

import pytest

from grpo_hpc.train.compile_pool import end_compile_workers


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_running_pool_is_ended_and_a_missing_one_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch._inductor.async_compile as ac
    from torch._inductor import config

    monkeypatch.setattr(config, "compile_threads", 2)
    end_compile_workers()  # whatever an earlier test in this process started
    assert end_compile_workers() is None  # none now: nothing to do
    pool = ac.AsyncCompile.process_pool()  # what a GPU compilation starts (Triton kernels)
    sidecar = pool.process.pid
    assert ac._pool_set and _alive(sidecar)
    took = end_compile_workers()
    assert took is not None and took >= 0.0
    assert not ac._pool_set
    pool.process.wait(10)  # reaped: shutdown waited for it to exit
    assert pool.process.returncode is not None
    assert end_compile_workers() is None
