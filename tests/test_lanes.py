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
