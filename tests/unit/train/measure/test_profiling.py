"""training.profile_steps: which steps run under torch.profiler, and where their files go;
the real profiler on the CPU (the trainer's own run: tests/e2e/test_trainer_behaviour.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from grpo_hpc.train.measure.profiling import (
    THREAD_GROUPS,
    StepProfiler,
    group_times,
    names,
    thread_clock,
    thread_group,
    window,
)


def test_the_window_counts_logged_steps_from_profile_from() -> None:
    assert list(window(3, 2)) == [3, 4]
    assert list(window(1, 1)) == [1]
    assert list(window(5, 0)) == []  # off
    trace, summary = names(Path("/r/torch_profile"), 1, window(3, 2))
    assert (trace.name, summary.name) == ("rank1-steps3-4.json", "rank1-steps3-4.txt")


def _steps(prof: StepProfiler, first: int, last: int) -> None:
    w = torch.ones(64, 64)
    for step in range(first, last + 1):
        prof.before_step(step)
        (w @ w).sum()
        prof.after_step(step)


def _matmuls(trace: Path) -> int:
    return sum(e.get("name") == "aten::mm" for e in json.loads(trace.read_text())["traceEvents"])


def test_only_the_window_is_recorded_and_written(tmp_path: Path) -> None:
    prof = StepProfiler(tmp_path / "torch_profile", 0, window(2, 2), cuda=False)
    _steps(prof, 1, 1)
    assert not (tmp_path / "torch_profile").exists()  # step 1 is not profiled
    _steps(prof, 2, 3)
    trace, summary = names(tmp_path / "torch_profile", 0, window(2, 2))
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(e.get("name") == "aten::mm" for e in events) == 2  # steps 2 and 3
    assert "aten::mm" in summary.read_text()
    _steps(prof, 4, 5)  # after the window: nothing more
    assert (
        sum(e.get("name") == "aten::mm" for e in json.loads(trace.read_text())["traceEvents"]) == 2
    )


def test_a_run_that_ends_inside_the_window_still_writes_it(tmp_path: Path) -> None:
    prof = StepProfiler(tmp_path, 3, window(1, 5), cuda=False)
    _steps(prof, 1, 2)
    prof.close()
    trace, _ = names(tmp_path, 3, window(1, 5))
    assert trace.is_file()
    prof.close()  # twice: nothing left to write


def test_a_bad_window_is_refused_in_one_line() -> None:
    from grpo_hpc.config.load import build_config
    from grpo_hpc.core.errors import ConfigError

    with pytest.raises(ConfigError, match="training.profile_from=0 >= 1"):
        build_config("tiny", ["training.profile_steps=2", "training.profile_from=0"])


def test_phase_lines_name_each_phase_once_with_its_cpu_range() -> None:
    """On a GPU the profiler lists a range twice (the CPU range, and its annotation on the
    device's timeline with no CPU time): each phase is one line, with the CPU range's time;
    other operators are left out."""
    from types import SimpleNamespace as E

    from grpo_hpc.train.measure.profiling import phase_lines

    averages = [
        E(key="grpo/update", count=1, cpu_time_total=1_433_300.0),
        E(key="grpo/update", count=1, cpu_time_total=0.0),
        E(key="grpo/generate", count=1, cpu_time_total=0.0),
        E(key="grpo/generate", count=1, cpu_time_total=497_800.0),
        E(key="aten::mm", count=9, cpu_time_total=5.0),
    ]
    lines = phase_lines(averages).splitlines()
    assert lines[0] == "== the step's phases, this rank"
    assert [ln.split()[0] for ln in lines[1:] if ln] == ["grpo/generate", "grpo/update"]
    assert "497.8 ms" in lines[1] and "1433.3 ms" in lines[2]


def _work(cpu_s: float) -> None:
    """Spin until this thread has run ``cpu_s`` CPU seconds (by its own clock, so a
    machine loaded by other tests only stretches the wall)."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


def test_the_thread_clock_tells_work_from_waiting() -> None:
    with thread_clock() as busy:
        _work(0.15)  # this thread works
    with thread_clock() as idle:
        time.sleep(0.2)  # this thread waits
    assert busy.wall_s >= 0.15 and busy.cpu_s > 0.14
    assert busy.process_cpu_s >= busy.cpu_s - 0.01  # the process counts this thread too
    assert idle.wall_s >= 0.2 and idle.cpu_s < 0.05


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux's CPU affinity")
def test_descheduled_counts_the_kernel_taking_the_core_away() -> None:
    """This thread and a spinning child pinned to one core: the kernel must take the core
    from one to give it to the other, so the block's count of involuntary switches is
    positive (a count that was always 0, or negative, would fail here)."""
    import subprocess
    import sys

    cpu = min(os.sched_getaffinity(0))
    saved = os.sched_getaffinity(0)
    spin = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nprint(flush=True)\nwhile True: pass"
    child = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"\n"  # pinned, and about to spin
        os.sched_setaffinity(0, {cpu})  # this thread only
        with thread_clock() as shared:
            _work(0.2)  # 0.2 CPU seconds on a core the child wants all of
    finally:
        os.sched_setaffinity(0, saved)
        child.kill()
        child.wait()
    assert shared.cpu_s > 0.19 and shared.descheduled > 0


def test_the_process_clock_counts_the_work_of_other_threads() -> None:
    """As autograd's device thread runs the backward while the caller waits in it."""
    import threading

    with thread_clock() as waiting:
        worker = threading.Thread(target=_work, args=(0.15,))
        worker.start()
        worker.join()
    assert waiting.cpu_s < 0.05 and waiting.process_cpu_s > 0.1


def test_thread_groups_sort_a_process_threads() -> None:
    assert thread_group(7, "python3", main=7, python={7, 9}) == "main"
    assert thread_group(8, "pt_autograd_0", main=7, python={7, 9}) == "autograd"
    assert thread_group(9, "python3", main=7, python={7, 9}) == "python"
    assert thread_group(10, "cuda-EvtHandlr", main=7, python={7, 9}) == "native"


def test_group_times_count_a_thread_born_meanwhile_from_zero() -> None:
    before = {7: (1_000_000_000, 0)}
    after = {7: (1_500_000_000, 2_000_000), 8: (300_000_000, 0)}
    names = {7: "python3", 8: "pt_autograd_0"}
    cpu, waited = group_times(before, after, names, main=7, python={7})
    assert cpu == {"main": 0.5, "autograd": 0.3, "python": 0.0, "native": 0.0}
    assert waited["main"] == 0.002 and sum(waited.values()) == 0.002


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux's per-thread schedstat")
def test_the_thread_clock_names_the_thread_that_worked() -> None:
    """A Python thread that spins while the caller waits shows under ``python``, the
    caller's own share under ``main``, as the rusage clock has it. (A thread must still
    live when the block ends to be counted: a finished one has left ``/proc``.)"""
    import threading

    spun, release = threading.Event(), threading.Event()

    def spin() -> None:
        _work(0.2)
        spun.set()
        release.wait()

    with thread_clock() as clock:
        worker = threading.Thread(target=spin, name="spinner")
        worker.start()
        spun.wait()
    release.set()
    worker.join()
    assert 0.19 < clock.by_group["python"] < 0.25  # the spinner, born inside the block
    assert clock.by_group["main"] < 0.05
    assert sum(clock.by_group.values()) <= clock.wall_s * 2 + 0.05  # at most two busy
    assert set(clock.waited_s) == set(THREAD_GROUPS) and min(clock.waited_s.values()) >= 0


def test_a_clock_names_its_metrics_as_a_step_logs_them() -> None:
    from grpo_hpc.train.measure.profiling import ThreadClock

    clock = ThreadClock(wall_s=0.3, cpu_s=0.1, process_cpu_s=0.35, descheduled=2)
    clock.by_group = {"main": 0.1, "autograd": 0.2, "python": 0.0, "native": 0.05}
    clock.waited_s = {"main": 0.001, "autograd": 0.002, "python": 0.0, "native": 0.0}
    m = clock.metrics("train", sync_s=0.01)
    assert m["time/train"] == 0.31 and m["time/train_sync"] == 0.01
    assert m["time/train_cpu"] == 0.35 and m["time/train_cpu_main"] == 0.1  # rusage's
    assert (m["time/train_cpu_autograd"], m["time/train_cpu_native"]) == (0.2, 0.05)
    assert m["time/train_waited"] == 0.003 and m["time/train_waited_main"] == 0.001
    assert m["train/descheduled"] == 2.0
    bare = ThreadClock(wall_s=0.3).metrics("train")  # no schedstat: no group or wait keys
    assert not any("waited" in k or "autograd" in k for k in bare)
