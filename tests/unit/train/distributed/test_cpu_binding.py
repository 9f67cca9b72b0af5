"""dist.bind_cpus: how a node's CPUs are shared between its ranks (pure), and the binding
itself on this machine (the trainer's run with it: tests/e2e/test_trainer_behaviour.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from grpo_hpc.train.distributed.cpu_binding import cores, cpu_list, parse_cpu_list, share

# 4 physical cores with 2 hardware threads each, numbered as Linux often does: 0-3, 4-7
SMT = {c: [c % 4, c % 4 + 4] for c in range(8)}


def test_cpu_lists_read_and_write_the_kernel_format() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert cpu_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert cpu_list([5]) == "5"


def test_siblings_stay_together_and_ranks_get_whole_cores() -> None:
    assert cores(range(8), SMT) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert share(range(8), SMT, 0, 2) == [0, 4, 1, 5]
    assert share(range(8), SMT, 1, 2) == [2, 6, 3, 7]


def test_uneven_splits_give_the_first_ranks_one_core_more() -> None:
    shares = [share(range(5), {}, r, 3) for r in range(3)]
    assert shares == [[0, 1], [2, 3], [4]]


def test_fewer_cores_than_ranks_splits_logical_cpus_and_too_few_cpus_binds_nothing() -> None:
    one_core = {0: [0, 1], 1: [0, 1]}
    assert [share([0, 1], one_core, r, 2) for r in (0, 1)] == [[0], [1]]
    assert share([0, 1], {}, 1, 3) == [0, 1]  # 2 CPUs, 3 ranks: nothing to split
    assert share([3, 9], {}, 0, 1) == [3, 9]  # one rank keeps everything


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_binding_moves_the_process_and_its_children() -> None:
    """The real call in a child process: its affinity, and a grandchild's, is the share."""
    show = "import os; print(sorted(os.sched_getaffinity(0)))"
    code = (
        "import os, subprocess, sys; from grpo_hpc.train.distributed.cpu_binding import bind;"
        f"print(bind(True)); {show};"
        f"print(subprocess.run([sys.executable, '-c', {show!r}], capture_output=True,"
        " text=True).stdout.strip())"
    )
    allowed = sorted(os.sched_getaffinity(0))
    env = {**os.environ, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    line, mine, grandchild = out.stdout.strip().splitlines()
    assert line.startswith("[Dist] local rank 1 of 2 bound to CPUs ")
    if len(allowed) >= 2:
        assert mine == grandchild and mine != str(allowed)
        assert set(json.loads(mine)) < set(allowed)
    off = subprocess.run(
        [
            sys.executable,
            "-c",
            "from grpo_hpc.train.distributed.cpu_binding import bind; print(bind(False))",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert off.stdout.strip() == "None"
