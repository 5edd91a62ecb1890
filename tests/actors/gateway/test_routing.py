"""Routed webhooks' pure parts (issue 31): field paths (JSON pointer or dotted), the total
walk over any JSON value, the run id a body names, and the route's configuration."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sojourn.actors.gateway import parse_route
from sojourn.actors.gateway._routing import (
    RouteRefused,
    extract_field,
    parse_field_path,
    routed_run_id,
)

json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=12,
)
segments = st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=6)


@given(segments)
def test_a_pointer_round_trips_its_segments(parts: list[str]) -> None:
    pointer = "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)
    assert parse_field_path(pointer) == tuple(parts)


@given(json_values, segments)
def test_the_walk_is_total(value: Any, path: list[str]) -> None:
    extract_field(value, tuple(path))  # never raises


@given(json_values, segments, st.text(max_size=8))
def test_a_run_id_is_valid_or_refused_with_a_code(value: Any, path: list[str], prefix: str) -> None:
    if any(
        c not in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-" for c in prefix
    ):
        return
    try:
        routed_run_id(value, tuple(path), prefix, "p")
    except RouteRefused as e:
        assert e.code in ("missing_field", "invalid_run_id")


def test_paths_and_ids() -> None:
    body = {"data": {"object": {"id": "pi_1"}}, "items": [{"n": 7}]}
    assert routed_run_id(body, parse_field_path("/data/object/id"), "pay-", "x") == "pay-pi_1"
    assert routed_run_id(body, parse_field_path("items.0.n"), "", "x") == "7"
    assert extract_field(body, parse_field_path("items.1.n")) is None
    for bad in ("", "a..b", "/a//b", "/a~2", "x" * 300, ".".join("a" * 17)):
        with pytest.raises(ValueError):
            parse_field_path(bad)


def test_route_configuration() -> None:
    secret = "s" * 20
    start = parse_route(f"orders=stripe:{secret};start=order-flow;id=/data/object/id;prefix=o-")
    assert start.routed and start.start == "order-flow" and start.id_prefix == "o-"
    assert secret not in repr(start)
    sig = parse_route(f"ship=hmac-sha256:{secret};tolerance=60;signal=shipped;id=order.id")
    assert sig.signal == "shipped" and sig.tolerance == 60
    assert not parse_route(f"plain=github:{secret}").routed
    for bad in (
        f"r=stripe:{secret};start=a;signal=b;id=x",
        f"r=stripe:{secret};start=a",
        f"r=stripe:{secret};id=x",
        f"r=stripe:{secret};signal=sojourn-child;id=x",
        f"r=stripe:{secret};start=a;id=x;id=y",
        f"r=stripe:{secret};start=a;id=a..b",
        f"r=stripe:{secret};start=bad agent;id=x",
        f"r=stripe:{secret};start=a;id=x;prefix=no way",
    ):
        with pytest.raises(ValueError):
            parse_route(bad)
