"""When a recurring schedule fires (issue 14): ``--every`` intervals and ``--cron`` expressions.

sojourn computes every fire time itself, here, and arms a one-shot broker timer for it; the
broker's own cron is not used, so the rule below is the only one there is. This module is pure:
no I/O, no clock. ``calendar()`` turns the user's spec into a ``Calendar``; ``next_after(t)`` is
the first fire strictly after the instant ``t``; ``fires_between`` is what a catch-up looks at.
Instants are Unix seconds; every fire is a whole second.

``every``: elapsed time, anchored on the Unix epoch, blind to zones. An interval of ``s`` seconds
fires at every multiple of ``s``: the next fire after ``t`` is ``(floor(t / s) + 1) * s``. So
``10s`` fires at :00, :10, :20 ..., and every worker, replica and restart agrees on the same
instants without having to remember when the schedule was created.

``cron``: five fields ``minute hour day-of-month month day-of-week`` (second 0), or six with the
second first (``second minute hour day-of-month month day-of-week``, as NATS and robfig/cron).
Each field is ``*``, a value, a range ``a-b``, a step ``*/n``, ``a-b/n`` or ``a/n`` (``a`` to the
field's end), or a comma list of those. Months may be named ``JAN``-``DEC`` and days ``SUN``-
``SAT`` (any case); day-of-week 0 and 7 are both Sunday, and ``SUN`` ending a range is 7
(``FRI-SUN``). ``?`` is ``*`` in the two day fields. Ranges run low to high: a wrap is a list
(``22-23,0-2``).
Aliases: ``@yearly`` (= ``@annually``), ``@monthly``, ``@weekly``, ``@daily`` (= ``@midnight``),
``@hourly``. Day-of-month and day-of-week: when both are restricted (neither is exactly ``*``
or ``?``; ``*/2`` restricts) a day matches if EITHER does (Vixie cron: ``0 0 1 * MON`` is the
1st and every Monday); otherwise the restricted one alone decides. An expression that can
never fire (``0 0 30 2 *``) is refused.

The wall clock and DST (the contract):

- Fields are matched against the local wall-clock time in the schedule's zone (IANA name).
- A wall time that a spring-forward skips fires ONCE, at the instant the clock jumps (the
  transition). All of one gap's matching wall times collapse into that single fire, and if the
  first wall time after the gap matches too, it is the same instant: still one fire. (A daily
  02:30 job in America/New_York fires at 03:00 EDT on the spring-forward day.)
- A wall time that a fall-back repeats fires once, at its FIRST occurrence. The repeated
  span's second pass fires nothing (``*/15 * * * *`` fires at 01:00, 01:15, 01:30, 01:45 EDT,
  then 02:00 EST: the clock's second 01:00-01:59 is silent).
- ``next_after`` returns ``None`` when nothing fires within five years (only ``29 2`` around
  2100, a non-leap century year, can get there once an expression has been accepted).

The search walks local wall times field by field (month, day, then the first matching time of
day), maps a matching wall time to its instant (first occurrence; in a gap the transition,
found by bisection between the two offsets' readings), and returns the first instant after
``t``: a yearly expression costs a few dozen steps, not a year of seconds.
"""

from __future__ import annotations

import math
import re
import zoneinfo
from bisect import bisect_left
from calendar import monthrange
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

__all__ = [
    "HORIZON",
    "MAX_INTERVAL",
    "Calendar",
    "Cron",
    "Every",
    "ScheduleError",
    "calendar",
    "fires_between",
    "format_duration",
    "load_zone",
    "parse_duration",
    "stamp",
]

MAX_INTERVAL = 366 * 86400
"""The longest ``every``: a schedule that fires less than once a year wants a cron."""

HORIZON = (5 * 365 + 2) * 86400
"""``next_after`` looks this far (five years) ahead before it says "never"."""

MAX_EXPRESSION = 256
MAX_ZONE_NAME = 64
MAX_DURATION_TEXT = 64

_SECOND = timedelta(seconds=1)
_PROBE_START = 1_704_067_200.0  # 2024-01-01T00:00:00Z: a leap year, for the "never fires" check


class ScheduleError(ValueError):
    """A schedule expression, zone or duration that cannot be used.

    ``args[0]`` is a message for users: it names the field and the offending text.
    """


# --- durations ---------------------------------------------------------------------------------

_DURATION = re.compile(
    r"(?:([0-9]{1,9})w)?(?:([0-9]{1,9})d)?(?:([0-9]{1,9})h)?(?:([0-9]{1,9})m)?(?:([0-9]{1,9})s)?"
)
_PLAIN_SECONDS = re.compile(r"[0-9]{1,12}")
_UNITS = ((604800, "w"), (86400, "d"), (3600, "h"), (60, "m"), (1, "s"))


def parse_duration(text: str) -> int:
    """Whole seconds from ``"90s"``, ``"10m"``, ``"1h30m"``, ``"2d"``, ``"1w"`` or ``"3600"``.

    Units come largest first, each at most once; the total is 1 s to 366 days.
    """
    if not isinstance(text, str) or len(text) > MAX_DURATION_TEXT:
        raise ScheduleError(f"duration: expected a short text like 90s, 10m, 1h30m, got {text!r}")
    if _PLAIN_SECONDS.fullmatch(text):
        seconds = int(text)
    else:
        m = _DURATION.fullmatch(text)
        if m is None or not any(m.groups()):
            raise ScheduleError(
                f"duration {text!r}: expected whole seconds or units largest first, "
                "like 90s, 10m, 1h30m, 2d, 1w"
            )
        seconds = sum(int(g) * unit for g, (unit, _) in zip(m.groups(), _UNITS, strict=True) if g)
    return _checked_interval(seconds, repr(text))


def _checked_interval(seconds: int, shown: str) -> int:
    if not 1 <= seconds <= MAX_INTERVAL:
        raise ScheduleError(f"interval {shown}: must be between 1s and 366d")
    return seconds


def format_duration(seconds: int) -> str:
    """The inverse of ``parse_duration``: ``5400`` -> ``"1h30m"``."""
    parts = []
    for unit, suffix in _UNITS:
        n, seconds = divmod(seconds, unit)
        if n:
            parts.append(f"{n}{suffix}")
    return "".join(parts) or "0s"


def stamp(at: float) -> str:
    """``at`` (whole seconds) as ``YYYYMMDDTHHMMSSZ``, the suffix of a fire's run id."""
    return datetime.fromtimestamp(math.floor(at), UTC).strftime("%Y%m%dT%H%M%SZ")


# --- zones -------------------------------------------------------------------------------------

_ZONE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_+\-]*(?:/[A-Za-z0-9][A-Za-z0-9_+\-]*){0,3}")


def load_zone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA zone ``name`` (``"Europe/Berlin"``), checked before it touches the filesystem.

    The name must look like a zone key (letters, digits, ``_+-``, at most four ``/``-separated
    parts, nothing like ``..``); the ``posix/`` and ``right/`` trees are refused (``right/``
    counts leap seconds, which Unix time does not).
    """
    if (
        not isinstance(name, str)
        or len(name) > MAX_ZONE_NAME
        or not _ZONE_NAME.fullmatch(name)
        or name.startswith(("posix/", "right/"))
    ):
        raise ScheduleError(f"timezone {name!r}: expected an IANA zone name like Europe/Berlin")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ScheduleError(f"timezone {name!r}: no such IANA zone") from exc


# --- calendars ---------------------------------------------------------------------------------


class Calendar(Protocol):
    """The fire instants of one schedule."""

    def next_after(self, after: float) -> float | None:
        """The first fire strictly after ``after`` (Unix seconds), a whole second; ``None`` if
        there is none within five years."""
        ...

    def describe(self) -> str:
        """The schedule in words, for listings."""
        ...


@dataclass(frozen=True)
class Every:
    """Every ``seconds`` seconds, on the multiples of ``seconds`` since the Unix epoch."""

    seconds: int

    def __post_init__(self) -> None:
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, int):
            raise ScheduleError(f"interval {self.seconds!r}: expected whole seconds")
        _checked_interval(self.seconds, f"{self.seconds}s")

    def next_after(self, after: float) -> float | None:
        # floor(t / s) == floor(t) // s for a whole s: integer arithmetic, no rounding.
        return float((math.floor(after) // self.seconds + 1) * self.seconds)

    def describe(self) -> str:
        return f"every {format_duration(self.seconds)}"


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int  # the largest value one may write (7 for day-of-week)
    top: int  # where ``*`` and ``a/n`` end (6 for day-of-week)
    names: dict[str, int] = field(default_factory=dict)


_MONTH_NAMES = {
    n: i + 1
    for i, n in enumerate(
        ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
    )
}
_DAY_NAMES = {n: i for i, n in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])}

_FIELDS = (
    _Field("second", 0, 59, 59),
    _Field("minute", 0, 59, 59),
    _Field("hour", 0, 23, 23),
    _Field("day-of-month", 1, 31, 31),
    _Field("month", 1, 12, 12, _MONTH_NAMES),
    _Field("day-of-week", 0, 7, 6, _DAY_NAMES),
)
_DOM, _DOW = 3, 5

_ALIASES = {
    "@yearly": "0 0 0 1 1 *",
    "@annually": "0 0 0 1 1 *",
    "@monthly": "0 0 0 1 * *",
    "@weekly": "0 0 0 * * 0",
    "@daily": "0 0 0 * * *",
    "@midnight": "0 0 0 * * *",
    "@hourly": "0 0 * * * *",
}

_ELEMENT = re.compile(
    r"(?:(?P<star>\*)|(?P<lo>[0-9A-Za-z]{1,3})(?:-(?P<hi>[0-9A-Za-z]{1,3}))?)"
    r"(?:/(?P<step>[0-9]{1,3}))?"
)
_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # at most (Feb 29 exists)


def _value(f: _Field, text: str, element: str) -> int:
    if text.isascii() and text.isdigit():
        v = int(text)
    elif f.names and text.upper() in f.names:
        v = f.names[text.upper()]
    elif f.names:
        raise ScheduleError(f"cron {f.name} field: unknown name {text!r} in {element!r}")
    else:
        raise ScheduleError(f"cron {f.name} field: {text!r} in {element!r} is not a number")
    if not f.low <= v <= f.high:
        raise ScheduleError(
            f"cron {f.name} field: {v} in {element!r} is out of range {f.low}-{f.high}"
        )
    return v


def _expand(f: _Field, text: str) -> set[int]:
    """The values one field's text selects (day-of-week 7 folded onto 0)."""
    values: set[int] = set()
    for element in text.split(","):
        if element == "?" and f.name in ("day-of-month", "day-of-week"):
            values.update(range(f.low, f.top + 1))
            continue
        m = _ELEMENT.fullmatch(element)
        if m is None:
            hint = " ('?' only stands alone in the day fields)" if "?" in element else ""
            raise ScheduleError(f"cron {f.name} field: cannot read {element!r}{hint}")
        step = 1
        if m["step"] is not None:
            step = int(m["step"])
            span = f.top - f.low + 1
            if not 1 <= step <= span:
                raise ScheduleError(
                    f"cron {f.name} field: step {step} in {element!r} is out of range 1-{span}"
                )
        if m["star"]:
            lo, hi = f.low, f.top
        else:
            lo = _value(f, m["lo"], element)
            if m["hi"] is not None:
                hi = _value(f, m["hi"], element)
                if hi == 0 < lo and f.high == 7 and not m["hi"].isdigit():
                    hi = 7  # FRI-SUN: Sunday as the end of a week
                if hi < lo:
                    raise ScheduleError(
                        f"cron {f.name} field: range {element!r} is reversed "
                        "(ranges run low to high; for a wrap use a list like 22-23,0-2)"
                    )
            elif m["step"] is not None:
                hi = max(lo, f.top)  # a/n: from a to the field's end
            else:
                hi = lo
        values.update(range(lo, hi + 1, step))
    if f.name == "day-of-week" and 7 in values:
        values.discard(7)
        values.add(0)
    return values


@dataclass(frozen=True, eq=False)
class Cron:
    """A cron expression matched against the wall clock of ``zone`` (see the module docstring).

    Build one with ``Cron.parse``; the fields are the expanded value sets, sorted.
    """

    expression: str
    zone: zoneinfo.ZoneInfo
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: tuple[int, ...]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day-of-month is * or ?
    any_weekday: bool  # day-of-week is * or ?

    @classmethod
    def parse(cls, expr: str, zone: zoneinfo.ZoneInfo) -> Cron:
        """Read ``expr``; ``ScheduleError`` naming the field when it cannot be used."""
        if not isinstance(expr, str) or len(expr) > MAX_EXPRESSION:
            raise ScheduleError(f"cron expression: at most {MAX_EXPRESSION} characters")
        text = " ".join(expr.split())
        if text.startswith("@"):
            if text.lower() not in _ALIASES:
                hint = " (for an interval use every)" if text.lower().startswith("@every") else ""
                raise ScheduleError(
                    f"cron expression {text!r}: unknown alias{hint}; known: " + ", ".join(_ALIASES)
                )
            parts = _ALIASES[text.lower()].split(" ")
        else:
            parts = text.split(" ")
            if len(parts) == 5:
                parts = ["0", *parts]
            elif len(parts) != 6:
                raise ScheduleError(
                    f"cron expression {text!r}: expected 5 fields (minute hour day-of-month "
                    "month day-of-week) or 6 (second first)"
                )
        sets = [sorted(_expand(f, p)) for f, p in zip(_FIELDS, parts, strict=True)]
        cron = cls(
            expression=text,
            zone=zone,
            seconds=tuple(sets[0]),
            minutes=tuple(sets[1]),
            hours=tuple(sets[2]),
            days=frozenset(sets[_DOM]),
            months=tuple(sets[4]),
            weekdays=frozenset(sets[_DOW]),
            any_day=parts[_DOM] in ("*", "?"),
            any_weekday=parts[_DOW] in ("*", "?"),
        )
        if cron.any_weekday and not cron.any_day:
            if not any(d <= _DAYS_IN_MONTH[m - 1] for m in cron.months for d in cron.days):
                raise ScheduleError(
                    f"cron expression {text!r}: day-of-month {parts[_DOM]!r} never occurs in "
                    f"month {parts[4]!r}, so it never fires"
                )
        if cron.next_after(_PROBE_START) is None:  # belt and braces: the check above is exact
            raise ScheduleError(f"cron expression {text!r} never fires")
        return cron

    def describe(self) -> str:
        return f"cron {self.expression} ({self.zone.key})"

    def next_after(self, after: float) -> float | None:
        if not math.isfinite(after):
            raise ValueError(f"next_after: {after!r} is not an instant")
        first = math.floor(after) + 1  # the earliest instant that may fire
        try:
            # The wall time right after the one at first - 1: the first gap wall time when
            # ``first`` is a spring-forward (those fire at ``first``), the end of the first pass
            # when it is a fall-back (the second pass fires nothing).
            wall = _wall(first - 1, self.zone) + _SECOND
        except (OverflowError, OSError, ValueError):
            return None
        last_year = min(wall.year + 6, 9998)
        while True:
            found = self._next_wall(wall, last_year)
            if found is None:
                return None
            instant, resume = self._instant(found)
            if instant >= first:
                return float(instant) if instant - after <= HORIZON else None
            wall = resume

    def _day_matches(self, day: int, weekday: int) -> bool:
        if self.any_day:
            return self.any_weekday or weekday in self.weekdays
        if self.any_weekday:
            return day in self.days
        return day in self.days or weekday in self.weekdays

    def _next_time(self, h: int, m: int, s: int) -> tuple[int, int, int] | None:
        """The first matching time of day at or after ``h:m:s``, if any."""
        hours, minutes, seconds = self.hours, self.minutes, self.seconds
        i = bisect_left(hours, h)
        if i < len(hours) and hours[i] == h:
            j = bisect_left(minutes, m)
            if j < len(minutes) and minutes[j] == m:
                k = bisect_left(seconds, s)
                if k < len(seconds):
                    return h, m, seconds[k]
                j += 1
            if j < len(minutes):
                return h, minutes[j], seconds[0]
            i += 1
        if i < len(hours):
            return hours[i], minutes[0], seconds[0]
        return None

    def _next_wall(self, wall: datetime, last_year: int) -> datetime | None:
        """The first matching wall time at or after ``wall`` (naive), up to ``last_year``."""
        y, mo, d = wall.year, wall.month, wall.day
        start: tuple[int, int, int] | None = (wall.hour, wall.minute, wall.second)
        months = self.months
        while y <= last_year:
            i = bisect_left(months, mo)
            if i == len(months):
                y, mo, d, start = y + 1, months[0], 1, None
                continue
            if months[i] != mo:
                mo, d, start = months[i], 1, None
            first_weekday, ndays = monthrange(y, mo)  # Monday = 0
            while d <= ndays:
                if self._day_matches(d, (first_weekday + d) % 7):  # cron: Sunday = 0
                    if start is None:
                        t: tuple[int, int, int] | None = (
                            self.hours[0],
                            self.minutes[0],
                            self.seconds[0],
                        )
                    else:
                        t = self._next_time(*start)
                    if t is not None:
                        return datetime(y, mo, d, *t)
                d, start = d + 1, None
            mo, d, start = mo + 1, 1, None
            if mo > 12:
                y, mo = y + 1, 1
        return None

    def _instant(self, wall: datetime) -> tuple[int, datetime]:
        """The instant a matching wall time fires at, and the wall time to search on from if
        that instant is too early."""
        t0 = int(wall.replace(tzinfo=self.zone).timestamp())  # fold=0: the earlier offset
        t1 = int(wall.replace(tzinfo=self.zone, fold=1).timestamp())
        if t0 == t1:
            return t0, wall + _SECOND
        if t0 < t1:  # repeated by a fall-back: its first occurrence; skip the second pass
            jump = _transition(t0, t1, self.zone)
            return t0, max(_wall(jump - 1, self.zone) + _SECOND, wall + _SECOND)
        jump = _transition(t1, t0, self.zone)  # skipped by a spring-forward: the jump
        return jump, _wall(jump, self.zone)


def _wall(instant: int, zone: zoneinfo.ZoneInfo) -> datetime:
    return datetime.fromtimestamp(instant, zone).replace(tzinfo=None)


def _transition(lo: int, hi: int, zone: zoneinfo.ZoneInfo) -> int:
    """The first instant in ``(lo, hi]`` whose UTC offset differs from ``lo``'s (bisection)."""
    before = datetime.fromtimestamp(lo, zone).utcoffset()
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, zone).utcoffset() == before:
            lo = mid
        else:
            hi = mid
    return hi


def calendar(
    *, cron: str | None = None, every: str | int | None = None, timezone: str = "UTC"
) -> Calendar:
    """The calendar of a schedule spec: exactly one of ``cron`` or ``every``.

    ``timezone`` is validated either way but only ``cron`` reads it (``every`` is elapsed time).
    """
    if (cron is None) == (every is None):
        raise ScheduleError("a schedule needs exactly one of cron or every")
    zone = load_zone(timezone)
    if cron is not None:
        return Cron.parse(cron, zone)
    if isinstance(every, str):
        return Every(parse_duration(every))
    if isinstance(every, bool) or not isinstance(every, int):
        raise ScheduleError(f"interval {every!r}: expected whole seconds or a duration text")
    return Every(every)


def fires_between(cal: Calendar, after: float, until: float, limit: int) -> list[float]:
    """The fire instants in ``(after, until]``, ascending: the LAST ``limit`` of them.

    A catch-up wants the newest fires, so the search starts near ``until`` and widens backwards
    (doubling) until it holds ``limit`` fires or reaches ``after``: the cost follows ``limit``,
    not the length of the outage.
    """
    if limit <= 0 or not until > after:
        return []
    if isinstance(cal, Every):
        s = cal.seconds
        last = math.floor(until) // s * s
        start = max(math.floor(after) // s * s + s, last - (limit - 1) * s)
        return [float(t) for t in range(start, last + 1, s)]
    width = 1.0
    while True:
        lo = max(after, until - width)
        fires: deque[float] = deque(maxlen=limit)
        t = cal.next_after(lo)
        while t is not None and t <= until:
            fires.append(t)
            t = cal.next_after(t)
        if len(fires) == limit or lo == after:
            return list(fires)
        width *= 2
