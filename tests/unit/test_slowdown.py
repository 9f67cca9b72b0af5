"""The suite's stretch of its time bounds on a slow machine (tests/slowdown.py)."""

from __future__ import annotations

import pytest

from tests import slowdown


@pytest.mark.parametrize(
    ("import_s", "factor"),
    [(0.8, 1.0), (2.0, 1.0), (3.0, 1.5), (4.2, 2.1), (10.0, 5.0), (60.0, 5.0)],
)
def test_factor_is_the_import_time_over_the_reference_between_one_and_the_cap(
    import_s: float, factor: float
) -> None:
    assert slowdown.factor_from(import_s) == factor


def test_bounds_stretch_by_the_factor_passed_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(slowdown.ENV, "2.5")
    assert slowdown.scaled(40) == 100.0
    assert slowdown.guard(40) == 40 * slowdown.GUARD_FLOOR  # a guard: never below the floor
    monkeypatch.setenv(slowdown.ENV, "4.5")
    assert slowdown.scaled(40) == slowdown.guard(40) == 180.0
    monkeypatch.delenv(slowdown.ENV)
    assert slowdown.scaled(40) == 40.0


def test_this_session_measured_its_factor() -> None:
    """The root conftest measured before any test ran (or the caller set the variable)."""
    assert 1.0 <= slowdown.factor() <= slowdown.MAX_FACTOR
