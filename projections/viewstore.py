"""The leader's writes: run views as change messages and KV entries, and what it knows of each.

Every view is written twice: first as a change message on ``<prefix>.runs.<agent>.<run_id>``
(``Nats-Msg-Id: <run_id>:<seq>``, deduplicated), then as the run's KV entry, by compare-and-set
on the key's last subject sequence. So a KV entry at ``last_seq`` means every change message of
the run up to it is stored, and a decision whose KV entry is already there is skipped. Both
writes go in atomic batches where they can (under ``sync_interval: always`` a batch costs one
flush), and view by view where a batch is refused or not answered.

``ViewStore`` keeps the KV entry (its sequence and view) of each run it has read or written
and, after a take-over, the last change message of the runs a previous leader may have begun
writing; the projector clears them when it takes the leadership or folds anew.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import NamedTuple, TypeVar

import msgspec

from sojourn.broker import headers as h
from sojourn.broker.connection import Broker, JetStreamError
from sojourn.broker.delivery import PublishAck
from sojourn.broker.names import Names
from sojourn.schemas.codec import decode_run_view, encode
from sojourn.schemas.errors import BrokerUnavailable
from sojourn.schemas.views import RunView

from .sink import Applied
from .steplist import steps_of
from .summary import RunSummary

__all__ = ["EXPECT", "STEPS_EVERY", "Entry", "Message", "ViewStore"]

log = logging.getLogger("sojourn.projector")
T = TypeVar("T")

EXPECT = h.EXPECTED_LAST_SUBJECT_SEQUENCE
"""The fence of a compare-and-set write: the key's last subject sequence."""
_WRONG_LAST = 10071  # JetStream: wrong last sequence (the fence refused the write)
_PIPELINE = 1024
"""Writes in flight at once."""
_BATCH = 500
"""Messages per atomic batch (the server takes up to ``BATCH_MAX``, 1,000)."""
_READS_PER_TICK = 512
"""KV entries read per liveness pass for runs whose entry this projector has not seen."""
STEPS_EVERY = 1.0
"""Seconds between two writes of a live run's step record (an ended run's is written with its
last view): a run deciding ten times a second costs one record write a second, not ten."""

Message = tuple[str, bytes, dict[str, str]]
"""A message to publish: subject, body, headers."""


class Entry(NamedTuple):
    """What this projector knows of a run's KV entry: the key's last subject sequence, and
    the view stored there (``None``: no view, a delete marker)."""

    seq: int
    view: RunView | None


class ViewStore:
    """Writes run views (change messages, then KV entries) for the leading projector.

    Args:
        broker: the projector's connection (asked for at each write: it is made at start).
        names: the deployment's names.
        stopping: whether the projector is stopping (a write retried until it lands gives up
            then, with ``BrokerUnavailable``).
    """

    def __init__(
        self, broker: Callable[[], Broker], names: Names, stopping: Callable[[], bool]
    ) -> None:
        self._broker = broker
        self.names = names
        self._stopping = stopping
        self.entries: dict[str, Entry] = {}
        """Each run's KV entry, as last read or written."""
        self.published: dict[str, int] = {}
        """The ``last_seq`` of a run's last change message, read after a take-over."""
        self.views_written = 0
        self.changes_published = 0
        self.steps_written = 0
        self._steps_due: dict[str, RunSummary] = {}
        """Live runs whose step record is written at the next ``flush_steps``."""
        self._steps_at: dict[str, float] = {}
        """When each live run's step record was last written (monotonic seconds)."""

    def forget(self) -> None:
        """Forget every entry and change message known (another leader may have written)."""
        self.entries.clear()
        self.published.clear()
        self._steps_due.clear()
        self._steps_at.clear()

    async def write_steps(self, summaries: Mapping[str, RunSummary]) -> None:
        """Write the step records (decision 0040) of runs whose view was just written, from
        their summaries: an ended run's, and a live run's not written for ``STEPS_EVERY``
        seconds, now; the others at the next ``flush_steps``. Not fenced: a record's
        ``last_seq`` says which decision it holds."""
        now = time.monotonic()
        out: dict[str, RunSummary] = {}
        for run_id, s in summaries.items():
            if s.terminal:
                self._steps_at.pop(run_id, None)
            elif now - self._steps_at.get(run_id, -STEPS_EVERY) < STEPS_EVERY:
                self._steps_due[run_id] = s
                continue
            else:
                self._steps_at[run_id] = now
            self._steps_due.pop(run_id, None)
            out[run_id] = s
        await self._put_steps(out)

    async def flush_steps(self) -> None:
        """Write every step record held back by ``write_steps``."""
        due, self._steps_due = self._steps_due, {}
        now = time.monotonic()
        for run_id in due:
            self._steps_at[run_id] = now
        try:
            await self._put_steps(due)
        except BaseException:
            for run_id, s in due.items():  # kept for the next flush (unless a newer one is)
                self._steps_due.setdefault(run_id, s)
            raise

    async def _put_steps(self, summaries: Mapping[str, RunSummary]) -> None:
        records: list[Message] = [
            (self.names.run_steps_key(r), encode(steps_of(s)), {}) for r, s in summaries.items()
        ]
        await self.publish_all(records, counted=False)
        self.steps_written += len(records)

    async def write(self, items: Sequence[Applied], recover_to: int) -> None:
        """Write the views of ``items``, each run's change messages then its last view as its
        KV entry; a decision whose KV entry or change message is stored already is skipped.
        ``recover_to``: the horizon of the previous leader, up to which writes may have begun
        (``learn``)."""
        await self.learn(items, recover_to)
        changes: list[Message] = []
        finals: dict[str, RunView] = {}
        summaries: dict[str, RunSummary] = {}
        for a in items:
            v = a.view
            run_id = v.run_id
            entry = self.entries.get(run_id)
            if entry is not None and entry.view is not None and entry.view.last_seq >= a.seq:
                continue  # both writes were done before
            finals[run_id] = v
            if a.summary is not None:
                summaries[run_id] = a.summary
            if self.published.get(run_id, 0) >= a.seq:
                continue  # its change message was stored before
            msg_id = f"{run_id}:{a.seq}"
            changes.append((self.names.change(v.agent, run_id), encode(v), {h.MSG_ID: msg_id}))
        await self.publish_all(changes)
        await self.put_all(list(finals.values()))
        await self.write_steps({r: s for r, s in summaries.items() if r in finals})
        for run_id, v in finals.items():
            self.published.pop(run_id, None)
            if v.liveness == "ended":
                self.entries.pop(run_id, None)

    async def rewrite_liveness(self, live: Mapping[str, RunView]) -> None:
        """Rewrite the views of ``live`` (the live runs' current views) whose KV entry holds
        the same decision with another liveness."""
        unknown = [r for r in live if r not in self.entries][:_READS_PER_TICK]

        async def read(run_id: str) -> None:
            self.entries[run_id] = await self.read_entry(run_id)

        await self.gather([read(r) for r in unknown])
        stale = []
        for run_id, view in live.items():
            entry = self.entries.get(run_id)
            if entry is None or entry.view is None:
                continue
            cur = entry.view
            if cur.last_seq == view.last_seq and (
                cur.liveness != view.liveness or cur.queue_position != view.queue_position
            ):
                stale.append(view)
        if not stale:
            return
        await self.publish_all(
            [
                (
                    self.names.change(v.agent, v.run_id),
                    encode(v),
                    {h.MSG_ID: f"{v.run_id}:{v.last_seq}:{v.liveness}:{v.queue_position}"},
                )
                for v in stale
            ]
        )
        await self.put_all(stale)

    async def learn(self, items: Sequence[Applied], recover_to: int) -> None:
        """Read the KV entries of the runs ``items`` writes whose entry this projector does
        not know, and, for decisions a previous leader may have begun writing (up to its
        horizon, ``recover_to``), their last change message. A run's first decision past the
        horizon needs neither: its key can only hold a pending view, and a refused write reads
        it then."""
        kv: set[str] = set()
        changes: dict[str, str] = {}
        for a in items:
            run_id = a.view.run_id
            if run_id in self.entries or run_id in kv:
                continue
            first = len(a.events) == a.view.events
            if a.seq <= recover_to:
                kv.add(run_id)
                changes[run_id] = self.names.change(a.view.agent, run_id)
            elif not first:
                kv.add(run_id)
        if not kv:
            return

        async def read_kv(run_id: str) -> None:
            self.entries[run_id] = await self.read_entry(run_id)

        async def read_change(run_id: str, subject: str) -> None:
            m = await self._broker().direct_get_last(self.names.changes_stream, subject)
            view = _decode_view(m.data) if m is not None else None
            if view is not None:
                self.published[run_id] = view.last_seq

        await self.gather(
            [read_kv(r) for r in kv] + [read_change(r, s) for r, s in changes.items()]
        )

    async def read_entry(self, run_id: str) -> Entry:
        """The run's KV entry as it is stored now."""
        names = self.names
        m = await self._broker().direct_get_last(names.runs_kv_stream, names.run_key(run_id))
        if m is None:
            return Entry(0, None)
        if m.header(h.KV_OPERATION) in ("DEL", "PURGE"):
            return Entry(m.seq, None)
        return Entry(m.seq, _decode_view(m.data))

    async def publish_all(self, msgs: list[Message], *, counted: bool = True) -> None:
        """Publish every change message (deduplicated by its id); retried until each is
        stored, since a change message must never be missing.

        Atomic batches first: under ``sync_interval: always`` a batch costs one flush where
        single publishes cost one each. A batch the stream refuses (one id it holds already,
        after a takeover) or does not answer falls back to one publish per message, which
        settles each duplicate on its own."""
        todo = []
        for i in range(0, len(msgs), _BATCH):
            chunk = msgs[i : i + _BATCH]
            if not isinstance(await self.try_batch(chunk), PublishAck):
                todo.extend(chunk)
        delay = 0.1
        while todo:
            results = await self.gather([self.try_publish(s, d, hd) for s, d, hd in todo])
            pairs = zip(todo, results, strict=True)
            failed = [m for m, r in pairs if not isinstance(r, PublishAck)]
            if not failed:
                break
            if self._stopping():
                raise BrokerUnavailable(f"{len(failed)} change messages not stored yet")
            log.warning("projector: %d change messages not stored yet; retrying", len(failed))
            todo = failed
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)
        if counted:
            self.changes_published += len(msgs)

    async def try_publish(
        self, subject: str, data: bytes, headers: dict[str, str]
    ) -> PublishAck | JetStreamError | None:
        """One publish: its ack, the stream's refusal, or ``None`` when it was not answered."""
        try:
            return await self._broker().try_publish(subject, data, headers)
        except TimeoutError:
            return None

    async def try_batch(self, msgs: Sequence[Message]) -> PublishAck | JetStreamError | None:
        """One atomic batch: its ack, the stream's refusal, or ``None`` when not answered."""
        try:
            return await self._broker().try_publish_batch(msgs)
        except (TimeoutError, BrokerUnavailable) as e:
            log.debug("projector: a batch of %d was not acknowledged: %s", len(msgs), e)
            return None

    @staticmethod
    async def gather(jobs: Sequence[Awaitable[T]]) -> list[T]:
        """Run ``jobs`` concurrently, at most ``_PIPELINE`` at a time, in order."""
        out: list[T] = []
        for i in range(0, len(jobs), _PIPELINE):
            out.extend(await asyncio.gather(*jobs[i : i + _PIPELINE]))
        return out

    async def put_all(self, views: list[RunView]) -> None:
        """Write the views (one per run) as KV entries by compare-and-set: in atomic batches,
        each message fenced on its key's sequence; a batch refused (one fence broken: another
        writer was there) or unanswered is written view by view (``put``)."""
        rest: list[RunView] = []
        for i in range(0, len(views), _BATCH):
            chunk = views[i : i + _BATCH]
            entries = [self.entries.get(v.run_id) or Entry(0, None) for v in chunk]
            ack = await self.try_batch(
                [
                    (self.names.run_key(v.run_id), encode(v), {EXPECT: str(e.seq)})
                    for v, e in zip(chunk, entries, strict=True)
                ]
            )
            if isinstance(ack, PublishAck):
                first = ack.seq - len(chunk) + 1  # a batch is stored contiguously
                for k, v in enumerate(chunk):
                    self.entries[v.run_id] = Entry(first + k, v)
                self.views_written += len(chunk)
            else:
                rest.extend(chunk)
        await self.gather([self.put(v) for v in rest])

    async def put(self, view: RunView, *, only_newer: bool = True) -> bool:
        """Write ``view`` as its run's KV entry by compare-and-set; ``False`` when the entry
        already holds this decision or a later one (written by us before, or by another
        leader)."""
        run_id = view.run_id
        subject = self.names.run_key(run_id)
        data = encode(view)
        entry = self.entries.get(run_id) or Entry(0, None)
        delay = 0.1
        while True:
            ack = await self.try_publish(subject, data, {EXPECT: str(entry.seq)})
            if isinstance(ack, PublishAck):
                self.entries[run_id] = Entry(ack.seq, view)
                self.views_written += 1
                return True
            if isinstance(ack, JetStreamError) and ack.err_code == _WRONG_LAST:
                entry = await self.read_entry(run_id)
                self.entries[run_id] = entry
                cur = entry.view
                if cur is not None and cur.last_seq > 0 and only_newer:
                    if cur.last_seq >= view.last_seq:
                        return False
                continue
            if self._stopping():
                raise BrokerUnavailable(f"the view of {run_id} was not written")
            log.warning("projector: writing the view of %s: %s; retrying", run_id, ack)
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)


def _decode_view(data: bytes) -> RunView | None:
    try:
        return decode_run_view(data)
    except msgspec.MsgspecError:
        return None
