"""The pure parts of sojourn.actors.llm: price tables, Retry-After parsing, error bodies and
the server-sent-events parser (property-tested: any split of a stream gives the same events,
and no input gets past the bounds)."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.actors.llm import ModelProtocolError, PriceTable
from sojourn.actors.llm._call import priced
from sojourn.actors.llm._http import (
    RETRY_AFTER_MAX,
    SseParser,
    clip,
    provider_message,
    retry_after,
)
from sojourn.schemas.events import Usage


def test_an_exact_name_wins_then_the_longest_matching_pattern() -> None:
    table = PriceTable(
        {"gpt-4o": (2.5, 10), "gpt-4o*": (5, 15), "gpt-4o-mini*": {"input": 0.15, "output": 0.6}}
    )
    assert table.cost("gpt-4o", 1_000_000, 0) == 2.5
    assert table.cost("gpt-4o-2024-08-06", 0, 1_000_000) == 15
    assert table.cost("gpt-4o-mini-2024-07-18", 1000, 500) == pytest.approx(0.00045)
    assert "gpt-4o-mini" in table and "claude" not in table


def test_an_unknown_model_costs_nothing_and_is_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    table = PriceTable({"a": (1, 1)})
    with caplog.at_level(logging.WARNING, logger="sojourn.llm"):
        assert table.cost("mystery", 100, 100) == 0.0
        assert table.cost("mystery", 100, 100) == 0.0
        assert table.cost("other", 1, 1) == 0.0
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "no price for model 'mystery'" in said[0]


def test_tables_are_read_from_json_and_toml(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text('{"m*": {"input": 1, "output": 2}, "x": [3, 4]}')
    (tmp_path / "p.toml").write_text(
        '["m*"]\ninput = 1\noutput = 2\n\n[x]\ninput = 3\noutput = 4\n'
    )
    for name in ("p.json", "p.toml"):
        table = PriceTable.from_file(tmp_path / name)
        assert table.cost("m-1", 1_000_000, 1_000_000) == 3
        assert table.cost("x", 1_000_000, 0) == 3


@pytest.mark.parametrize(
    "bad", [{"m": (-1, 1)}, {"m": (1,)}, {"m": {"in": 1}}, {"m": (float("nan"), 1)}, {"": (1, 1)}]
)
def test_a_bad_price_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        PriceTable(bad)  # type: ignore[arg-type]


def test_a_reported_cost_wins_over_the_table() -> None:
    table = PriceTable({"m": (1, 1)})
    usage = Usage(input_tokens=1_000_000, output_tokens=0)
    assert priced(usage, table, None, "m").usd == 1.0
    got = priced(usage, table, 0.25, "m")
    assert (got.usd, got.model, got.requests) == (0.25, "m", 1)


def test_retry_after_forms() -> None:
    now = time.time()
    assert retry_after({"retry-after": "12"}, now) == 12.0
    assert retry_after({"retry-after": " 0 "}, now) == 0.0
    assert retry_after({"retry-after-ms": "250", "retry-after": "9"}, now) == 0.25
    when = datetime.fromtimestamp(now, UTC) + timedelta(seconds=90)
    got = retry_after({"retry-after": format_datetime(when, usegmt=True)}, now)
    assert got is not None and 89 <= got <= 90
    past = datetime.fromtimestamp(now, UTC) - timedelta(days=1)
    assert retry_after({"retry-after": format_datetime(past, usegmt=True)}, now) == 0.0
    assert retry_after({"retry-after": "1e9"}, now) is None
    assert retry_after({"retry-after": "-5"}, now) is None
    assert retry_after({"retry-after": "99999999"}, now) == RETRY_AFTER_MAX
    assert retry_after({}, now) is None


@given(st.text(max_size=80), st.text(max_size=20))
def test_retry_after_never_raises_and_stays_bounded(value: str, ms: str) -> None:
    for headers in ({"retry-after": value}, {"retry-after-ms": ms, "retry-after": value}):
        got = retry_after(headers, time.time())
        assert got is None or 0 <= got <= RETRY_AFTER_MAX


def test_error_bodies_give_their_message_clipped() -> None:
    assert provider_message(b'{"error": {"message": "bad key"}}') == "bad key"
    assert provider_message(b'{"error": "nope"}') == "nope"
    assert provider_message(b'{"detail": "missing field"}') == "missing field"
    assert provider_message(b"") == "(empty body)"
    assert provider_message(b"\xff\xfeplain").endswith("plain")
    assert len(clip("x" * 10_000)) == 500 and clip("a\x00b\x1bc") == "a?b?c"


EVENTS = st.lists(
    st.lists(
        st.text(st.characters(codec="utf-8", blacklist_characters="\r\n"), max_size=30),
        min_size=1,
        max_size=3,
    ),
    max_size=8,
)


def encode(events: list[list[str]]) -> bytes:
    out = b": a comment\n"
    for lines in events:
        out += b"event: x\n" + b"".join(b"data: " + line.encode() + b"\r\n" for line in lines)
        out += b"\n"
    return out


@settings(max_examples=200)
@given(EVENTS, st.lists(st.integers(min_value=0, max_value=2000), max_size=10))
def test_any_split_of_a_stream_gives_the_same_events(
    events: list[list[str]], cuts: list[int]
) -> None:
    data = encode(events)
    parser = SseParser(max_line=1 << 20, max_total=1 << 20)
    got: list[bytes] = []
    last = 0
    for cut in sorted(c % (len(data) + 1) for c in cuts):
        got += parser.feed(data[last:cut])
        last = cut
    got += parser.feed(data[last:])
    got += parser.close()
    assert got == [b"\n".join(line.encode() for line in lines) for lines in events]


def test_the_last_event_without_its_blank_line_is_kept_on_close() -> None:
    parser = SseParser(max_line=100, max_total=1000)
    assert parser.feed(b"data: a\n\ndata: b") == [b"a"]
    assert parser.close() == [b"b"]


@given(st.binary(max_size=3000))
def test_no_input_gets_past_the_bounds(data: bytes) -> None:
    parser = SseParser(max_line=64, max_total=1024)
    try:
        for event in parser.feed(data) + parser.close():
            assert len(event) <= 64
    except ModelProtocolError:
        pass
    assert len(parser._buf) <= 1024


def test_a_line_without_end_is_refused_before_it_fills_memory() -> None:
    parser = SseParser(max_line=1024, max_total=1 << 30)
    with pytest.raises(ModelProtocolError, match="line passed 1024 bytes"):
        for _ in range(100):
            parser.feed(b"x" * 100)
