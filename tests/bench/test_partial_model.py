"""bench/speed/partial_model.py on distributions whose answer is known: every row to the cap
(a pool of P steps finishes a step's groups every cap / P passes, each group P updates
stale, the same tokens decoded as the synchronous step) and every row short (rounds end
with their rows, as the synchronous step does: nothing continued, nothing prefilled again,
and the groups beyond a step's still wait a round in the pool)."""

from __future__ import annotations

import pytest

from bench.speed import partial_model as pm

CAP, CHECK = 64, 8


@pytest.mark.parametrize("pool", [2, 4])
def test_rows_that_all_run_to_the_cap_pipeline_through_the_pool(pool: int) -> None:
    targets = [CAP + 1]  # no EOS: every row to the cap
    sim = pm.simulate(12, pool, pool, cap=CAP, prompts=2, g=2, targets=targets, check_every=CHECK)
    kept = pm.per_step(sim["rounds"], skip=pool)
    sync = pm.per_step(pm.synchronous(12, cap=CAP, rows=4, targets=targets, check_every=CHECK), 0)
    assert sync["passes"] == CAP and sync["row_steps"] == 4 * CAP
    assert kept["passes"] == CAP / pool and kept["row_steps"] == sync["row_steps"]
    assert sim["staleness"][pool * 2 :] == [pool] * (len(sim["staleness"]) - pool * 2)
    assert sim["dropped"] == 0 and sim["continued"] > 0


def test_short_rows_end_with_their_round() -> None:
    targets = [3, 5, 7]  # every row within the first host check
    sim = pm.simulate(8, 2, 2, cap=CAP, prompts=2, g=2, targets=targets, check_every=CHECK)
    kept = pm.per_step(sim["rounds"], skip=2)
    assert kept["passes"] <= 7 and kept["reprefill_tokens"] == 0 and sim["continued"] == 0
    # the pool still holds 2 steps' groups: the complete ones beyond a step's wait a round,
    # 2 updates stale, though none was continued (docs/async.md, "Partial rollouts")
    assert sim["staleness"][4:] == [2] * (len(sim["staleness"]) - 4)
