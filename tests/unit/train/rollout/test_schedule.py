"""The asynchronous schedule (pure): which weights generate which step's batch, what a batch
generated ahead may still train, its random stream and the staleness histogram."""

from __future__ import annotations

import pytest

from grpo_hpc.train.rollout.schedule import (
    Made,
    Plan,
    plan,
    rollout_seed,
    staleness_metrics,
    usable,
)


def _made(*triples: tuple[int, int, int]) -> list[Made]:
    return [Made(step, version, lineage) for step, version, lineage in triples]


@pytest.mark.parametrize(
    ("step", "k", "lineage", "made", "expected"),
    [
        # synchronous: nothing ahead, every step's batch made now by its own weights
        (0, 0, 0, [], Plan((), True, ())),
        (5, 0, 0, [], Plan((), True, ())),
        # k = 1, first step: batch 0 now, batch 1 while step 0 trains
        (0, 1, 0, [], Plan((), True, (1,))),
        # k = 1, steady: batch t was made during step t-1 (version t-1); t+1 ahead
        (4, 1, 0, _made((4, 3, 0)), Plan((), False, (5,))),
        # k = 2, first step: 1 and 2 ahead, both by version 0
        (0, 2, 0, [], Plan((), True, (1, 2))),
        # k = 2, steady: t and t+1 made (versions t-2, t-1), t+2 ahead
        (6, 2, 0, _made((6, 4, 0), (7, 5, 0)), Plan((), False, (8,))),
        # resumed with a smaller bound (k 2 -> 1): batch 7 of version 5 would be 2 stale
        (6, 1, 0, _made((6, 5, 0), (7, 5, 0)), Plan((7,), False, (7,))),
        # a batch 2 stale under k = 1: dropped and made again now
        (6, 1, 0, _made((6, 4, 0)), Plan((6,), True, (7,))),
        # after a rollback (lineage 0 -> 1) nothing of the abandoned line trains
        (6, 1, 1, _made((6, 5, 0)), Plan((6,), True, (7,))),
        # a batch of a step already trained, or of weights newer than these: dropped
        (6, 1, 0, _made((5, 4, 0), (6, 7, 0)), Plan((5, 6), True, (7,))),
        # a checkpoint of a synchronous run resumed with k = 1: nothing made yet
        (10, 1, 0, [], Plan((), True, (11,))),
    ],
)
def test_plan(step: int, k: int, lineage: int, made: list[Made], expected: Plan) -> None:
    assert plan(step, k, lineage, made) == expected


def test_nothing_is_generated_for_steps_the_run_will_not_train() -> None:
    """At the run's last steps the batches past ``training.max_steps`` are not made."""
    assert plan(8, 2, 0, _made((8, 6, 0), (9, 7, 0)), end=10) == Plan((), False, ())
    assert plan(7, 2, 0, _made((7, 5, 0), (8, 6, 0)), end=10) == Plan((), False, (9,))
    assert plan(0, 3, 0, [], end=2) == Plan((), True, (1,))


@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_run_that_follows_the_plan_trains_nothing_staler_than_k(k: int) -> None:
    """Carrying the plan out step by step (ahead batches take the current version):
    batch s comes from version max(s - k, 0), at most k stale, each made exactly once."""
    made: list[Made] = []
    generated: list[int] = []
    for step in range(12):
        p = plan(step, k, 0, made)
        made = [m for m in made if m.step not in p.drop]
        if p.now:
            made.append(Made(step, step, 0))
            generated.append(step)
        trained = next(m for m in made if m.step == step)
        assert trained.version == max(step - k, 0)
        assert step - trained.version <= k
        made = [m for m in made if m.step != step] + [Made(s, step, 0) for s in p.ahead]
        generated += p.ahead
    assert sorted(generated) == generated == list(range(12 + k))


def test_usable_is_the_bound() -> None:
    assert usable(Made(5, 3, 0), 4, 2, 0)
    assert not usable(Made(5, 3, 0), 4, 1, 0)  # 2 stale at its step under k = 1
    assert not usable(Made(5, 3, 0), 4, 2, 1)  # another line


def test_rollout_seed_is_a_function_of_seed_and_step() -> None:
    assert rollout_seed(0, 3) == rollout_seed(0, 3)
    seeds = {rollout_seed(s, t) for s in range(3) for t in range(50)}
    assert len(seeds) == 150  # no two (seed, step) share a stream
    assert all(0 <= s < 2**63 for s in seeds)  # what torch.manual_seed takes


def test_staleness_histogram_has_every_bucket_up_to_k() -> None:
    assert staleness_metrics(1, 8, 2) == {
        "staleness/0": 0.0,
        "staleness/1": 8.0,
        "staleness/2": 0.0,
        "staleness/max": 1.0,
    }
    # a broken bound shows as a bucket past k
    assert staleness_metrics(3, 8, 1)["staleness/3"] == 8.0
