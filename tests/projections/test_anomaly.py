"""Anomaly baselines: the tool-call rate and history length of an agent against its own past."""

from __future__ import annotations

import pytest

from sojourn.projections.anomaly import HistoryBaseline, RateBaseline

HOUR = 3600.0
NOW = 10_000_000.0


def steady(rb: RateBaseline, per_minute: int, start: float, end: float) -> None:
    t = start
    while t < end:
        rb.add(t, per_minute)
        t += 60


def test_no_baseline_until_half_an_hour_of_history_outside_the_last_hour() -> None:
    rb = RateBaseline()
    steady(rb, 6, NOW - 80 * 60, NOW)  # 80 minutes of history: 20 usable minutes
    assert rb.baseline(NOW) is None and rb.ratio(NOW) is None
    steady(rb, 6, NOW - 2 * HOUR, NOW - 80 * 60)
    assert rb.baseline(NOW) == pytest.approx(0.1)  # 6 a minute
    assert rb.rate(NOW) == pytest.approx(0.1, rel=0.25)
    assert rb.ratio(NOW) == pytest.approx(1.0, rel=0.25)


def test_a_spike_shows_as_a_ratio_and_is_not_its_own_baseline() -> None:
    rb = RateBaseline()
    steady(rb, 6, NOW - 24 * HOUR, NOW - 10 * 60)
    steady(rb, 120, NOW - 10 * 60, NOW)  # the last 10 minutes: 20x
    ratio = rb.ratio(NOW)
    assert ratio is not None and 15 < ratio < 25
    assert rb.baseline(NOW) == pytest.approx(0.1, rel=0.05)


def test_old_minutes_are_pruned() -> None:
    rb = RateBaseline()
    steady(rb, 1, NOW - 30 * HOUR, NOW)
    rb.prune(NOW)
    assert min(rb.minutes) >= int((NOW - 24 * HOUR) // 60) - 1


def test_history_baseline_needs_a_few_completed_runs() -> None:
    hb = HistoryBaseline()
    for _ in range(4):
        hb.add(20)
    assert hb.value is None and hb.ratio(200) is None
    hb.add(20)
    assert hb.value == pytest.approx(20)
    assert hb.ratio(200) == pytest.approx(10)
