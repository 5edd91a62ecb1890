"""The rules of a schedule's record, as a worker applies them (pure).

Whether a stored record can be acted on at all (``record_fault``: anyone may publish on its
subject on a deployment without authentication), whether it is what a fire armed from it
expects (``expected``), what it becomes after a fire or a trigger (``after``), and whether a
schedule's input fits its agent (``input_error``, ``check_input``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from sojourn.schemas.errors import InvalidName
from sojourn.schemas.names import validate_token
from sojourn.schemas.schedules import (
    JITTER_MAX,
    FireOutcome,
    ScheduleCounts,
    ScheduleRecord,
    ScheduleSpec,
)

from ..agents.agent import Agent
from ..core.cron import Calendar, ScheduleError
from .refusals import Rejected

__all__ = ["after", "check_input", "expected", "fits", "input_error", "record_fault"]

_TIME_MAX = 253_402_300_799.0
"""9999-12-31T23:59:59Z: the last time a message schedule can be armed for."""

_COUNT_MAX = 2**63
"""Revisions and counts a record may hold (one more is still a 64-bit integer)."""


def record_fault(
    rec: ScheduleRecord, name: str, calendar: Callable[[ScheduleSpec], Calendar]
) -> str | None:
    """Why a stored record cannot be acted on, ``None`` when it can.

    The record is the broker's copy of what a worker wrote, but on a deployment without
    authentication anyone may publish on its subject: whatever it holds must not make a
    fire or a request fail on every delivery (a subject or a time it cannot be armed at,
    a calendar that cannot be read). ``calendar``: the worker's calendar of a spec."""
    if rec.name != name:
        return f"it names another schedule ({rec.name[:100]!r})"
    try:
        validate_token(rec.spec.agent, "agent name")
        for run_id in (*rec.last_runs, rec.last_run_id, rec.last_cancelled):
            if run_id is not None:
                validate_token(run_id, "run id")
        calendar(rec.spec)
    except (InvalidName, ScheduleError) as e:
        return str(e)
    if not 0 <= rec.spec.jitter <= JITTER_MAX:
        return f"jitter {rec.spec.jitter!r} is out of range"
    times = (rec.next_fire_at, rec.last_fire_at, rec.created_at, rec.updated_at)
    if any(t is not None and not 0 <= t <= _TIME_MAX for t in times):
        return "a time is out of range"
    c = rec.counts
    if not all(
        0 <= n < _COUNT_MAX for n in (rec.revision, c.started, c.skipped, c.missed, c.failed)
    ):
        return "a count is out of range"
    return None


def expected(rec: ScheduleRecord, revision: int, fire_at: float, agent: str) -> bool:
    """Whether ``rec`` is what a record must be for this fire to be handled normally."""
    return (
        rec.spec.agent == agent
        and rec.revision == revision
        and not rec.paused
        and rec.next_fire_at == fire_at
        and (rec.last_fire_at is None or rec.last_fire_at < fire_at)
    )


def fits(agent: Agent[Any, Any], spec: ScheduleSpec) -> bool:
    """Whether the schedule's input fits its agent."""
    return input_error(agent, spec) is None


def input_error(agent: Agent[Any, Any], spec: ScheduleSpec) -> str | None:
    """Why the schedule's input does not fit its agent, ``None`` when it does."""
    try:
        agent.decode_input(bytes(spec.input))
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        return f"input does not match agent '{agent.name}': {e}"
    return None


def check_input(agent: Agent[Any, Any], spec: ScheduleSpec) -> None:
    """Refuse (``Rejected``: ``invalid_input``) a schedule whose input does not fit its agent."""
    why = input_error(agent, spec)
    if why is not None:
        raise Rejected("invalid_input", why)


def after(
    rec: ScheduleRecord,
    now: float,
    *,
    started: list[str],
    skipped: int = 0,
    missed: int = 0,
    failed: int = 0,
    outcome: FireOutcome,
    chain: bool,
    newest: float | None = None,
    next_at: float | None = None,
    cancelled: str | None = None,
) -> ScheduleRecord:
    """``rec`` after a fire (``chain``: by its timer, which moves the schedule on) or a
    trigger."""
    c = rec.counts
    counts = ScheduleCounts(
        started=c.started + len(started),
        skipped=c.skipped + skipped,
        missed=c.missed + missed,
        failed=c.failed + failed,
    )
    return msgspec.structs.replace(
        rec,
        updated_at=now,
        last_fire_at=newest if chain else rec.last_fire_at,
        next_fire_at=next_at if chain else rec.next_fire_at,
        last_runs=tuple(started) if chain else rec.last_runs,
        last_cancelled=cancelled if chain else rec.last_cancelled,
        last_run_id=started[-1] if started else rec.last_run_id,
        last_outcome=outcome,
        counts=counts,
    )
