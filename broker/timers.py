"""Durable timers: JetStream message schedules that wake a run when its deadline passes.

A timer is one message on ``<prefix>.timer.<run_id>.<timer_id>`` carrying
``Nats-Schedule: @at <RFC3339>`` and ``Nats-Schedule-Target: <prefix>.wake.<agent>.<run_id>``. The
broker keeps it (it survives restarts; an overdue one fires right after start-up) and, when it
is due, publishes a wake. No process waits. Publishing again on the same subject replaces the
timer (the stream keeps one message per subject). A fired timer is only a wake: the run's
history decides whether anything is due, so a stale or duplicated firing is a no-op.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import msgspec

from sojourn.schemas.fairness import Fairness, fairness_headers
from sojourn.schemas.priority import PRIORITY_DEFAULT, Priority
from sojourn.schemas.vocabulary import wake_reason

from . import headers as h
from .connection import Broker, JetStreamError
from .delivery import StoredMessage
from .names import Names

__all__ = [
    "StoredTimer",
    "cancel_timers",
    "due_at",
    "fire_timer",
    "rfc3339",
    "schedule_timer",
    "stored_timers",
]


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
    priority: Priority = PRIORITY_DEFAULT,
    fairness: Fairness | None = None,
) -> int:
    """Create or replace the timer ``timer_id`` of ``run_id``; returns its stream sequence.
    It fires a wake routed to ``agent``'s workers (``None``: to any worker), on the lane of the
    run's ``priority``, carrying its ``fairness`` key (the broker copies a schedule's headers
    onto what it fires)."""
    headers = {
        **fairness_headers(fairness),
        h.SCHEDULE: f"@at {rfc3339(deadline)}",
        h.SCHEDULE_TARGET: names.wake(run_id, agent, priority),
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


class StoredTimer(msgspec.Struct, frozen=True):
    """A message schedule the broker keeps (a run's timer or a schedule's next fire): where it
    is stored, when it is due, and the message it is."""

    stream: str
    due: float
    message: StoredMessage


def due_at(spec: str) -> float | None:
    """The time a ``Nats-Schedule`` of the form ``@at <RFC 3339>`` names; ``None`` for any other
    schedule or an unreadable one."""
    if not spec.startswith("@at "):
        return None
    try:
        return datetime.fromisoformat(spec[4:].replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


async def stored_timers(broker: Broker, names: Names) -> list[StoredTimer]:
    """Every one-shot message schedule sojourn has stored now (runs' timers, schedules' next
    fires), earliest first."""
    found: list[StoredTimer] = []
    for stream, subjects in (
        (names.wake_stream, f"{names.prefix}.timer.*.*"),
        (names.schedules_stream, names.schedule_timer("*")),
    ):
        for m in await broker.direct_get_range(stream, subjects):
            due = due_at(m.header(h.SCHEDULE))
            if due is not None and m.header(h.SCHEDULE_TARGET):
                found.append(StoredTimer(stream, due, m))
    found.sort(key=lambda t: t.due)
    return found


async def fire_timer(broker: Broker, names: Names, timer: StoredTimer) -> None:
    """Have ``timer`` fire now, though the broker's clock has not reached its time (a test
    environment's virtual clock has). A run's timer is a wake: its message is published to
    its target as the broker would (its headers less the schedule's) and the timer removed.
    A schedule's fire must carry the broker's own ``Nats-Scheduler`` (no client may set it):
    it is armed again for now, and the broker fires it on its next tick. Should the broker
    fire a timer too, that is one more wake (a hint) or a fire already handled."""
    m = timer.message
    if timer.stream != names.wake_stream:
        headers = {
            k: v
            for k, v in m.headers.items()
            if k == h.SCHEDULE_TARGET or not k.startswith("Nats-")
        }
        headers[h.SCHEDULE] = f"@at {rfc3339(time.time())}"
        await broker.publish(m.subject, m.data, headers)
        return
    headers = {k: v for k, v in m.headers.items() if not k.startswith("Nats-")}
    await broker.publish(m.header(h.SCHEDULE_TARGET), m.data, headers)
    try:
        await broker.api(
            f"$JS.API.STREAM.MSG.DELETE.{timer.stream}", {"seq": m.seq, "no_erase": True}
        )
    except JetStreamError:
        pass  # replaced or removed meanwhile, or fired by the broker
