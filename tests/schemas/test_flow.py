"""The pure rules of keyed starts (decision 0047): keys, their subject tokens, debounced run
ids, windows, and how a burst's inputs are kept (hypothesis)."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sojourn.actors.client.runs import _keyed
from sojourn.actors.worker.debounce import _recorded, batch_input, merged
from sojourn.broker.timers import rfc3339
from sojourn.schemas.codec import decode_start
from sojourn.schemas.errors import InvalidName
from sojourn.schemas.flow import (
    DEBOUNCE_MAX,
    DEBOUNCE_MIN,
    DEBOUNCED_RUN_ID,
    KEY_MAX_BYTES,
    RECORDED_MAX,
    DebounceBody,
    DebounceEntry,
    DebounceRecord,
    SingletonRecord,
    burst_fault,
    debounce_fault,
    debounced_run_id,
    key_fault,
    key_token,
    parse_window,
    singleton_fault,
)
from sojourn.schemas.names import reserved_run_id, validate_token

printable = st.text(
    st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=KEY_MAX_BYTES // 4
)


@given(printable)
def test_a_printable_key_of_bounded_size_is_a_key(key: str) -> None:
    assert key_fault(key) is None
    token = key_token(key)
    assert re.fullmatch(r"[0-9a-f]{32}", token) and token == key_token(key)


@given(st.text(min_size=0, max_size=600))
def test_key_fault_is_total_and_bounds_keys(key: str) -> None:
    why = key_fault(key)  # never raises
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        assert why is not None
        return
    controls = any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in key)
    assert (why is None) == (0 < size <= KEY_MAX_BYTES and not controls)


@given(st.lists(printable, min_size=2, max_size=20, unique=True))
def test_distinct_keys_have_distinct_tokens(keys: list[str]) -> None:
    assert len({key_token(k) for k in keys}) == len(keys)


@pytest.mark.parametrize("key", [None, 5, "", "a\x00b", "x" * 257, "é" * 129, "\ud800"])
def test_bad_keys(key: object) -> None:
    assert key_fault(key) is not None


@given(
    st.from_regex(r"[A-Za-z0-9_-]{1,128}", fullmatch=True),
    printable,
    st.integers(1, 2**63 - 1),
)
def test_debounced_run_ids_are_reserved_tokens(agent: str, key: str, burst: int) -> None:
    run_id = debounced_run_id(agent, key, burst)
    assert validate_token(run_id, "run_id") == run_id
    assert DEBOUNCED_RUN_ID.fullmatch(run_id)
    assert reserved_run_id(run_id) is not None
    assert run_id == debounced_run_id(agent, key, burst)
    assert run_id != debounced_run_id(agent, key, burst + 1)


@given(st.uuids())
def test_clients_ids_are_not_reserved(u: object) -> None:
    assert reserved_run_id(getattr(u, "hex")) is None  # noqa: B009


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_debounce_windows_are_bounded(seconds: float) -> None:
    why = debounce_fault(DebounceBody(seconds=seconds, key="k"))
    assert (why is None) == (DEBOUNCE_MIN <= seconds <= DEBOUNCE_MAX)


@given(st.integers(1, 7 * 86_400))
def test_whole_second_windows_parse(n: int) -> None:
    assert parse_window(f"{n}s") == n == parse_window(str(n))


@given(st.text(max_size=40))
def test_parse_window_is_total(text: str) -> None:
    try:
        seconds = parse_window(text)
    except ValueError:
        return
    assert DEBOUNCE_MIN <= seconds <= DEBOUNCE_MAX


entries = st.lists(
    st.tuples(st.integers(1, 10_000), st.integers(-100, 100)), unique_by=lambda t: t[0]
)


@given(entries, st.booleans())
def test_merged_keeps_inbox_order_or_the_last(pairs: list[tuple[int, int]], last: bool) -> None:
    kept: tuple[DebounceEntry, ...] = ()
    for seq, n in pairs:
        kept = merged(kept, DebounceEntry(seq, msgspec.Raw(json.dumps(n).encode())), last=last)
    ordered = sorted(pairs)
    if last:
        assert [(e.seq, json.loads(bytes(e.input))) for e in kept] == ordered[-1:]
    else:
        assert [(e.seq, json.loads(bytes(e.input))) for e in kept] == ordered
        rec = DebounceRecord(
            agent="a",
            key="k",
            burst=1,
            inputs="all",
            seconds=1.0,
            deadline=0.0,
            entries=kept,
            count=len(kept),
        )
        assert json.loads(bytes(batch_input(rec))) == [n for _, n in ordered]


@given(st.binary(max_size=300))
def test_decoding_a_start_is_total(data: bytes) -> None:
    try:
        decode_start(data)
    except msgspec.MsgspecError:
        pass


def test_the_client_checks_keyed_options() -> None:
    assert _keyed({}) == (None, None)
    assert _keyed({"singleton_key": "k"}) == ("k", None)
    body = DebounceBody(seconds=30.0, key="k", inputs="all")
    options = {"debounce": timedelta(seconds=30), "debounce_key": "k", "debounce_inputs": "all"}
    assert _keyed(options) == (None, body)  # type: ignore[arg-type]
    for bad in (
        {"debounce": 1},
        {"debounce_key": "k"},
        {"debounce": 0.01, "debounce_key": "k"},
        {"debounce": "30s", "debounce_key": "k"},
        {"debounce": True, "debounce_key": "k"},
        {"debounce": 1, "debounce_key": "k", "debounce_inputs": "some"},
        {"debounce": 1, "debounce_key": "k", "singleton_key": "k"},
    ):
        with pytest.raises(ValueError):
            _keyed(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidName):
        _keyed({"singleton_key": "a\nb"})


@given(st.sets(st.integers(1, 5000), max_size=RECORDED_MAX + 50), st.integers(1, 5000))
def test_a_redelivered_trigger_counts_once(seen: set[int], seq: int) -> None:
    kept = tuple(sorted(seen))[-RECORDED_MAX:]
    rec = DebounceRecord(
        agent="a",
        key="k",
        burst=1,
        inputs="all",
        seconds=1.0,
        deadline=0.0,
        entries=(),
        count=0,
        recorded=kept,
    )
    if seq in kept:
        assert _recorded(rec, seq, 1) and _recorded(rec, seq, 2)
    elif seq not in seen:
        # A first delivery is never taken for recorded; a redelivery only when older than
        # everything kept of a full window.
        assert not _recorded(rec, seq, 1)
        assert _recorded(rec, seq, 2) == (len(kept) >= RECORDED_MAX and seq < kept[0])


records = st.builds(
    DebounceRecord,
    agent=st.just("a"),
    key=st.text(max_size=10),
    burst=st.integers(-5, 2**64),
    inputs=st.sampled_from(["last", "all"]),
    seconds=st.floats(allow_nan=True),
    deadline=st.floats(allow_nan=True, allow_infinity=True),
    entries=st.lists(
        st.builds(DebounceEntry, st.integers(-5, 2**64), st.just(msgspec.Raw(b"1"))), max_size=3
    ),
    count=st.integers(-5, 2**64),
)


@given(records)
def test_a_usable_burst_record_can_be_armed_and_read(rec: DebounceRecord) -> None:
    """Whatever a stranger stores as a burst record, the one a worker acts on can be armed
    (its deadline is a message schedule's time) and has an input and a run id."""
    if burst_fault(rec) is not None:
        return
    rfc3339(rec.deadline)
    assert rec.entries and DEBOUNCED_RUN_ID.fullmatch(rec.run_id)
    batch_input(rec)


@given(st.text(max_size=130), st.integers(-5, 2**64))
def test_a_usable_singleton_record_names_a_run(run_id: str, seq: int) -> None:
    rec = SingletonRecord(agent="a", key="k", run_id=run_id, inbox_seq=seq, at=0.0)
    if singleton_fault(rec) is None:
        assert validate_token(rec.run_id, "run_id") == rec.run_id
