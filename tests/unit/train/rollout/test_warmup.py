"""``algo.synchronous_steps`` (an asynchronous run's first steps trained synchronously),
its pure parts: which steps are warming, the staleness each step's batch then has under
the thread placement's and the grouped schedule, what the config refuses, and the
``placement:`` line of ``grpo-submit --dry-run``. The real trainer runs it in
tests/e2e/test_async.py and tests/e2e/test_async_grouped.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_hpc.config.load import build_config
from grpo_hpc.config.validate import warmup_problem
from grpo_hpc.core.errors import ConfigError, ExitCode
from grpo_hpc.train.rollout.schedule import Made, grouped_plan, plan, warming

from ...submit.test_preflight import _grpo_submit as grpo_submit


def test_the_first_steps_generate_nothing_ahead() -> None:
    """N synchronous steps: steps 0 .. N - 2 (0-based) make nothing ahead; step N - 1
    starts the bound's work, so step N trains the first stale batch. 0 and 1 change
    nothing (the first step's batch is always its own)."""
    assert [warming(s, 3) for s in range(5)] == [True, True, False, False, False]
    assert not any(warming(s, n) for s in range(5) for n in (0, 1))


def _thread_staleness(k: int, n: int, steps: int) -> list[int]:
    """The staleness of each step's batch when the pipeline follows :func:`plan` with the
    warm-up's depth, as ``RolloutPipeline.collect`` does."""
    made: dict[int, Made] = {}
    out = []
    for step in range(steps):
        decision = plan(step, k, 0, list(made.values()), steps, 0 if warming(step, n) else None)
        for s in decision.drop:
            del made[s]
        batch = Made(step, step, 0) if decision.now else made.pop(step)
        out.append(batch.step - batch.version)
        for s in decision.ahead:
            made[s] = Made(s, step, 0)
    return out


def _grouped_staleness(k: int, m: int, n: int, steps: int) -> list[int]:
    """The same under :func:`grouped_plan` (``rollout.steps_per_generation=m``)."""
    made: dict[int, Made] = {}
    out = []
    for step in range(steps):
        depth = 0 if warming(step, n) else None
        decision = grouped_plan(step, k, m, 0, list(made.values()), steps, depth)
        if decision.now:
            for s in (step, *decision.ahead):
                made[s] = Made(s, step, 0)
        batch = made.pop(step)
        out.append(batch.step - batch.version)
    return out


@pytest.mark.parametrize(
    ("k", "n", "expected"),
    [
        (1, 0, [0, 1, 1, 1, 1, 1]),
        (1, 3, [0, 0, 0, 1, 1, 1]),
        (2, 3, [0, 0, 0, 1, 2, 2]),
        (2, 1, [0, 1, 2, 2, 2, 2]),  # 1: as 0
    ],
)
def test_the_thread_schedule_trains_the_first_n_steps_at_staleness_0(
    k: int, n: int, expected: list[int]
) -> None:
    assert _thread_staleness(k, n, 6) == expected


@pytest.mark.parametrize(
    ("m", "n", "expected"),
    [
        (2, 0, [0, 1, 0, 1, 0, 1]),
        (2, 2, [0, 0, 1, 0, 1, 0]),
        (3, 3, [0, 0, 0, 1, 2, 0]),
    ],
)
def test_the_grouped_schedule_starts_its_groups_after_the_first_n_steps(
    m: int, n: int, expected: list[int]
) -> None:
    assert _grouped_staleness(m - 1, m, n, 6) == expected


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["algo.max_staleness=1", "algo.synchronous_steps=10"], None),
        (["algo.max_staleness=0", "algo.synchronous_steps=0"], None),
        (["algo.max_staleness=0", "algo.synchronous_steps=1"], None),  # nothing to warm
        (["algo.max_staleness=1", "algo.synchronous_steps=-1"], "must be >= 0"),
        (["algo.synchronous_steps=5"], "needs algo.max_staleness >= 1"),
        (["algo.max_staleness=2", "rollout.partial_pool=2", "algo.synchronous_steps=5"], None),
    ],
)
def test_what_the_warm_up_refuses(overrides: list[str], says: str | None) -> None:
    if says is None:
        cfg = build_config("tiny", overrides)
        assert warmup_problem(cfg) is None
        return
    with pytest.raises(ConfigError, match=says):
        build_config("tiny", overrides)


def test_dry_run_names_the_synchronous_first_steps(tmp_path: Path) -> None:
    """Through the installed grpo-submit: the ``placement:`` line says the run's first
    steps are synchronous; without the setting it says nothing of them."""
    env = {"GRPO_HPC_LOGS": str(tmp_path / "logs")}
    args = ("--profile", "local", "--config", "tiny", "--dry-run", "algo.max_staleness=1")
    warm = grpo_submit(*args, "algo.synchronous_steps=10", env=env)
    assert warm.returncode == ExitCode.OK, warm.stderr
    [line] = [x for x in warm.stdout.splitlines() if x.startswith("placement: ")]
    assert line.endswith("; its first 10 steps synchronous (algo.synchronous_steps=10)")
    plain = grpo_submit(*args, env=env)
    [line] = [x for x in plain.stdout.splitlines() if x.startswith("placement: ")]
    assert "synchronous" not in line
