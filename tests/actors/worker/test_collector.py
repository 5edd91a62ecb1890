"""The collector tuning a worker holds while it runs (``actors/worker/collector.py``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from sojourn.actors.worker import collector
from sojourn.actors.worker.collector import YOUNG_THRESHOLD, CollectorTuning


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No holder in this process (whatever other tests left) and CPython's default
    thresholds; put back afterwards."""
    before = gc.get_threshold()
    monkeypatch.setattr(collector, "_holders", 0)
    monkeypatch.setattr(collector, "_saved", None)
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def test_a_held_tuning_raises_the_young_threshold_and_its_release_puts_it_back() -> None:
    t = CollectorTuning()
    t.hold()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() == 0  # nothing frozen: gc.get_objects() sees everything
    t.release()
    assert gc.get_threshold() == (700, 10, 10)


def test_the_last_worker_to_stop_puts_the_thresholds_back() -> None:
    a, b = CollectorTuning(), CollectorTuning()
    a.hold()
    b.hold()
    a.hold()  # twice: held once
    a.release()
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD  # b still runs
    a.release()  # released already: nothing
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD
    b.release()
    assert gc.get_threshold() == (700, 10, 10)


def test_a_disabled_tuning_or_an_application_s_own_settings_are_left_alone() -> None:
    off = CollectorTuning(enabled=False)
    off.hold()
    assert gc.get_threshold() == (700, 10, 10)
    off.release()
    gc.set_threshold(0, 10, 10)  # automatic collection turned off: so it stays
    on = CollectorTuning()
    on.hold()
    assert gc.get_threshold() == (0, 10, 10)
    on.release()
    gc.set_threshold(50_000, 20, 10)  # higher already: kept
    on.hold()
    assert gc.get_threshold() == (50_000, 20, 10)
    on.release()
    assert gc.get_threshold() == (50_000, 20, 10)


def test_a_release_without_a_hold_changes_nothing() -> None:
    CollectorTuning().release()
    assert gc.get_threshold() == (700, 10, 10)
