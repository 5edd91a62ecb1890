"""Fairness keys and weights (``schemas/fairness.py``, decision 0049): what a key and a weight
may be, the headers that carry them, the intake's strict reading (a bad value is refused) and
the fetch window's lenient one (garbage is the default key, never an error)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.broker import headers as h
from sojourn.schemas.errors import InvalidName
from sojourn.schemas.fairness import (
    FAIRNESS_KEY,
    FAIRNESS_KEY_MAX,
    FAIRNESS_WEIGHT,
    FAIRNESS_WEIGHT_MAX,
    Fairness,
    classify,
    fairness_headers,
    read_fairness,
    validate_fairness,
)

DEFAULT = Fairness()

GOOD_KEYS = ["a", "tenant-42", "org/team.user@example:x_y", "A" * FAIRNESS_KEY_MAX]
BAD_KEYS = [
    "A" * (FAIRNESS_KEY_MAX + 1),
    "has space",
    " lead",
    "trail ",
    "tab\t",
    "nl\n",
    "nul\x00",
    "bell\x07",
    "é",
    "\u0661",  # an Arabic-Indic digit one
    "a*b",
    "a>b",
    "k\u200b",
]
BAD_WEIGHTS = [
    "0",
    "-1",
    "1e9",
    "1.0",
    "true",
    "\u0661",  # an Arabic-Indic digit one
    "",
    " 1",
    "1 ",
    "0x10",
    "+1",
    "1001",
    "9999",
    "1" * 5000,
    "01",
    "1\n",
    "NaN",
]


def test_header_names_are_shared_with_the_broker() -> None:
    assert (FAIRNESS_KEY, FAIRNESS_WEIGHT) == ("Sojourn-Fairness-Key", "Sojourn-Fairness-Weight")
    assert (h.FAIRNESS_KEY, h.FAIRNESS_WEIGHT) == (FAIRNESS_KEY, FAIRNESS_WEIGHT)


@pytest.mark.parametrize("key", GOOD_KEYS)
@pytest.mark.parametrize("weight", [1, 2, FAIRNESS_WEIGHT_MAX])
def test_valid_keys_and_weights_round_trip_through_headers(key: str, weight: int) -> None:
    f = validate_fairness(key, weight)
    assert f == Fairness(key=key, weight=weight)
    assert read_fairness(fairness_headers(f)) == f
    assert classify(fairness_headers(f)) == f


def test_the_default_has_no_headers() -> None:
    assert validate_fairness("", 1) == DEFAULT
    assert fairness_headers(DEFAULT) == {}
    assert fairness_headers(None) == {}
    assert fairness_headers(Fairness(key="a")) == {FAIRNESS_KEY: "a"}
    assert read_fairness({}) == classify({}) == classify(None) == DEFAULT
    assert read_fairness({FAIRNESS_KEY: ""}) == DEFAULT


@pytest.mark.parametrize("key", BAD_KEYS)
def test_a_bad_key_is_refused(key: str) -> None:
    with pytest.raises(InvalidName):
        validate_fairness(key, 1)
    with pytest.raises(InvalidName):
        read_fairness({FAIRNESS_KEY: key})
    assert classify({FAIRNESS_KEY: key}) == DEFAULT
    assert classify({FAIRNESS_KEY: key, FAIRNESS_WEIGHT: "5"}) == DEFAULT


@pytest.mark.parametrize("weight", [0, -1, FAIRNESS_WEIGHT_MAX + 1, 10**30, True, 1.0, "2", None])
def test_a_bad_weight_is_refused(weight: object) -> None:
    with pytest.raises(InvalidName):
        validate_fairness("a", weight)


def test_a_weight_needs_a_key() -> None:
    with pytest.raises(InvalidName):
        validate_fairness("", 2)
    for given_ in ({FAIRNESS_WEIGHT: "2"}, {FAIRNESS_KEY: "", FAIRNESS_WEIGHT: "2"}):
        with pytest.raises(InvalidName):
            read_fairness(given_)
        assert classify(given_) == DEFAULT
    with pytest.raises(InvalidName):
        validate_fairness(None, 1)


@pytest.mark.parametrize("weight", BAD_WEIGHTS)
def test_strict_refuses_and_lenient_defaults_a_hostile_weight(weight: str) -> None:
    headers = {FAIRNESS_KEY: "tenant", FAIRNESS_WEIGHT: weight}
    with pytest.raises(InvalidName) as e:
        read_fairness(headers)
    assert len(str(e.value)) < 300  # a hostile value is not echoed whole
    assert classify(headers) == DEFAULT


def test_the_errors_are_value_errors_the_intake_can_report() -> None:
    with pytest.raises(ValueError) as e:
        read_fairness({FAIRNESS_KEY: "x" * 100_000})
    assert isinstance(e.value, InvalidName) and len(e.value.message) < 300


header_values = st.one_of(
    st.text(max_size=300),
    st.text(alphabet="0123456789-+.e ", max_size=12),
    st.integers(-(10**40), 10**40).map(str),
    st.sampled_from(BAD_WEIGHTS + BAD_KEYS + GOOD_KEYS),
)


@settings(derandomize=True, max_examples=500, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([FAIRNESS_KEY, FAIRNESS_WEIGHT, "Other", FAIRNESS_KEY.lower()]),
        header_values,
        max_size=4,
    )
)
def test_classify_is_total_and_agrees_with_the_strict_reader(headers: dict[str, str]) -> None:
    got = classify(headers)
    assert isinstance(got, Fairness)
    assert 1 <= got.weight <= FAIRNESS_WEIGHT_MAX and len(got.key) <= FAIRNESS_KEY_MAX
    try:
        strict = read_fairness(headers)
    except InvalidName:
        assert got == DEFAULT
    else:
        assert got == strict


def test_classify_survives_what_is_not_a_str_header() -> None:
    assert classify({FAIRNESS_KEY: "a", FAIRNESS_WEIGHT: 5}) == DEFAULT  # type: ignore[dict-item]
    assert classify({FAIRNESS_KEY: 7}) == DEFAULT  # type: ignore[dict-item]
