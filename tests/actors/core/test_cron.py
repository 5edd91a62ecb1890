"""Fire times of recurring schedules (issue 14): the ``every`` and ``cron`` calendars of
``sojourn.actors.core.cron``, the DST rule, and the limits of what is accepted.

The cron engine searches wall times field by field; the oracle here walks INSTANTS minute by
minute instead, reads each one's wall clock and applies the DST rule as stated (first occurrence
only; a skipped stretch of wall clock fires once, at the jump), over two-day windows around the
real transitions of zones with odd DST. Expressions are generated together with the value sets
they mean, so the oracle never reads cron syntax. Zones without DST are compared with croniter.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sojourn.actors.core.cron import (
    HORIZON,
    Cron,
    Every,
    ScheduleError,
    calendar,
    fires_between,
    format_duration,
    load_zone,
    parse_duration,
    stamp,
)

# croniter ships no type information (types-croniter lags its major versions): take it untyped.
croniter: Any = importlib.import_module("croniter").croniter

DST_ZONES = [
    "America/New_York",
    "Europe/London",
    "Europe/Berlin",
    "Australia/Sydney",
    "America/Santiago",
    "Pacific/Chatham",  # +12:45 / +13:45
    "Australia/Lord_Howe",  # a 30-minute DST shift
]
ZONES = [*DST_ZONES, "Asia/Kolkata", "UTC"]  # +05:30 without DST, and UTC

T2024 = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp())
T2028 = int(datetime(2028, 1, 1, tzinfo=UTC).timestamp())
MINUTE = timedelta(minutes=1)


def ts(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> float:
    """A UTC wall time as Unix seconds."""
    return datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp()


def utc(t: float | None) -> str:
    assert t is not None
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- the oracle's view of an expression: value sets, built without reading cron syntax ----------


@dataclass(frozen=True)
class Spec:
    second: frozenset[int]
    minute: frozenset[int]
    hour: frozenset[int]
    dom: frozenset[int]
    month: frozenset[int]
    dow: frozenset[int]  # 0 = Sunday
    any_dom: bool
    any_dow: bool

    def day_ok(self, d: date) -> bool:
        if d.month not in self.month:
            return False
        in_dom, in_dow = d.day in self.dom, d.isoweekday() % 7 in self.dow
        if self.any_dom and self.any_dow:
            return True
        if self.any_dom:
            return in_dow
        if self.any_dow:
            return in_dom
        return in_dom or in_dow

    def minute_ok(self, w: datetime) -> bool:
        return w.minute in self.minute and w.hour in self.hour and self.day_ok(w.date())

    def matches(self, w: datetime) -> bool:
        return w.second in self.second and self.minute_ok(w)


ALL = {
    "second": frozenset(range(60)),
    "minute": frozenset(range(60)),
    "hour": frozenset(range(24)),
    "dom": frozenset(range(1, 32)),
    "month": frozenset(range(1, 13)),
    "dow": frozenset(range(7)),
}


def spec(**fields: set[int]) -> Spec:
    """A Spec from the restricted fields; the others are ``*``."""
    sets = {k: frozenset(fields.get(k, v)) for k, v in ALL.items()}
    return Spec(**sets, any_dom="dom" not in fields, any_dow="dow" not in fields)


# Common expressions, written with what they mean.
FIXED: list[tuple[str, Spec]] = [
    ("0 30 2 * * *", spec(second={0}, minute={30}, hour={2})),
    ("0 */15 * * * *", spec(second={0}, minute={0, 15, 30, 45})),
    ("0 0 1 * * *", spec(second={0}, minute={0}, hour={1})),
    ("30 1 * * *", spec(second={0}, minute={30}, hour={1})),
    ("0 2 * * *", spec(second={0}, minute={0}, hour={2})),
    ("*/10 * * * *", spec(second={0}, minute=set(range(0, 60, 10)))),
    ("15,45 1-3 * * *", spec(second={0}, minute={15, 45}, hour={1, 2, 3})),
    ("0 0 * * SUN", spec(second={0}, minute={0}, hour={0}, dow={0})),
    ("30 0 2,3 1-4 * *", spec(second={30}, minute={0}, hour={2, 3}, dom={1, 2, 3, 4})),
    ("0 0 3 1 * 0", spec(second={0}, minute={0}, hour={3}, dom={1}, dow={0})),
    ("@hourly", spec(second={0}, minute={0})),
    ("@daily", spec(second={0}, minute={0}, hour={0})),
]  # fmt: skip


# --- generated expressions ---------------------------------------------------------------------


@dataclass(frozen=True)
class F:
    key: str
    low: int
    high: int  # the largest value one may write
    top: int  # where * and a/n end
    names: tuple[str, ...] = ()  # names[i] is the value low + i (months) or i (days)


SECOND = F("second", 0, 59, 59)
MINUTE_F = F("minute", 0, 59, 59)
HOUR = F("hour", 0, 23, 23)
DOM = F("dom", 1, 31, 31)
MONTH = F("month", 1, 12, 12, tuple("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split()))
DOW = F("dow", 0, 7, 6, tuple("SUN MON TUE WED THU FRI SAT".split()))


def _shown(draw: st.DrawFn, f: F, v: int) -> str:
    if f.names and v <= f.top and draw(st.integers(0, 3)) == 0:
        name = f.names[v - f.low]
        return draw(st.sampled_from([name, name.lower(), name.title()]))
    return str(v)


@st.composite
def field_text(
    draw: st.DrawFn, f: F, *, sparse: bool = False, croniter_safe: bool = False
) -> tuple[str, set[int] | None]:
    """One field's text and the values it selects (``None`` for an unrestricted ``*``/``?``)."""
    if not sparse and draw(st.integers(0, 3)) == 0:
        if f.key in ("dom", "dow") and draw(st.booleans()):
            return "?", None
        return "*", None
    high = 6 if croniter_safe and f.key == "dow" else f.high
    value = st.integers(f.low, high)
    min_step = 10 if sparse else 1
    parts: list[str] = []
    values: set[int] = set()
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["value", "value", "range", "*/n", "a-b/n", "a/n"]))
        if kind == "value":
            v = draw(value)
            parts.append(_shown(draw, f, v))
            values.add(v)
        elif kind == "*/n":
            n = draw(st.integers(min_step, f.top - f.low + 1))
            parts.append(f"*/{n}")
            values.update(range(f.low, f.top + 1, n))
        elif kind == "a/n":
            a, n = draw(value), draw(st.integers(min_step, f.top - f.low + 1))
            parts.append(f"{_shown(draw, f, a)}/{n}")
            values.update(range(a, max(a, f.top) + 1, n))
        else:
            a = draw(value)
            # croniter reads an equal range "a-a" as the whole cycle: only wider ones there.
            lowest_b = a + 1 if croniter_safe else a
            assume(lowest_b <= high)
            b = draw(st.integers(lowest_b, min(high, a + 10) if sparse else high))
            text = f"{_shown(draw, f, a)}-{_shown(draw, f, b)}"
            if kind == "range":
                parts.append(text)
                values.update(range(a, b + 1))
            else:
                n = draw(st.integers(1, f.top - f.low + 1))
                parts.append(f"{text}/{n}")
                values.update(range(a, b + 1, n))
    if f.key == "dow" and 7 in values:
        values = (values - {7}) | {0}
    return ",".join(parts), values


@st.composite
def cron_exprs(
    draw: st.DrawFn, *, dense: bool = True, croniter_safe: bool = False
) -> tuple[str, Spec]:
    """A cron expression (5 or 6 fields) and the Spec it means."""
    six = draw(st.booleans())
    texts: list[str] = []
    sets: dict[str, set[int]] = {}
    fields = [SECOND, MINUTE_F, HOUR, DOM, MONTH, DOW] if six else [MINUTE_F, HOUR, DOM, MONTH, DOW]
    for f in fields:
        text, values = draw(
            field_text(f, sparse=f is SECOND and not dense, croniter_safe=croniter_safe)
        )
        texts.append(text)
        if values is not None:
            sets[f.key] = values
    if not six:
        sets["second"] = {0}
    s = spec(**sets)
    if croniter_safe and not (s.any_dom or s.any_dow):
        # croniter folds a day field that selects everything into "*" (and then ANDs): keep
        # to expressions where that cannot change the meaning.
        assume(s.dom != ALL["dom"] and s.dow != ALL["dow"])
    return " ".join(texts), s


def possible(s: Spec) -> bool:
    """Whether a day-of-month restriction leaves any date in the months (Feb 29 counts)."""
    if not s.any_dow or s.any_dom:
        return True
    return any(d <= MOST[m] for m in s.month for d in s.dom)


MOST = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}


# --- the oracle --------------------------------------------------------------------------------


def wall(t: int, zone: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(t, zone).replace(tzinfo=None)


def oracle(s: Spec, zone: ZoneInfo, start: int, end: int) -> list[int]:
    """The fires in ``(start, end)`` found by walking instants minute by minute (``start`` is
    whole minutes, and lies outside any repeated span)."""
    fires: set[int] = set()
    seen: datetime | None = None  # the latest wall minute read so far
    for u in range(start, end, 60):
        w = wall(u, zone)
        if seen is not None and w <= seen:
            continue  # the clock repeats a wall time: its second pass fires nothing
        if seen is not None and w - seen > MINUTE:
            # The clock jumped over wall times: if any of them matches, it fires at the jump.
            skipped = seen + MINUTE
            while skipped < w:
                if s.minute_ok(skipped):  # the second field is never empty
                    fires.add(u)
                    break
                skipped += MINUTE
        if s.minute_ok(w):
            fires.update(u + sec for sec in s.second)
        seen = w
    return sorted(f for f in fires if start < f < end)


def iterate(cal: Cron | Every, start: float, end: float, most: int) -> list[int]:
    """next_after from ``start`` while below ``end``, at most ``most`` fires."""
    got: list[int] = []
    t: float | None = start
    while len(got) < most:
        assert t is not None
        t = cal.next_after(t)
        if t is None or t >= end:
            break
        assert t == int(t)
        got.append(int(t))
    return got


@functools.cache
def transitions(name: str) -> tuple[int, ...]:
    """The instants in 2024-2027 at which ``name``'s UTC offset changes."""
    zone = ZoneInfo(name)

    def offset(t: int) -> timedelta | None:
        return datetime.fromtimestamp(t, zone).utcoffset()

    found = []
    for day in range(T2024, T2028, 86400):
        lo, hi = day, day + 86400
        if offset(lo) != offset(hi):
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if offset(mid) == offset(lo) else (lo, mid)
            found.append(hi)
    return tuple(found)


def test_the_zones_have_the_transitions_the_tests_are_about() -> None:
    assert len(transitions("America/New_York")) == 8
    assert transitions("Asia/Kolkata") == transitions("UTC") == ()
    lord_howe = transitions("Australia/Lord_Howe")[0]
    before = datetime.fromtimestamp(lord_howe - 1, ZoneInfo("Australia/Lord_Howe")).utcoffset()
    after = datetime.fromtimestamp(lord_howe, ZoneInfo("Australia/Lord_Howe")).utcoffset()
    assert before is not None and after is not None
    assert abs(after - before) == timedelta(minutes=30)


def window_start(draw: Callable[[st.SearchStrategy[Any]], Any], name: str) -> int:
    """A whole-minute start 3 to 30 hours before one of the zone's transitions (never inside a
    repeated span), or anywhere in 2024-2027 for a zone without any."""
    found = transitions(name)
    if found:
        return int(draw(st.sampled_from(found))) - int(draw(st.integers(180, 1800))) * 60
    return int(draw(st.integers(T2024 // 60, T2028 // 60))) * 60


# --- 1. against the oracle, across DST changes -------------------------------------------------


@pytest.mark.parametrize("name", ZONES)
def test_the_common_expressions_match_the_oracle_around_every_transition(name: str) -> None:
    zone = ZoneInfo(name)
    starts = [t - 6 * 3600 for t in transitions(name)] or [T2024 + 86400 * k for k in (40, 200)]
    for text, s in FIXED:
        cron = Cron.parse(text, zone)
        for start in starts:
            end = start + 2 * 86400
            expected = oracle(s, zone, start, end)
            assert iterate(cron, start, end, len(expected) + 1) == expected, (text, utc(start))
            jump = start + 6 * 3600
            for x in (jump - 1, jump - 0.5, jump, jump + 0.5, jump + 1799.5, jump + 3599):
                check_next_after(cron, x, expected, end)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(expr=cron_exprs(dense=False), name=st.sampled_from(ZONES), data=st.data())
def test_next_after_finds_exactly_the_fires_of_the_instant_walking_oracle(
    expr: tuple[str, Spec], name: str, data: st.DataObject
) -> None:
    text, s = expr
    assume(possible(s))
    zone = ZoneInfo(name)
    start = window_start(data.draw, name)
    end = start + 2 * 86400
    expected = oracle(s, zone, start, end)
    cron = Cron.parse(text, zone)
    assert iterate(cron, start, end, len(expected) + 1) == expected, text
    # And from any instant: just before, at and after the jumps of the clock too.
    jumps = [t for t in transitions(name) if start < t < end]
    probes = [j + d for j in jumps for d in (-1, -0.5, 0, 0.5)]
    probes += data.draw(st.lists(st.floats(start, end - 1, allow_nan=False), max_size=10))
    for x in probes:
        check_next_after(cron, x, expected, end)


def check_next_after(cron: Cron, x: float, expected: list[int], end: int) -> None:
    """``cron.next_after(x)`` is the oracle's first fire after ``x`` (``expected``: all fires
    up to ``end``)."""
    later = [f for f in expected if f > x]
    got = cron.next_after(x)
    if later:
        assert got == later[0], (cron.expression, x)
    else:
        assert got is None or got >= end, (cron.expression, x)


# --- 2. against croniter, in zones without DST -------------------------------------------------


def croniter_fires(text: str, zone: ZoneInfo, start: float, n: int) -> list[int]:
    six = len(text.split()) == 6
    it = croniter(text, datetime.fromtimestamp(start, zone), second_at_beginning=six)
    return [int(it.get_next(float)) for _ in range(n)]


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    expr=cron_exprs(croniter_safe=True),
    name=st.sampled_from(["UTC", "Asia/Tokyo"]),
    start=st.floats(T2024, T2028, allow_nan=False),
)
def test_next_after_agrees_with_croniter_where_there_is_no_dst(
    expr: tuple[str, Spec], name: str, start: float
) -> None:
    text, s = expr
    zone = ZoneInfo(name)
    if not possible(s):
        with pytest.raises(ScheduleError, match="never"):
            Cron.parse(text, zone)
        return
    cron = Cron.parse(text, zone)
    got = iterate(cron, start, math.inf, 12)
    assume(len(got) == 12)  # (29 2 near 2100 only)
    assert got == croniter_fires(text, zone, start, 12), text


def test_croniter_agrees_on_the_vixie_day_rule_as_used_here() -> None:
    # Both restricted: either matches. One restricted: it alone decides.
    start = ts(2026, 6, 1)
    for text in ["0 0 13 * FRI", "0 0 * * FRI", "0 0 13 * *", "0 0 13 * ?", "0 0 ? * 5"]:
        cron = Cron.parse(text, load_zone("UTC"))
        assert iterate(cron, start, math.inf, 10) == croniter_fires(
            text, ZoneInfo("UTC"), start, 10
        )


# --- 3. the DST rule, by hand ------------------------------------------------------------------

NY = load_zone("America/New_York")


def test_a_daily_0230_skipped_by_spring_forward_fires_once_at_the_jump() -> None:
    cron = Cron.parse("30 2 * * *", NY)
    fires = iterate(cron, ts(2026, 3, 7, 12), math.inf, 3)
    assert [utc(t) for t in fires] == [
        "2026-03-08T07:00:00Z",  # 03:00 EDT: the instant 02:00 EST became 03:00 EDT
        "2026-03-09T06:30:00Z",  # 02:30 EDT
        "2026-03-10T06:30:00Z",
    ]
    # Also when the search starts just before the jump, and not again just after it.
    assert utc(cron.next_after(ts(2026, 3, 8, 7) - 0.5)) == "2026-03-08T07:00:00Z"
    assert utc(cron.next_after(ts(2026, 3, 8, 7))) == "2026-03-09T06:30:00Z"


def test_all_of_a_gaps_matching_wall_times_collapse_into_one_fire() -> None:
    # 02:00, 02:30 (skipped) and 03:00 (the first wall time after the gap): one fire at 07:00Z.
    cron = Cron.parse("0,30 2,3 * * *", NY)
    fires = iterate(cron, ts(2026, 3, 8, 6), ts(2026, 3, 8, 9), 10)
    assert [utc(t) for t in fires] == ["2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z"]
    every_second = Cron.parse("* * 2 * * *", NY)  # 3,600 skipped matching wall seconds
    assert iterate(every_second, ts(2026, 3, 8, 6), ts(2026, 3, 9, 5), 10) == [ts(2026, 3, 8, 7)]


def test_a_daily_0130_repeated_by_fall_back_fires_once_at_its_first_occurrence() -> None:
    cron = Cron.parse("30 1 * * *", NY)
    fires = iterate(cron, ts(2026, 10, 31, 12), math.inf, 2)
    assert [utc(t) for t in fires] == ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
    # Searching from inside the second pass does not fire the repeated wall time again.
    assert utc(cron.next_after(ts(2026, 11, 1, 6, 10))) == "2026-11-02T06:30:00Z"


def test_quarter_hours_across_fall_back_are_silent_in_the_second_pass() -> None:
    cron = Cron.parse("*/15 * * * *", NY)
    fires = iterate(cron, ts(2026, 11, 1, 4, 50), ts(2026, 11, 1, 7, 31), 20)
    assert [utc(t)[11:16] for t in fires] == [
        "05:00", "05:15", "05:30", "05:45",  # 01:00-01:45 EDT
        "07:00", "07:15", "07:30",  # 02:00 EST on: 06:00-06:45Z (01:xx EST) fire nothing
    ]  # fmt: skip
    assert utc(cron.next_after(ts(2026, 11, 1, 6, 20))) == "2026-11-01T07:00:00Z"
    assert utc(cron.next_after(ts(2026, 11, 1, 6) - 1)) == "2026-11-01T07:00:00Z"


def test_half_hour_and_three_quarter_hour_zones() -> None:
    lord_howe = load_zone("Australia/Lord_Howe")  # 02:00 -> 02:30 on 2026-10-04
    jump = next(t for t in transitions("Australia/Lord_Howe") if t > ts(2026, 7, 1))
    assert wall(jump, lord_howe) == datetime(2026, 10, 4, 2, 30)
    cron = Cron.parse("15 2 * * *", lord_howe)
    assert cron.next_after(jump - 3600) == jump
    assert wall(int(cron.next_after(jump) or 0), lord_howe) == datetime(2026, 10, 5, 2, 15)
    chatham = load_zone("Pacific/Chatham")
    noon = Cron.parse("0 12 * * *", chatham).next_after(ts(2026, 1, 10))
    assert utc(noon) == "2026-01-10T22:15:00Z"  # +13:45


def test_every_is_epoch_anchored_and_blind_to_zones() -> None:
    ten = Every(10)
    assert ten.next_after(1000) == 1010.0
    assert ten.next_after(1005.5) == 1010.0
    assert ten.next_after(1009.999) == 1010.0
    assert ten.next_after(-5) == 0.0
    assert Every(86400).next_after(ts(2026, 3, 8, 6, 59)) == ts(2026, 3, 9)  # 00:00Z, any zone
    assert ten.describe() == "every 10s"
    assert Every(5400).describe() == "every 1h30m"
    assert calendar(every="10s", timezone="America/New_York") == ten
    assert calendar(every=10) == ten
    for bad in (0, -1, 366 * 86400 + 1):
        with pytest.raises(ScheduleError, match="between 1s and 366d"):
            Every(bad)


def test_fires_between_keeps_the_newest_fires_in_the_half_open_window() -> None:
    assert fires_between(Every(1), 0, 100, 3) == [98.0, 99.0, 100.0]
    assert fires_between(Every(10), 10, 40, 10) == [20.0, 30.0, 40.0]  # (after, until]
    assert fires_between(Every(10), 10, 39.9, 10) == [20.0, 30.0]
    assert fires_between(Every(10), 10, 10, 10) == []
    assert fires_between(Every(10), 0, 100, 0) == []
    hourly = Cron.parse("@hourly", load_zone("UTC"))
    week = fires_between(hourly, ts(2026, 1, 1), ts(2026, 1, 8), 1000)
    assert len(week) == 7 * 24 and week[-1] == ts(2026, 1, 8)
    assert fires_between(hourly, ts(2026, 1, 1), ts(2026, 1, 8), 2) == week[-2:]
    yearly = Cron.parse("@yearly", load_zone("UTC"))
    assert fires_between(yearly, ts(2020, 6, 1), ts(2024, 6, 1), 1) == [ts(2024, 1, 1)]
    assert fires_between(yearly, ts(2024, 6, 1), ts(2024, 12, 1), 1) == []


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    expr=cron_exprs(dense=False),
    name=st.sampled_from(ZONES),
    after=st.integers(T2024, T2028),
    span=st.integers(0, 3 * 86400),
    limit=st.integers(1, 30),
)
def test_fires_between_is_the_tail_of_iterating_next_after(
    expr: tuple[str, Spec], name: str, after: int, span: int, limit: int
) -> None:
    text, s = expr
    assume(possible(s))
    cron = Cron.parse(text, ZoneInfo(name))
    every = iterate(cron, after, after + span + 1, 100_000)
    assert fires_between(cron, after, after + span, limit) == every[-limit:]
    interval = Every(1 + span % 5000)
    assert (
        fires_between(interval, after, after + span, limit)
        == (iterate(interval, after, after + span + 1, 100_000)[-limit:])
    )


def test_day_of_month_and_day_of_week_follow_vixie_cron() -> None:
    zone = load_zone("UTC")
    start = ts(2026, 5, 31)  # a Sunday
    days = [
        datetime.fromtimestamp(t, UTC).day
        for t in iterate(Cron.parse("0 0 1 * MON", zone), start, ts(2026, 6, 30), 10)
    ]
    assert days == [1, 8, 15, 22, 29]  # June 1st (a Monday) and the Mondays
    days = [
        datetime.fromtimestamp(t, UTC).day
        for t in iterate(Cron.parse("0 0 3 * MON", zone), start, ts(2026, 6, 30), 10)
    ]
    assert days == [1, 3, 8, 15, 22, 29]  # EITHER: the 3rd, and the Mondays
    for only_mondays in ("0 0 * * MON", "0 0 ? * 1", "0 0 0 ? * mon"):
        got = iterate(Cron.parse(only_mondays, zone), start, ts(2026, 6, 30), 10)
        assert [datetime.fromtimestamp(t, UTC).day for t in got] == [1, 8, 15, 22, 29]
    assert Cron.parse("0 0 * * 7", zone).weekdays == Cron.parse("0 0 * * 0", zone).weekdays
    assert Cron.parse("0 0 * * 5-7", zone).weekdays == {5, 6, 0}
    assert Cron.parse("0 0 * * Sat-SUN", zone).weekdays == {6, 0}
    assert Cron.parse("0 0 * jan-Mar *", zone).months == (1, 2, 3)
    assert Cron.parse("0 0 * * 1/2", zone).weekdays == {1, 3, 5}
    assert Cron.parse("0 0 * * */3", zone).weekdays == {0, 3, 6}
    assert Cron.parse("50/5 * * * *", zone).minutes == (50, 55)
    assert Cron.parse("59/15 * * * *", zone).minutes == (59,)
    assert Cron.parse("0 10-20/4 * * *", zone).hours == (10, 14, 18)


def test_aliases_and_the_yearly_and_leap_day_worst_cases() -> None:
    zone = load_zone("Europe/Berlin")
    assert Cron.parse("@YEARLY", zone).expression == "@YEARLY"
    assert utc(Cron.parse("@annually", zone).next_after(ts(2026, 6, 1))) == "2026-12-31T23:00:00Z"
    assert utc(Cron.parse("@monthly", zone).next_after(ts(2026, 6, 1))) == "2026-06-30T22:00:00Z"
    assert utc(Cron.parse("@weekly", zone).next_after(ts(2026, 6, 1))) == "2026-06-06T22:00:00Z"
    assert utc(Cron.parse("@midnight", zone).next_after(ts(2026, 6, 1))) == "2026-06-01T22:00:00Z"
    leap = Cron.parse("0 0 29 2 *", load_zone("UTC"))
    assert utc(leap.next_after(ts(2024, 3, 1))) == "2028-02-29T00:00:00Z"
    assert leap.next_after(ts(2097, 3, 1)) is None  # 2100 is no leap year: 2104 is > 5 years
    assert HORIZON >= 5 * 365 * 86400
    dec31 = Cron.parse("59 59 23 31 12 *", load_zone("Pacific/Kiritimati"))
    assert utc(dec31.next_after(ts(2026, 1, 1))) == "2026-12-31T09:59:59Z"


def test_describe_and_stamp() -> None:
    cron = calendar(cron="  0  30 2 * * *", timezone="America/New_York")
    assert cron.describe() == "cron 0 30 2 * * * (America/New_York)"
    assert stamp(ts(2026, 3, 8, 7)) == "20260308T070000Z"
    assert format_duration(90) == "1m30s" and format_duration(2 * 86400 + 1) == "2d1s"


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("60 * * * * *", "second field: 60 in '60' is out of range 0-59"),
        ("60 * * * *", "minute field: 60"),
        ("0 24 * * *", "hour field: 24"),
        ("* * 0 * *", "day-of-month field: 0"),
        ("* * 32 * *", "day-of-month field: 32"),
        ("* * * 0 *", "month field: 0"),
        ("* * * 13 *", "month field: 13"),
        ("* * * * 8", "day-of-week field: 8"),
        ("* * * FOO *", "month field: unknown name 'FOO'"),
        ("* * * * MONDAY", "day-of-week field: cannot read 'MONDAY'"),
        ("* MON * * *", "hour field: 'MON' in 'MON' is not a number"),
        ("* * * * JAN", "day-of-week field: unknown name 'JAN'"),
        ("*/0 * * * *", "minute field: step 0"),
        ("*/61 * * * *", "minute field: step 61"),
        ("1-5/0 * * * *", "minute field: step 0"),
        ("5-1 * * * *", "minute field: range '5-1' is reversed"),
        ("* * * DEC-JAN *", "month field: range 'DEC-JAN' is reversed"),
        ("1,,2 * * * *", "minute field: cannot read ''"),
        ("1, * * * *", "minute field: cannot read ''"),
        ("-1 * * * *", "minute field: cannot read '-1'"),
        ("? * * * *", "minute field: cannot read '?'"),
        ("* * ?/2 * *", "day-of-month field: cannot read '?/2' ('?' only stands alone"),
        ("* * 1-? * *", "cannot read '1-?'"),
        ("* * * *", "expected 5 fields"),
        ("* * * * * * *", "expected 5 fields"),
        ("", "expected 5 fields"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
        ("0 0 31 FEB ?", "never fires"),
        ("@fortnightly", "unknown alias"),
        ("@every 1m", "for an interval use every"),
        ("1 " * 200, "at most 256 characters"),
        ("\u0663 * * * *", "cannot read"),  # a digit, but not an ASCII one
        ("0001 * * * *", "cannot read"),
    ],
)
def test_unusable_expressions_are_refused_naming_the_field(expr: str, message: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        Cron.parse(expr, load_zone("UTC"))
    assert message in caught.value.args[0]


def test_impossible_and_possible_day_month_pairs() -> None:
    # Either day rule makes "30 2" possible again: the Sundays of February.
    assert Cron.parse("0 0 30 2 SUN", load_zone("UTC")).next_after(ts(2026, 1, 1)) is not None
    assert Cron.parse("0 0 29 2 *", load_zone("UTC")) is not None
    assert Cron.parse("0 0 30,31 1,2 *", load_zone("UTC")) is not None


@pytest.mark.parametrize(
    "name",
    [
        "../etc/passwd",
        "/etc/passwd",
        "America/../Europe/Berlin",
        "Europe//Berlin",
        "Europe/Berlin/",
        "./UTC",
        "right/UTC",
        "posix/Europe/Berlin",
        "",
        "Not/AZone",
        "America",  # a directory of zones
        "Europe\\Berlin",
        "Europe/Berlin\x00",
        "UTC ",
        "A" * 65,
    ],
)
def test_unusable_zone_names_are_refused(name: str) -> None:
    with pytest.raises(ScheduleError, match="timezone"):
        load_zone(name)
    with pytest.raises(ScheduleError, match="timezone"):
        calendar(cron="* * * * *", timezone=name)


def test_zone_names_that_exist_load() -> None:
    for name in [*ZONES, "Etc/GMT+5", "America/Argentina/Buenos_Aires", "America/Port-au-Prince"]:
        assert load_zone(name).key == name


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1),
        ("90s", 90),
        ("10m", 600),
        ("1h30m", 5400),
        ("2d", 172800),
        ("1w", 604800),
        ("1w2d3h4m5s", 604800 + 2 * 86400 + 3 * 3600 + 245),
        ("3600", 3600),
        ("366d", 366 * 86400),
    ],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize(
    "text",
    ["", "0", "0s", "1.5s", "-1s", "1 s", "1S", "30m1h", "1h1h", "s", "1ms", "367d", "53w",
     "10" * 40, "\u0661s", "1y", " 1s"],
)  # fmt: skip
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ScheduleError):
        parse_duration(text)


def test_a_schedule_needs_exactly_one_of_cron_and_every() -> None:
    with pytest.raises(ScheduleError, match="exactly one"):
        calendar()
    with pytest.raises(ScheduleError, match="exactly one"):
        calendar(cron="* * * * *", every="1s")
    with pytest.raises(ScheduleError, match="interval"):
        calendar(every=True)
    with pytest.raises(ScheduleError, match="interval"):
        calendar(every=1.5)  # type: ignore[arg-type]


# --- 4. every fire is a fire -------------------------------------------------------------------


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    expr=st.one_of(st.sampled_from(FIXED), cron_exprs()),
    name=st.sampled_from(ZONES),
    near=st.booleans(),
    data=st.data(),
)
def test_next_after_increases_and_each_fire_matches_or_is_a_jump(
    expr: tuple[str, Spec], name: str, near: bool, data: st.DataObject
) -> None:
    text, s = expr
    assume(possible(s))
    zone = ZoneInfo(name)
    if near and transitions(name):
        jump = data.draw(st.sampled_from(transitions(name)))
        start = jump + data.draw(st.floats(-7200, 7200, allow_nan=False))
    else:
        start = data.draw(st.floats(ts(1990, 1, 1), ts(2060, 1, 1), allow_nan=False))
    cron = Cron.parse(text, zone)
    previous = start
    for _ in range(25):
        t = cron.next_after(previous)
        if t is None:  # nothing within five years: only a leap day can do that (near 2100)
            assert s.any_dow and not s.any_dom
            assert {(m, d) for m in s.month for d in s.dom if d <= MOST[m]} == {(2, 29)}
            assert 2095 <= datetime.fromtimestamp(previous, UTC).year <= 2104
            break
        assert t > previous and t == int(t)
        moment = datetime.fromtimestamp(t, zone)
        here, before = moment.replace(tzinfo=None), wall(int(t) - 1, zone)
        if here - before > timedelta(seconds=1):  # the clock jumped at t: a skipped one matched?
            skipped = [
                before + timedelta(seconds=k)
                for k in range(1, int((here - before).total_seconds()))
            ]
            assert s.matches(here) or any(s.matches(w) for w in skipped), (text, utc(t))
        else:
            assert s.matches(here), (text, utc(t))
            assert moment.fold == 0, (text, utc(t))  # the first occurrence of that wall time
        previous = t
