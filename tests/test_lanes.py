"""The fast lane's properties run a quarter of their examples; the whole suite runs them all
(``tests/conftest.py``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import FAST_LANE_EXAMPLES, FAST_LANE_MIN_EXAMPLES, _is_fast_lane

ran: list[int] = []


@settings(max_examples=200, database=None)
@given(st.integers())
def test_a_property_of_200_examples(x: int) -> None:
    ran.append(x)


@settings(max_examples=12, database=None)
@given(st.integers())
def test_a_small_property_keeps_its_floor(x: int) -> None:
    pass


def test_the_examples_a_property_runs_follow_the_lane(request: pytest.FixtureRequest) -> None:
    fast = _is_fast_lane(request.config)
    big = test_a_property_of_200_examples._hypothesis_internal_use_settings.max_examples  # type: ignore[attr-defined]
    small = test_a_small_property_keeps_its_floor._hypothesis_internal_use_settings.max_examples  # type: ignore[attr-defined]
    assert big == (200 // FAST_LANE_EXAMPLES if fast else 200)
    assert small == (max(FAST_LANE_MIN_EXAMPLES, 12 // FAST_LANE_EXAMPLES) if fast else 12)


class _Item:
    def __init__(self, server: bool) -> None:
        self.server = server

    def get_closest_marker(self, name: str) -> object:
        return object() if name == "server" and self.server else None


def test_a_whole_suite_with_an_empty_lane_is_refused() -> None:
    from tests.conftest import _both_lanes_hold

    _both_lanes_hold([_Item(True), _Item(False)])  # type: ignore[list-item]
    for one_lane in ([_Item(True)] * 3, [_Item(False)] * 3, []):
        with pytest.raises(pytest.UsageError, match="a test lane is empty"):
            _both_lanes_hold(one_lane)  # type: ignore[arg-type]


class _Timed:
    def __init__(self, name: str, seconds: float | None, bare: bool = False) -> None:
        self.nodeid = name
        self.seconds = seconds
        self.bare = bare

    def get_closest_marker(self, name: str) -> object:
        if name != "slow":
            return None
        if self.bare:
            return pytest.mark.slow.mark
        return None if self.seconds is None else pytest.mark.slow(self.seconds).mark


def test_slow_tests_start_first_each_workers_share_at_the_start_of_its_block() -> None:
    from tests.conftest import _slow_first

    quick = [_Timed(f"q{i}", None) for i in range(20)]
    slow = [_Timed("s100", 100), _Timed("s60", 60), _Timed("s50", 50), _Timed("s20", 20)]
    items = [*quick[:7], slow[0], *quick[7:15], *slow[1:], *quick[15:]]
    order = [it.nodeid for it in _slow_first(items, 2)]  # type: ignore[arg-type]
    assert sorted(order) == sorted(it.nodeid for it in items) and len(order) == 24
    # xdist's first blocks: 12 and 12. Longest first to the least loaded: 100 to the first,
    # 60 and 50 to the second (60 < 100), 20 to the first (100 < 110).
    assert order[:3] == ["s100", "s20", "q0"]
    assert order[12:15] == ["s60", "s50", "q10"]
    assert [n for n in order if n.startswith("q")] == [f"q{i}" for i in range(20)]
    serial = [it.nodeid for it in _slow_first(items, 1)]  # type: ignore[arg-type]
    assert serial[:4] == ["s100", "s60", "s50", "s20"]
    with pytest.raises(pytest.UsageError, match="slow\\(seconds\\)"):
        _slow_first([_Timed("bare", None, bare=True), *items], 2)  # type: ignore[list-item]
