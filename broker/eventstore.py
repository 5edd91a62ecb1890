"""The event store: append-only, fenced, per-run event subjects in one JetStream stream.

One stream message holds one *decision*: the list of events a single step of the run produced
(for example "step 3 completed" and "step 4 started"), so several events land atomically under
one sequence number. Every append carries:

- ``Nats-Expected-Last-Subject-Sequence``: the fence. Only a writer that has seen the run's
  latest message may write; anyone else gets ``ConcurrencyConflict``.
- ``Nats-Msg-Id``: unique per (run, expected sequence, writer activation), so an append that
  timed out and is retried is not stored twice.

The trap (docs/jetstream.md): a retry carrying both headers is answered "wrong last sequence"
(10071), not "duplicate", when the first attempt did land. So on 10071 we read the message
right after the expected sequence: if it carries our Msg-Id, the append landed and we return
its sequence.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import msgspec
from nats.errors import ConnectionClosedError, NoRespondersError

from sojourn.schemas.codec import decode_events, encode_events
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import (
    BrokerUnavailable,
    ConcurrencyConflict,
    HistoryError,
    PayloadTooLarge,
)
from sojourn.schemas.events import RunEvent

from . import headers as h
from .commits import GroupCommit
from .connection import Broker, JetStreamError
from .delivery import StoredMessage
from .names import Names

__all__ = ["WRONG_LAST_SEQUENCE", "Decision", "EventStore"]

WRONG_LAST_SEQUENCE = 10071
HEADER_ROOM = 4096
"""Bytes of a server's ``max_payload`` left for an append's headers (the server counts them)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """One stored message of a run's history."""

    seq: int
    events: tuple[RunEvent, ...]
    writer: str
    msg_id: str
    size: int = field(default=0, compare=False)
    """Bytes of the stored message's body (the encoded events), 0 if not known: what the
    history cache's byte bound counts. Not compared: the same message either way."""


DEFAULT_CACHE_BYTES = 64 * 1024 * 1024
"""The history cache's default byte bound (``EventStore(cache_bytes=...)``): 64 MiB."""


class _Cached:
    """One cached history and the sum of its decisions' sizes."""

    __slots__ = ("decisions", "size")

    def __init__(self, decisions: list[Decision]) -> None:
        self.decisions = decisions
        self.size = sum(d.size for d in decisions)


class EventStore:
    """Append to and read from run histories.

    With ``cache_decisions`` > 0 it keeps the most recently used histories of at least
    ``cache_min`` decisions, and ``history()`` then reads only what was appended after the
    cached part. The cache holds at most ``cache_decisions`` decisions and ``cache_bytes`` bytes
    (default 64 MiB) in all, counting each decision as the size of its stored message body (the
    encoded events, which the decoded ones keep alive; add a few hundred bytes of Python objects
    per decision on top). The least recently used histories go first until both bounds hold, and a
    history that alone exceeds either bound is never kept (nor kept growing by appends). A
    bound of 0 turns the cache off. Short histories are not worth keeping (re-reading a few
    messages costs well under a millisecond), and leaving them out keeps a burst of many small
    parked runs from occupying memory.

    Caching is safe because a history is never rewritten: the events stream denies delete and
    purge, and every append is fenced on the run's last sequence, so a cached prefix stays true
    forever. What this store appends itself is added to the cache as it lands.
    """

    def __init__(
        self,
        broker: Broker,
        names: Names,
        settings: Settings,
        *,
        cache_decisions: int = 0,
        cache_min: int = 0,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        snapshot_weight: int = 0,
    ) -> None:
        """``snapshot_weight``: the bound of ``keep_snapshot``'s snapshots, in events folded
        (0: none kept)."""
        self.broker = broker
        self.commits = GroupCommit(broker)
        """The appends of many runs waiting at once go as one batch (``broker/commits.py``)."""
        self.names = names
        self.settings = settings
        self.cache_decisions = cache_decisions
        self.cache_min = cache_min
        self.cache_bytes = cache_bytes
        self.high_seq = 0
        """The highest events-stream sequence of an append this store had acknowledged (or a
        floor set by its owner): every later append of this connection lands above it."""
        self._cache: OrderedDict[str, _Cached] = OrderedDict()
        self._cached = 0
        self._cached_bytes = 0
        self.cache_hits = 0
        self.snapshot_weight = snapshot_weight
        self._snapshots: OrderedDict[str, tuple[int, object, int]] = OrderedDict()
        self._snapshot_weight = 0

    # --- the history cache ------------------------------------------------------------------

    async def history(self, run_id: str) -> list[Decision]:
        """The run's whole history (a new list), from the cache plus what came after it."""
        if self.cache_decisions <= 0 or self.cache_bytes <= 0:
            return await self.load(run_id)
        entry = self._take(run_id)
        if entry is None:
            entry = _Cached(await self.load(run_id))
        else:
            self.cache_hits += 1
            tail = await self.load(run_id, after_seq=entry.decisions[-1].seq)
            entry.decisions.extend(tail)
            entry.size += sum(d.size for d in tail)
        self._remember(run_id, entry)
        return list(entry.decisions)

    @property
    def cached_decisions(self) -> int:
        """Decisions held by the history cache now (at most ``cache_decisions``)."""
        return self._cached

    @property
    def cached_bytes(self) -> int:
        """Bytes of stored messages held by the history cache now (at most ``cache_bytes``)."""
        return self._cached_bytes

    def forget(self, run_id: str) -> None:
        """Drop a run from the cache (it ended: nobody will read it again soon)."""
        self._take(run_id)
        kept = self._snapshots.pop(run_id, None)
        if kept is not None:
            self._snapshot_weight -= kept[2]

    # --- snapshots of folded histories ------------------------------------------------------

    def snapshot(self, run_id: str) -> tuple[int, object] | None:
        """The newest snapshot kept of the run: the sequence it folded up to, and the
        snapshot (opaque here: the actors' fold of the history up to that sequence)."""
        kept = self._snapshots.get(run_id)
        if kept is None:
            return None
        self._snapshots.move_to_end(run_id)
        return kept[0], kept[1]

    def keep_snapshot(self, run_id: str, seq: int, snapshot: object, weight: int) -> None:
        """Keep ``snapshot``, the fold of the run's history up to ``seq``, so that its next
        reader folds only what came after (``docs/decisions/0021``); it replaces an older one.
        ``weight`` (the events folded) is what the bound ``snapshot_weight`` counts: a fold
        holds ~0.2 KB of Python objects per operation plus the stored values it refers to
        (shared with the cached decisions, when those are cached too). The least recently
        used snapshots go first; one heavier than the bound alone is not kept.

        A snapshot cannot go stale, for the reason the history cache cannot: a run's history
        only ever grows after the sequences it has."""
        old = self._snapshots.pop(run_id, None)
        if old is not None:
            self._snapshot_weight -= old[2]
            if old[0] > seq:  # keep the newer one
                seq, snapshot, weight = old
        if self.snapshot_weight <= 0 or weight > self.snapshot_weight:
            return
        self._snapshots[run_id] = (seq, snapshot, weight)
        self._snapshot_weight += weight
        while self._snapshot_weight > self.snapshot_weight:
            _, (_, _, w) = self._snapshots.popitem(last=False)
            self._snapshot_weight -= w

    def _take(self, run_id: str) -> _Cached | None:
        entry = self._cache.pop(run_id, None)
        if entry is not None:
            self._cached -= len(entry.decisions)
            self._cached_bytes -= entry.size
        return entry

    def _fits(self, entry: _Cached) -> bool:
        """Whether a history may be cached at all: alone within both bounds."""
        return len(entry.decisions) <= self.cache_decisions and entry.size <= self.cache_bytes

    def _evict(self) -> None:
        """Drop the least recently used histories until both bounds hold."""
        while self._cache and (
            self._cached > self.cache_decisions or self._cached_bytes > self.cache_bytes
        ):
            _, old = self._cache.popitem(last=False)
            self._cached -= len(old.decisions)
            self._cached_bytes -= old.size

    def _remember(self, run_id: str, entry: _Cached) -> None:
        # A concurrent ``history()`` of the same run may have put it back meanwhile: replace it
        # (counting both would overstate what the cache holds).
        self._take(run_id)
        n = len(entry.decisions)
        if n == 0 or n < self.cache_min or not self._fits(entry):
            return
        self._cache[run_id] = entry
        self._cached += n
        self._cached_bytes += entry.size
        self._evict()  # stops before ``entry``, the most recent: alone it fits

    def _appended(self, run_id: str, expected_seq: int, decision: Decision) -> None:
        entry = self._cache.get(run_id)
        if entry is None or entry.decisions[-1].seq != expected_seq:
            return
        entry.decisions.append(decision)
        entry.size += decision.size
        self._cached += 1
        self._cached_bytes += decision.size
        self._cache.move_to_end(run_id)
        if not self._fits(entry):
            self._take(run_id)  # grown past a bound on its own: read it again when needed
        self._evict()

    @property
    def max_decision(self) -> int:
        """Largest body of one event message, in bytes: what the server accepts (its
        ``max_payload``, known from the connection) less ``HEADER_ROOM``."""
        return self.broker.max_payload - HEADER_ROOM

    async def append(
        self,
        run_id: str,
        events: list[RunEvent] | tuple[RunEvent, ...],
        *,
        expected_seq: int,
        writer: str,
        msg_id: str | None = None,
        timeout: float | None = None,
    ) -> int:
        """Append one decision after ``expected_seq``; return its stream sequence.

        See ``append_once`` for the retry and fencing rules.
        """
        seq, _ = await self.append_once(
            run_id, events, expected_seq=expected_seq, writer=writer, msg_id=msg_id, timeout=timeout
        )
        return seq

    async def append_once(
        self,
        run_id: str,
        events: list[RunEvent] | tuple[RunEvent, ...],
        *,
        expected_seq: int,
        writer: str,
        msg_id: str | None = None,
        timeout: float | None = None,
    ) -> tuple[int, bool]:
        """Append one decision after ``expected_seq``; return ``(seq, earlier)``.

        ``earlier`` is True when the message was already stored by an earlier attempt with
        the same Msg-Id (a retry after a lost ack, or a redelivered command): the caller must
        then assume more may have been appended since.

        Retries through broker outages (same Msg-Id, so at most one copy lands) until
        ``timeout`` (default ``settings.append_timeout``).

        Raises:
            ConcurrencyConflict: another writer appended since ``expected_seq``.
            BrokerUnavailable: the broker stayed unreachable for ``timeout`` seconds.
            PayloadTooLarge: the decision is larger than ``max_decision``; nothing was sent.
        """
        subject = self.names.events(run_id)
        data = encode_events(events)
        if len(data) > self.max_decision:
            raise PayloadTooLarge(
                f"decision of {len(events)} event(s) is {len(data)} bytes; the server accepts "
                f"{self.max_decision} (its max_payload less {HEADER_ROOM} for headers)",
                run_id=run_id,
                seq=expected_seq,
            )
        mid = msg_id or f"{run_id}:{expected_seq}:{writer}"
        headers = {
            h.EXPECTED_LAST_SUBJECT_SEQUENCE: str(expected_seq),
            h.MSG_ID: mid,
            h.WRITER: writer,
        }
        deadline = time.monotonic() + (self.settings.append_timeout if timeout is None else timeout)
        pause = 0.05
        while True:
            try:
                ack = await self.commits.publish(subject, data, headers, timeout=2.0)
            except (TimeoutError, NoRespondersError) as e:
                if time.monotonic() > deadline:
                    raise BrokerUnavailable(
                        f"append to {subject} not acknowledged: {type(e).__name__}",
                        run_id=run_id,
                        seq=expected_seq,
                    ) from e
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)
                continue
            except ConnectionClosedError as e:
                raise BrokerUnavailable("connection to NATS is closed", run_id=run_id) from e
            if not isinstance(ack, JetStreamError):
                self.high_seq = max(self.high_seq, ack.seq)
                if self._cache:
                    decision = Decision(ack.seq, tuple(events), writer, mid, len(data))
                    self._appended(run_id, expected_seq, decision)
                return ack.seq, ack.duplicate
            if ack.err_code == WRONG_LAST_SEQUENCE:
                landed = await self._landed_seq(run_id, expected_seq, mid)
                if landed is not None:
                    if self._cache:
                        decision = Decision(landed, tuple(events), writer, mid, len(data))
                        self._appended(run_id, expected_seq, decision)
                    return landed, True
                raise ConcurrencyConflict(
                    f"run {run_id}: another writer appended after seq {expected_seq}",
                    run_id=run_id,
                    expected=expected_seq,
                )
            if ack.code == 503 and time.monotonic() < deadline:
                await asyncio.sleep(pause)  # stream still recovering after a restart
                pause = min(pause * 2, 1.0)
                continue
            raise JetStreamError(
                f"append to {subject}: {ack.description}",
                code=ack.code,
                err_code=ack.err_code,
                description=ack.description,
            )

    async def _landed_seq(self, run_id: str, expected_seq: int, msg_id: str) -> int | None:
        nxt = await self.broker.direct_get_next(
            self.names.events_stream, self.names.events(run_id), expected_seq + 1
        )
        if nxt is not None and nxt.header(h.MSG_ID) == msg_id:
            return nxt.seq
        return None

    async def load(self, run_id: str, after_seq: int = 0) -> list[Decision]:
        """Every decision of ``run_id`` with a sequence above ``after_seq``, in order."""
        msgs = await self.broker.direct_get_range(
            self.names.events_stream, self.names.events(run_id), after_seq + 1
        )
        return [self._decode(run_id, m) for m in msgs]

    async def first(self, run_id: str) -> Decision | None:
        """The first decision of a run (its ``RunStarted``), or ``None`` if it does not exist."""
        m = await self.broker.direct_get_next(
            self.names.events_stream, self.names.events(run_id), 1
        )
        return None if m is None else self._decode(run_id, m)

    async def last_seq(self, run_id: str) -> int:
        """The sequence of the run's latest message; 0 when the run does not exist."""
        m = await self.broker.direct_get_last(self.names.events_stream, self.names.events(run_id))
        return 0 if m is None else m.seq

    @staticmethod
    def _decode(run_id: str, m: StoredMessage) -> Decision:
        seq = m.seq
        try:
            events = tuple(decode_events(m.data))
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise HistoryError(
                f"run {run_id}: event message {seq} cannot be decoded: {e}", run_id=run_id, seq=seq
            ) from e
        return Decision(
            seq=seq,
            events=events,
            writer=m.header(h.WRITER),
            msg_id=m.header(h.MSG_ID),
            size=len(m.data),
        )
