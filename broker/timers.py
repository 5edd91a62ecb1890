"""Durable timers: JetStream message schedules that wake a run when its deadline passes.

A timer is one message on ``<prefix>.timer.<run_id>.<timer_id>`` carrying
``Nats-Schedule: @at <RFC3339>`` and ``Nats-Schedule-Target: <prefix>.wake.<agent>.<run_id>``. The
broker keeps it (it survives restarts; an overdue one fires right after start-up) and, when it
is due, publishes a wake. No process waits. Publishing again on the same subject replaces the
timer (the stream keeps one message per subject). A fired timer is only a wake: the run's
history decides whether anything is due, so a stale or duplicated firing is a no-op.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sojourn.schemas.vocabulary import wake_reason

from . import headers as h
from .connection import Broker, JetStreamError
from .names import Names

__all__ = ["cancel_timers", "rfc3339", "schedule_timer"]


def rfc3339(ts: float) -> str:
    """Unix seconds as RFC 3339 UTC with millisecond precision (what ``@at`` accepts)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


async def schedule_timer(
    broker: Broker,
    names: Names,
    run_id: str,
    timer_id: str,
    deadline: float,
    *,
    agent: str | None,
) -> int:
    """Create or replace the timer ``timer_id`` of ``run_id``; returns its stream sequence.
    It fires a wake routed to ``agent``'s workers (``None``: to any worker)."""
    headers = {
        h.SCHEDULE: f"@at {rfc3339(deadline)}",
        h.SCHEDULE_TARGET: names.wake(run_id, agent),
        h.WAKE_REASON: wake_reason("timer"),
    }
    ack = await broker.publish(names.timer(run_id, timer_id), b"", headers)
    return ack.seq


async def cancel_timers(broker: Broker, names: Names, run_id: str) -> None:
    """Remove every pending timer of ``run_id`` (when the run ends). Best effort."""
    try:
        await broker.api(
            f"$JS.API.STREAM.PURGE.{names.wake_stream}",
            {"filter": f"{names.prefix}.timer.{run_id}.*"},
        )
    except JetStreamError:
        pass
