"""Schedules as broker-kept state: each schedule's record, and its next fire.

The record of schedule ``<name>`` is the one message on ``<prefix>.schedule.rec.<name>``
(the stream keeps one per subject); every change is a compare-and-set on that subject's
sequence, so two workers handling the same fire, or a fire racing a ``pause``, serialize
there. The next fire is a one-shot message schedule on ``<prefix>.schedule.timer.<name>``
(``@at``) that the broker turns, when due, into a message on
``<prefix>.schedule.fire.<agent>.<name>`` carrying the nominal fire time and the revision it
was armed under. Publishing again on the timer subject replaces it; purging it disarms it.
No process needs to be alive for a fire to be stored.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

import msgspec

from sojourn.schemas.codec import decode_schedule_record, encode
from sojourn.schemas.errors import ConcurrencyConflict, HistoryError
from sojourn.schemas.schedules import ScheduleRecord

from . import headers as h
from .connection import Broker, JetStreamError
from .delivery import StoredMessage
from .names import Names
from .timers import rfc3339

__all__ = [
    "FIRE_AT",
    "REVISION",
    "FireHeaders",
    "ScheduleStore",
    "fire_headers",
]

FIRE_AT = "Sojourn-Fire-At"
"""On a fire: its nominal time, Unix seconds (a whole number)."""
REVISION = "Sojourn-Schedule-Revision"
"""On a fire: the schedule's revision it was armed under."""

log = logging.getLogger("sojourn.schedules")

_FENCE_BROKEN = 10071


class FireHeaders(msgspec.Struct, frozen=True, kw_only=True):
    """What a fire message says, validated (its headers are the broker's copy of ours)."""

    fire_at: float
    revision: int


def fire_headers(headers: dict[str, str]) -> FireHeaders | None:
    """The fire time and revision of a fire message; ``None`` when they are not both whole,
    non-negative numbers (anything else published on a fire subject is not a fire)."""
    at, rev = headers.get(FIRE_AT, ""), headers.get(REVISION, "")
    if not (0 < len(at) <= 12 and at.isdigit() and 0 < len(rev) <= 12 and rev.isdigit()):
        return None
    return FireHeaders(fire_at=float(int(at)), revision=int(rev))


class ScheduleStore:
    """Reads and writes schedules' records and timers in ``<PREFIX>_SCHEDULES``."""

    def __init__(self, broker: Broker, names: Names) -> None:
        self.broker = broker
        self.names = names
        self.stream = names.schedules_stream

    def _decode(self, m: StoredMessage) -> ScheduleRecord:
        try:
            return decode_schedule_record(m.data)
        except msgspec.DecodeError as e:
            raise HistoryError(f"schedule record {m.subject!r} cannot be read: {e}") from e

    async def get(self, name: str) -> tuple[ScheduleRecord, int] | None:
        """Schedule ``name``'s record and its sequence (for a compare-and-set), or ``None``."""
        m = await self.broker.direct_get_last(self.stream, self.names.schedule_record(name))
        if m is None or not m.data:
            return None
        return self._decode(m), m.seq

    async def all(self) -> list[ScheduleRecord]:
        """Every schedule's record, by name. A record that cannot be read (anyone may publish
        on a deployment without authentication) is logged and left out: it hides no other
        schedule, and ``get`` still names it."""
        msgs = await self.broker.direct_get_range(self.stream, self.names.schedule_records_all)
        last: dict[str, StoredMessage] = {}
        for m in msgs:
            if m.data:
                last[m.subject] = m
        records = []
        for m in last.values():
            try:
                records.append(self._decode(m))
            except HistoryError as e:
                log.warning("%s; left out of the list", e.message)
        return sorted(records, key=lambda r: r.name)

    async def put(self, record: ScheduleRecord, expected_seq: int) -> int:
        """Write ``record`` if the subject's last sequence is still ``expected_seq`` (0: the
        schedule must not exist); returns the new sequence.

        Raises:
            ConcurrencyConflict: someone wrote the record meanwhile (read it again).
        """
        subject = self.names.schedule_record(record.name)
        headers = {h.EXPECTED_LAST_SUBJECT_SEQUENCE: str(expected_seq)}
        result = await self.broker.try_publish(subject, encode(record), headers)
        if isinstance(result, JetStreamError):
            if result.err_code == _FENCE_BROKEN:
                raise ConcurrencyConflict(
                    f"schedule {record.name!r} changed meanwhile",
                    run_id=record.name,
                    expected=expected_seq,
                )
            raise result
        return result.seq

    async def arm(self, record: ScheduleRecord, fire_at: float, due_at: float) -> None:
        """Arm ``record``'s next fire: nominal time ``fire_at``, stored by the broker at
        ``due_at`` (``fire_at`` plus its jitter), for the agent's fire consumer. Replaces the
        pending one."""
        headers = {
            h.SCHEDULE: f"@at {rfc3339(due_at)}",
            h.SCHEDULE_TARGET: self.names.schedule_fire(record.spec.agent, record.name),
            FIRE_AT: str(math.floor(fire_at)),
            REVISION: str(record.revision),
        }
        await self.broker.publish(self.names.schedule_timer(record.name), b"", headers)

    async def disarm(self, name: str) -> None:
        """Remove schedule ``name``'s pending fire, if any."""
        await self._purge(self.names.schedule_timer(name))

    async def remove_fire(self, agent: str, name: str) -> None:
        """Remove a stored fire of schedule ``name`` for ``agent`` (its agent before a
        replace): the fire consumer of that agent would otherwise take it for nothing."""
        await self._purge(self.names.schedule_fire(agent, name))

    async def remove(self, name: str, agents: Iterable[str]) -> None:
        """Remove everything the broker keeps of schedule ``name``: its pending fire, any
        stored fire (under each agent it ever had: ``agents``), then its record."""
        await self.disarm(name)
        for agent in set(agents):
            await self._purge(self.names.schedule_fire(agent, name))
        await self._purge(self.names.schedule_record(name))

    async def _purge(self, subject: str) -> None:
        await self.broker.api(f"$JS.API.STREAM.PURGE.{self.stream}", {"filter": subject})
