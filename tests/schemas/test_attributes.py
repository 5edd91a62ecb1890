"""Search attributes' pure checks (issue 31): what is accepted is stored as given (a datetime
as RFC 3339 text), anything else is ``InvalidAttributes``; the fold's merge is total and
bounded; a filter compares values by their text."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sojourn.schemas.attributes import (
    ATTRIBUTES_MAX,
    InvalidAttributes,
    attribute_text,
    merge_attributes,
    parse_attribute_args,
    parse_attribute_filter,
    validate_attributes,
    validate_filter,
)

keys = st.from_regex(r"[a-z][a-z0-9_]{0,63}", fullmatch=True)
values = (
    st.booleans()
    | st.integers(-(1 << 63), (1 << 63) - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=64)
)
good = st.dictionaries(keys, values, max_size=ATTRIBUTES_MAX)
anything: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=300),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


@given(good)
def test_valid_attributes_are_stored_as_given(attributes: dict[str, Any]) -> None:
    assert validate_attributes(attributes) == attributes


@given(st.dictionaries(st.text(max_size=70), anything, max_size=40))
def test_any_mapping_is_accepted_or_refused_never_crashes(attributes: dict[str, Any]) -> None:
    try:
        checked = validate_attributes(attributes, removals=True)
    except InvalidAttributes:
        return
    assert len(checked) <= ATTRIBUTES_MAX
    assert all(v is None or isinstance(v, str | int | float) for v in checked.values())


@given(good, st.dictionaries(st.text(max_size=8), anything, max_size=40))
def test_the_merge_is_total_and_bounded(current: dict[str, Any], update: dict[str, Any]) -> None:
    merged = merge_attributes(current, update)
    assert len(merged) <= ATTRIBUTES_MAX
    assert validate_attributes(merged) == merged
    for k, v in update.items():
        if v is None:
            assert k not in merged


@pytest.mark.parametrize(
    "attributes",
    [
        {f"k{i}": i for i in range(ATTRIBUTES_MAX + 1)},
        {"Upper": 1},
        {"1st": 1},
        {"a-b": 1},
        {"x" * 65: 1},
        {"s": "é" * 129},
        {"n": 1 << 63},
        {"f": float("inf")},
        {"l": [1]},
        {"o": {"a": 1}},
        {"none": None},
        {"naive": datetime(2026, 12, 5)},
    ],
)
def test_hostile_attributes_are_refused(attributes: dict[str, Any]) -> None:
    with pytest.raises(InvalidAttributes):
        validate_attributes(attributes)


def test_a_datetime_is_kept_as_rfc_3339_in_utc() -> None:
    when = datetime(2026, 12, 5, 11, 0, tzinfo=timezone(timedelta(hours=1)))
    assert validate_attributes({"due": when}) == {"due": "2026-12-05T10:00:00Z"}
    assert validate_attributes({"due": datetime(2026, 1, 1, tzinfo=UTC)})["due"] == (
        "2026-01-01T00:00:00Z"
    )


@given(values)
def test_a_filter_compares_by_text(value: Any) -> None:
    assert validate_filter({"k": value}) == {"k": attribute_text(value)}


def test_the_cli_forms() -> None:
    assert parse_attribute_args(["tier=3", "n:=3", "vip:=true", "s:=0.5"]) == {
        "tier": "3",
        "n": 3,
        "vip": True,
        "s": 0.5,
    }
    assert parse_attribute_filter(["vip=true", "n=3"]) == {"vip": "true", "n": "3"}
    for bad in (["novalue"], ["a=1", "a=2"], ["o:={}"], ["j:=nope"]):
        with pytest.raises(InvalidAttributes):
            parse_attribute_args(bad)
