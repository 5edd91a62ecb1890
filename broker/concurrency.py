"""Concurrency keys as broker-kept state (decision 0048): each key's slots record and its
queue, in the schedules stream (one message per subject).

Under ``<prefix>.schedule.flow.``, per agent and key (the key hashed: ``key_token``):

- ``slots.<agent>.<token>``: the runs holding a slot of the key (``SlotsRecord``), every
  write a compare-and-set on the subject's sequence;
- ``queue.<agent>.<token>.<run_id>``: a run waiting for a slot (``QueueEntry``), written
  create-only; its stream sequence is its place in the queue, so the oldest entry of the key
  is the first message matching ``queue.<agent>.<token>.*`` (a direct get), and a run's
  position is how many match before it (two counted direct gets, whatever the depth). An
  entry is removed (purged by subject) when its run is admitted or ends.
"""

from __future__ import annotations

import logging

import msgspec

from sojourn.schemas.codec import decode_queue_entry, decode_slots_record, encode
from sojourn.schemas.concurrency import QueueEntry, SlotsRecord
from sojourn.schemas.errors import ConcurrencyConflict

from . import headers as h
from .connection import Broker, JetStreamError
from .names import Names

__all__ = ["ConcurrencyStore", "Head"]

_FENCE_BROKEN = 10071

log = logging.getLogger("sojourn.concurrency")

Head = tuple[QueueEntry | None, int, str]
"""The oldest entry of a key's queue, its sequence and subject (``None`` with a sequence: an
entry that cannot be read, to be removed; ``(None, 0, "")``: the queue is empty)."""


class ConcurrencyStore:
    """Reads and writes concurrency keys' slots records and queues in ``<PREFIX>_SCHEDULES``."""

    def __init__(self, broker: Broker, names: Names) -> None:
        self.broker = broker
        self.names = names
        self.stream = names.schedules_stream

    def slots_subject(self, agent: str, token: str) -> str:
        return f"{self.names.prefix}.schedule.flow.slots.{agent}.{token}"

    def queue_subject(self, agent: str, token: str, run_id: str = "*") -> str:
        return f"{self.names.prefix}.schedule.flow.queue.{agent}.{token}.{run_id}"

    # --- slots ---------------------------------------------------------------------------------

    async def slots(self, agent: str, token: str) -> tuple[SlotsRecord | None, int]:
        """The key's slots record and its sequence (0: none). A record that cannot be read (no
        worker wrote it: anyone may publish on a deployment without authentication) is
        ``None`` with its sequence, so it is written over."""
        m = await self.broker.direct_get_last(self.stream, self.slots_subject(agent, token))
        if m is None:
            return None, 0
        try:
            return decode_slots_record(m.data), m.seq
        except msgspec.MsgspecError as e:
            log.warning("slots record %r cannot be read (%s): written over", m.subject, e)
            return None, m.seq

    async def put_slots(self, token: str, record: SlotsRecord, expected_seq: int) -> int:
        """Write ``record`` if the key's record is still at ``expected_seq`` (0: none).

        Raises:
            ConcurrencyConflict: written meanwhile (read it again).
        """
        subject = self.slots_subject(record.agent, token)
        headers = {h.EXPECTED_LAST_SUBJECT_SEQUENCE: str(expected_seq)}
        result = await self.broker.try_publish(subject, encode(record), headers)
        if isinstance(result, JetStreamError):
            if result.err_code == _FENCE_BROKEN:
                raise ConcurrencyConflict(
                    f"{subject} changed meanwhile", run_id=record.key[:64], expected=expected_seq
                )
            raise result
        return result.seq

    # --- the queue -----------------------------------------------------------------------------

    async def enqueue(self, token: str, entry: QueueEntry) -> int:
        """Put ``entry`` in its key's queue (create-only: a run already queued keeps its place)
        and return its sequence, the run's ticket."""
        subject = self.queue_subject(entry.agent, token, entry.run_id)
        headers = {h.EXPECTED_LAST_SUBJECT_SEQUENCE: "0"}
        result = await self.broker.try_publish(subject, encode(entry), headers)
        if isinstance(result, JetStreamError):
            if result.err_code == _FENCE_BROKEN:
                there = await self.broker.direct_get_last(self.stream, subject)
                if there is not None:
                    return there.seq
            raise result
        return result.seq

    async def entry(self, agent: str, token: str, run_id: str) -> int:
        """The sequence of ``run_id``'s entry in the key's queue, 0 when it has none."""
        m = await self.broker.direct_get_last(self.stream, self.queue_subject(agent, token, run_id))
        return 0 if m is None else m.seq

    async def head(self, agent: str, token: str) -> Head:
        """The oldest entry of the key's queue."""
        m = await self.broker.direct_get_next(self.stream, self.queue_subject(agent, token), 1)
        if m is None:
            return None, 0, ""
        try:
            return decode_queue_entry(m.data), m.seq, m.subject
        except msgspec.MsgspecError as e:
            log.warning("queue entry %r cannot be read (%s): removed", m.subject, e)
            return None, m.seq, m.subject

    async def first(self, agent: str, token: str, count: int) -> list[tuple[QueueEntry, int]]:
        """The oldest ``count`` entries of the key's queue that can be read, with their
        sequences."""
        msgs, _ = await self.broker.direct_get_batch(
            self.stream, self.queue_subject(agent, token), 1, count
        )
        out: list[tuple[QueueEntry, int]] = []
        for m in msgs:
            try:
                out.append((decode_queue_entry(m.data), m.seq))
            except msgspec.MsgspecError:
                continue
        return out

    async def depth(self, agent: str, token: str, from_seq: int = 1) -> int:
        """How many entries of the key's queue are at or after ``from_seq`` (all by default)."""
        msgs, more = await self.broker.direct_get_batch(
            self.stream, self.queue_subject(agent, token), from_seq, 1
        )
        return len(msgs) + more

    async def position(self, agent: str, token: str, ticket: int) -> int | None:
        """The place (1: next to be admitted) of the entry at ``ticket`` in its key's queue,
        ``None`` when it is not there any more."""
        msgs, more = await self.broker.direct_get_batch(
            self.stream, self.queue_subject(agent, token), ticket, 1
        )
        if not msgs or msgs[0].seq != ticket:
            return None
        return await self.depth(agent, token) - (len(msgs) + more) + 1

    async def dequeue(self, agent: str, token: str, run_id: str) -> None:
        """Remove ``run_id``'s entry from the key's queue (nothing if it has none)."""
        await self.broker.api(
            f"$JS.API.STREAM.PURGE.{self.stream}",
            {"filter": self.queue_subject(agent, token, run_id)},
        )

    async def drop(self, subject: str) -> None:
        """Remove an entry by its subject (one that cannot be read)."""
        if subject.startswith(f"{self.names.prefix}.schedule.flow.queue."):
            await self.broker.api(f"$JS.API.STREAM.PURGE.{self.stream}", {"filter": subject})
