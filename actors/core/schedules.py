"""What one fire of a schedule does: pure decisions, no I/O (the scheduler carries them out).

A fire names its nominal time. Handled at ``now``, every fire time from it to ``now`` is due:
one when all is well, several when the broker or every worker was down. The catch-up policy
picks which of them start runs; the rest are missed. The overlap policy, which needs to know
whether the previous run is live, is applied by the caller to what this returns. The run a fire
time starts has an id derived from the schedule and that time, so whoever handles it, however
often, it is one run.
"""

from __future__ import annotations

import calendar as _calendar
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from sojourn.schemas.names import SCHEDULED_RUN_ID
from sojourn.schemas.schedules import CATCH_UP_MAX, JITTER_MAX, CatchUp, ScheduleSpec

from .cron import Calendar, ScheduleError, calendar

__all__ = [
    "MISSED_COUNT_MAX",
    "ON_TIME",
    "FirePlan",
    "calendar_of",
    "check_spec",
    "fire_time_of",
    "jitter_of",
    "plan_fire",
    "run_id_for",
]


ON_TIME = 60.0
"""Seconds late a fire may be handled and still count as on time (``catch_up="none"``)."""

MISSED_COUNT_MAX = 10_000
"""Missed fire times one late fire counts at most (a day down under a one-second schedule is
counted as 10,000)."""


def run_id_for(name: str, fire_at: float) -> str:
    """The id of the run that fire time ``fire_at`` of schedule ``name`` starts:
    ``<name>-at<YYYYMMDDTHHMMSS>Z`` (UTC, whole seconds)."""
    return f"{name}-at{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(int(fire_at)))}"


def fire_time_of(run_id: str) -> float | None:
    """The fire time in a scheduled run's id (``<schedule>-at<YYYYMMDDTHHMMSS>Z``)."""
    if not SCHEDULED_RUN_ID.fullmatch(run_id):
        return None
    at = run_id.rindex("-at")
    stamp = run_id[at + 3 : at + 18]
    try:
        return float(_calendar.timegm(time.strptime(stamp, "%Y%m%dT%H%M%S")))
    except ValueError:
        return None


def jitter_of(name: str, fire_at: float, jitter: float) -> float:
    """How long after its nominal time fire ``fire_at`` happens: a fraction of ``jitter``
    that depends only on the schedule and the fire time (whoever arms it, it is the same)."""
    if jitter <= 0:
        return 0.0
    digest = hashlib.sha256(f"{name}@{int(fire_at)}".encode()).digest()
    return round(int.from_bytes(digest[:8], "big") / 2**64 * jitter, 3)


def calendar_of(spec: ScheduleSpec) -> Calendar:
    """The fire times of ``spec``.

    Raises:
        ScheduleError: the expression, interval or zone cannot be used (the message says why).
    """
    if (spec.cron is None) == (spec.every is None):
        raise ScheduleError("a schedule has exactly one of cron and every")
    return calendar(cron=spec.cron, every=spec.every, timezone=spec.timezone)


def check_spec(spec: ScheduleSpec, now: float) -> Calendar:
    """Validate everything about ``spec`` that does not need its agent's code; return its
    calendar.

    Raises:
        ScheduleError: what is wrong, for the user.
    """
    cal = calendar_of(spec)
    if not 0 <= spec.jitter <= JITTER_MAX or spec.jitter != spec.jitter:
        raise ScheduleError(f"jitter must be from 0 to {JITTER_MAX:g} seconds")
    if spec.every is not None and spec.jitter >= spec.every:
        raise ScheduleError(
            f"jitter ({spec.jitter:g} s) must be less than the interval ({spec.every} s)"
        )
    if cal.next_after(now) is None:
        raise ScheduleError(f"{cal.describe()} has no fire time in the next five years")
    return cal


@dataclass(frozen=True, slots=True)
class FirePlan:
    """What one fire does, before the overlap policy.

    Attributes:
        start: fire times to start a run for, ascending.
        missed: how many due fire times the catch-up policy drops.
        newest: the newest fire time this fire handles (the schedule's ``last_fire_at``).
        next_at: the nominal time of the fire to arm next, ``None`` if there is none.
    """

    start: tuple[float, ...]
    missed: int
    newest: float
    next_at: float | None


def plan_fire(
    cal: Calendar,
    catch_up: CatchUp,
    fire_at: float,
    now: float,
    delay_of: Callable[[float], float] = lambda _t: 0.0,
) -> FirePlan:
    """Decide what the fire of nominal time ``fire_at``, handled at ``now``, starts.
    ``delay_of(t)``: the jitter of fire time ``t`` (a fire is on time until ``ON_TIME`` after
    its nominal time plus its jitter)."""
    due: list[float] = [fire_at]
    dropped = 0  # due fire times too old to be started (beyond the CATCH_UP_MAX + 1 newest)
    skipped_ahead = False
    t = cal.next_after(fire_at)
    while t is not None and t <= now:
        due.append(t)
        if len(due) > CATCH_UP_MAX + 1:
            due.pop(0)
            dropped += 1
            if dropped >= MISSED_COUNT_MAX and not skipped_ahead:
                # Counted enough one by one: only the newest fire times can start runs, so
                # walk on from a day before now (or the newest seen, if later).
                skipped_ahead = True
                t = cal.next_after(max(due[-1], now - 86_400.0))
                if t is not None and t <= now:
                    due.clear()
                continue
        t = cal.next_after(t)
    newest = due[-1]
    next_at = cal.next_after(max(now, newest))
    if catch_up == "all":
        start = due[-CATCH_UP_MAX:]
    elif catch_up == "latest":
        start = due[-1:]
    else:
        start = due[-1:] if now - (newest + delay_of(newest)) <= ON_TIME else []
    missed = len(due) - len(start) + min(dropped, MISSED_COUNT_MAX)
    return FirePlan(start=tuple(start), missed=missed, newest=newest, next_at=next_at)


__all__ += ["ScheduleError"]
