"""Shared rate limits' records in the agents stream: ``<prefix>.limit.<name>``, one message per
subject, every write a compare-and-set on the subject's last sequence (decision 0046)."""

from __future__ import annotations

import logging

import msgspec

from sojourn.schemas.codec import decode_limit_record, encode
from sojourn.schemas.errors import ConcurrencyConflict
from sojourn.schemas.limits import LimitRecord, valid_limit_name

from . import headers as h
from .connection import Broker, JetStreamError
from .delivery import StoredMessage
from .names import Names

__all__ = ["LimitStore", "read_limit"]

log = logging.getLogger("sojourn.broker.limits")

_FENCE_BROKEN = 10071
"""JetStream's error code for a failed ``Nats-Expected-Last-Subject-Sequence``."""


def read_limit(m: StoredMessage, name: str | None = None) -> LimitRecord | None:
    """The record a stored message holds, or ``None`` for one that is not a limit's record of
    the subject it sits on (anyone may publish on a deployment without authentication)."""
    try:
        rec = decode_limit_record(m.data)
    except msgspec.MsgspecError:
        return None
    want = name if name is not None else m.subject.rpartition(".")[2]
    if rec.name != want or not valid_limit_name(rec.name):
        return None
    return rec


class LimitStore:
    """Reads and writes the limits' records."""

    def __init__(self, broker: Broker, names: Names) -> None:
        self.broker = broker
        self.names = names
        self.stream = names.agents_stream

    async def get(self, name: str) -> tuple[LimitRecord | None, int]:
        """Limit ``name``'s record (``None``: none, or one that cannot be read, which the next
        write replaces) and the subject's last sequence (0: nothing stored)."""
        m = await self.broker.direct_get_last(self.stream, self.names.limit(name))
        if m is None:
            return None, 0
        rec = read_limit(m, name)
        if rec is None:
            log.warning("the record of limit %r is not a limit's record: replaced", name)
        return rec, m.seq

    async def all(self) -> list[LimitRecord]:
        """Every limit's record, by name (unreadable ones left out, and logged)."""
        msgs = await self.broker.direct_get_range(self.stream, self.names.limits_all)
        last: dict[str, StoredMessage] = {m.subject: m for m in msgs}
        records = []
        for m in last.values():
            rec = read_limit(m)
            if rec is None:
                log.warning("%s does not hold a limit's record: left out", m.subject)
            else:
                records.append(rec)
        return sorted(records, key=lambda r: r.name)

    async def put(self, record: LimitRecord, expected_seq: int) -> int:
        """Write ``record`` if its subject's last sequence is still ``expected_seq`` (0: no
        record yet); returns the new sequence.

        Raises:
            ConcurrencyConflict: someone wrote the record meanwhile (read it again).
        """
        headers = {h.EXPECTED_LAST_SUBJECT_SEQUENCE: str(expected_seq)}
        result = await self.broker.try_publish(
            self.names.limit(record.name), encode(record), headers
        )
        if isinstance(result, JetStreamError):
            if result.err_code == _FENCE_BROKEN:
                raise ConcurrencyConflict(
                    f"limit {record.name!r} changed meanwhile",
                    run_id=record.name,
                    expected=expected_seq,
                )
            raise result
        return result.seq
