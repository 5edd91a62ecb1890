"""The projector: run views in the runs KV bucket, one change message per decision, pending
runs, and an optional SQLite read model, all from the events stream.

It follows the events stream from sequence 1 with the run model (``RunModel``, the same fold
the watchdog uses), so it holds no server-side state: a broker restart, a crash or a second
projector need no recovery code. For every decision it makes the run's ``RunView``
(``views.view_of``) and, if it leads, writes it twice: first as a change message on
``<prefix>.runs.<agent>.<run_id>`` (``Nats-Msg-Id: <run_id>:<seq>``, deduplicated), then as
the run's KV entry, by compare-and-set on the key's last subject sequence. So a KV entry at
``last_seq`` means every change message of the run up to it is stored, and a decision whose
KV entry is already there is skipped.

Leadership is a record (``LeaderRecord``) on ``<prefix>.leader.projector`` taken and renewed
by compare-and-set. It also says how far the leader got: every view up to ``position`` is
written, and writes after ``horizon`` have not begun (the leader moves the horizon forward
before each batch that passes it). A projector that takes over skips what is below the
position without reading anything, checks the KV entry and the last change message of each run
it writes between the two, and writes beyond the horizon directly. The others keep folding
(and feeding their SQLite model), so they can take over at once. Two leaders at once (a clock
jump, a pause) write the same bytes under the same message ids and the same fences: one of
each lands.

Snapshots: the leader stores its run model (``RunModel.snapshot``) in the object store
``<PREFIX>_SNAPSHOTS`` every ``snapshot_every`` seconds or ``snapshot_decisions`` decisions,
whichever comes first, and at a graceful stop, and only at a point where every view of a
decision up to the snapshot's position is written: so a snapshot at position P means that the
views up to P are all written. A projector starts its fold from the snapshot (reading the
events stream from P + 1) unless it rebuilds or its SQLite model is behind P (it must feed that
model every decision after the model's own position, and the decisions before P are not read
again): then it folds from sequence 1, as without a snapshot. A new leader starting from P
writes nothing below P (written already), checks what lies between P and its predecessor's
horizon as before, and rewrites the liveness of the restored live runs' views on its first
liveness pass if it changed, as a leader that folded everything does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Awaitable, Sequence
from datetime import datetime
from typing import NamedTuple, Protocol, TypeVar

import msgspec

from sojourn.broker import BROKER_ERRORS
from sojourn.broker import headers as h
from sojourn.broker.connection import Broker, ConnectOptions, JetStreamError
from sojourn.broker.delivery import Delivery, PublishAck, StoredMessage, Subscription
from sojourn.broker.follow import StreamFollower
from sojourn.broker.names import Names
from sojourn.broker.topology import ensure_topology
from sojourn.schemas.codec import decode_dead_letter, decode_run_view, encode, from_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import BrokerUnavailable, InvalidName, SojournError
from sojourn.schemas.events import RunEvent
from sojourn.schemas.health import LeaderRecord, LivenessState
from sojourn.schemas.names import TOKEN_PATTERN
from sojourn.schemas.snapshot import ModelSnapshot
from sojourn.schemas.views import RunView

from .liveness import classify
from .model import RunModel, read_snapshot, write_snapshot
from .sqlite import Applied
from .summary import RunSummary
from .views import pending_view, view_of

__all__ = ["Applied", "Projector", "ViewSink"]

log = logging.getLogger("sojourn.projector")
T = TypeVar("T")


ROLE = "projector"
_EXPECT = h.EXPECTED_LAST_SUBJECT_SEQUENCE
_WRONG_LAST = 10071  # JetStream: wrong last sequence (the fence refused the write)
_TOKEN = re.compile(TOKEN_PATTERN)  # an agent name: what a change subject can hold
_HORIZON_AHEAD = 1000
"""How far past a batch the leader moves its horizon, so the leader record is not rewritten
before every small batch (a new leader checks at most this many more decisions)."""
_BACKLOG_MAX = 200_000
"""Unwritten views a follower keeps for a take-over; past this it re-folds instead."""
_PIPELINE = 1024
_BATCH = 500
_INBOX_EVERY = 0.1
"""Seconds between two looks at the inbox for new starts (pending views)."""
"""Messages per atomic batch (the server takes up to ``BATCH_MAX``, 1,000)."""
"""Writes in flight at once."""
_READS_PER_TICK = 512
"""KV entries read per liveness pass for runs whose entry this projector has not seen."""


class ViewSink(Protocol):
    """A read model fed from the projector's fold (the SQLite model, ``projections/sqlite.py``).

    ``apply`` writes a batch in one transaction, skipping decisions at or below ``position``,
    and returns the rows written. ``Applied`` (defined with the SQLite model) is one decision:
    its events-stream sequence, the run's view after it, and its events.
    """

    @property
    def position(self) -> int: ...

    async def apply(self, batch: Sequence[Applied]) -> int: ...
    async def put_pending(self, view: RunView) -> bool: ...
    async def drop_pending(self, run_id: str) -> bool: ...
    async def set_liveness(self, changes: Sequence[tuple[str, LivenessState]]) -> None: ...
    async def reset(self) -> None: ...
    async def close(self) -> None: ...


class _Entry(NamedTuple):
    """What this projector knows of a run's KV entry: the key's last subject sequence, and
    the view stored there (``None``: no view, a delete marker)."""

    seq: int
    view: RunView | None


class Projector:
    """Keeps the read side of one deployment current (``sojourn projector``).

    Args:
        nats / broker: where to connect (or a connection to use; it is not closed here).
        settings: the deployment's settings.
        sink: a read model fed from the fold (leader or not), e.g. the SQLite model.
        rebuild: reset ``sink`` and rewrite every KV view that differs from the one
            recomputed from the start of the events stream.
        interval: seconds between leadership renewals and liveness passes.
        leader_ttl: how long a leader record stays valid without renewal: how soon another
            projector takes over from one that died.
        poll: seconds to wait for new messages once caught up.
        snapshot_every / snapshot_decisions: as leader, store a snapshot of the run model
            after this many seconds or this many decisions since the last one, whichever
            comes first (and at a graceful stop); ``snapshot_every=0`` stores none.
        from_snapshot: start the fold from the stored snapshot when it may be used (never
            when rebuilding).
    """

    def __init__(
        self,
        *,
        nats: str | ConnectOptions | None = None,
        broker: Broker | None = None,
        settings: Settings | None = None,
        sink: ViewSink | None = None,
        rebuild: bool = False,
        interval: float = 1.0,
        leader_ttl: float = 5.0,
        poll: float = 0.25,
        projector_id: str | None = None,
        snapshot_every: float = 300.0,
        snapshot_decisions: int = 100_000,
        from_snapshot: bool = True,
    ) -> None:
        self.settings = settings or Settings()
        self.names = Names(self.settings.prefix)
        self.sink = sink
        self.rebuild = rebuild
        self.interval = interval
        self.leader_ttl = max(leader_ttl, 2 * interval)
        self.poll = poll
        self.snapshot_every = snapshot_every
        self.snapshot_decisions = max(1, snapshot_decisions)
        self.from_snapshot = from_snapshot and not rebuild
        self.projector_id = (
            projector_id or f"pj-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        self._url = nats
        self._broker = broker
        self._owns_broker = broker is None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        # counters (exported by ``sojourn.actors.ops.metrics``)
        self.views_written = 0
        self.changes_published = 0
        self.rows_written = 0
        self.malformed = {"inbox": 0, "dlq": 0, "events": 0}
        self.rebuild_seconds: float | None = None
        self.snapshots_written = 0
        self.snapshot_position = 0
        """The position of the last snapshot this projector stored or started from."""
        self._next_snapshot = 0.0
        self._snapshot_task: asyncio.Task[None] | None = None
        self._stream_created = ""
        self.stream_last_seq = 0
        self.stream_last_time = 0.0
        # leadership
        self.leading = False
        self._leader_seq = 0
        self.written = 0
        """Every view of a decision up to this events sequence is written (as leader)."""
        self._horizon = 0
        self._recover_to = 0
        self._leader_position = 0
        # the fold and what was made from it
        self.model: RunModel
        self._applied: list[Applied] = []
        self._written_time = 0.0
        self._times: dict[int, float] = {}
        self._live: dict[str, RunView] = {}
        self._kv: dict[str, _Entry] = {}
        self._published: dict[str, int] = {}
        self._backlog: list[Applied] = []
        self._backlog_from = 0
        self._backlog_lost = False
        self._rebuild_until = 0
        self._rebuild_views: dict[str, RunView] = {}
        self._rebuild_started = 0.0
        self._scanned = asyncio.Event()
        self._next_tick = 0.0
        self._inbox: list[StreamFollower] = []
        self._dlq: StreamFollower
        self._appended = asyncio.Event()
        self._next_inbox = 0.0
        self._hint: Subscription | None = None

    # --- life ----------------------------------------------------------------------------------

    @property
    def broker(self) -> Broker:
        assert self._broker is not None, "the projector is not started"
        return self._broker

    async def start(self) -> Projector:
        if self._broker is None:
            self._broker = await Broker.connect(self._url, name=f"sojourn {self.projector_id}")
        b = self._broker
        await ensure_topology(b, self.names, self.settings, consumers=False)
        self._next_snapshot = time.monotonic() + self.snapshot_every
        await self._new_fold()
        p = self.names.prefix
        self._inbox = [
            StreamFollower(b, self.names.inbox_stream, f"{p}.start.*.*"),
            StreamFollower(b, self.names.inbox_stream, f"{p}.as.*.start.*.*"),
        ]
        self._dlq = StreamFollower(b, self.names.dlq_stream, self.names.dlq("start"))
        if self.rebuild:
            self._rebuild_started = time.monotonic()
            if self.sink is not None:
                await self.sink.reset()
        # A hint, never the truth: any append on a run's event subject wakes the loop at
        # once instead of at its next poll (what is read is always what the stream stored).
        self._hint = await b.subscribe(self.names.events_all, cb=self._on_append)
        self._task = asyncio.create_task(self._loop(), name="sojourn-projector")
        return self

    async def _on_append(self, _msg: Delivery) -> None:
        self._appended.set()

    async def stop(self) -> None:
        self._stopping = True
        if self._hint is not None:
            with contextlib.suppress(*BROKER_ERRORS):
                await self._hint.unsubscribe()
            self._hint = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        await self._final_snapshot()
        if self.leading and self._broker is not None and self._broker.connected:
            # Bounded: a stop ends within a couple of seconds whatever the server's state (a
            # record left behind only makes the next leader wait for it to expire).
            with contextlib.suppress(SojournError, TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._resign()
        if self._owns_broker and self._broker is not None:
            await self._broker.close()

    async def __aenter__(self) -> Projector:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_scanned(self) -> None:
        """Wait until the projector has caught up with the events stream, written (if it
        leads) everything it read, and judged liveness once more."""
        self._scanned.clear()
        await self._scanned.wait()

    @property
    def position(self) -> int:
        """How far this projector's own work goes: what it wrote as leader, else what it
        folded."""
        return self.written if self.leading else self.model.position

    @property
    def lag_events(self) -> int:
        return max(0, self.stream_last_seq - self.position)

    @property
    def lag_seconds(self) -> float:
        if self.lag_events == 0 or not self.stream_last_time:
            return 0.0
        done = self._written_time if self.leading else self.model.applied_time
        return max(0.0, self.stream_last_time - done) if done else 0.0

    # --- the loop ------------------------------------------------------------------------------

    async def _loop(self) -> None:
        me = asyncio.current_task()
        while not self._stopping and not (me is not None and me.cancelling()):
            busy = False
            try:
                if time.monotonic() >= self._next_tick:
                    await self._tick()
                busy = await self._step()
                await self._follow_inbox()
            except asyncio.CancelledError:
                raise
            except (SojournError, TimeoutError) as e:
                log.warning("projector: %s; retrying", e)
                await asyncio.sleep(0.5)
            except Exception:
                log.exception("projector: a pass failed; retrying")
                await asyncio.sleep(0.5)
            if not busy:
                # Idle: until an append is hinted, or the poll interval passes (a hint can
                # be lost while the connection is down).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._appended.wait(), self.poll)
                self._appended.clear()

    async def _step(self) -> bool:
        """Read the next page of events while the views of the page before are written."""
        batch, self._applied = self._applied, []
        # Nothing is read between here and the read below: the model is at the end of
        # ``batch``, so a snapshot taken now is of the decisions written once it is applied.
        snap = self.model.snapshot(taken_at=time.time()) if self._snapshot_due(batch) else None
        read = asyncio.create_task(self.model.refresh(max_pages=1))
        try:
            await self._apply(batch)
        except BaseException:
            read.cancel()
            with contextlib.suppress(BaseException):
                await read
            self._applied[:0] = batch  # not lost: written on the next pass
            raise
        caught_up = await read
        if snap is not None and self.leading and self.written >= snap.position:
            self._store_snapshot(snap)
        if caught_up and not self._applied:
            await self._rebuild_finish()
        return bool(batch) or bool(self._applied) or not caught_up

    async def _new_fold(self) -> None:
        """A fresh fold (at start, and when a follower's backlog overflowed): from the stored
        snapshot if one may be used, else from sequence 1."""
        self.model = RunModel(self.broker, self.names, self.settings)
        self.model.on_decision = self._on_decision
        self._applied.clear()
        self._live.clear()
        self._kv.clear()
        self._backlog.clear()
        self._backlog_lost = False
        self._backlog_from = 0
        if not self.from_snapshot:
            return
        snap = await read_snapshot(self.broker, self.names)
        if snap is None:
            return
        sunk = self.sink.position if self.sink is not None else snap.position
        if sunk < snap.position:
            log.info(
                "projector: the SQLite model is at sequence %d, behind the snapshot (%d): "
                "folding from sequence 1 to feed it every decision after its own position",
                sunk,
                snap.position,
            )
            return
        self.model.restore(snap)
        self.snapshot_position = max(self.snapshot_position, snap.position)
        # Their views as a full fold would hold them before a liveness pass: the first pass
        # rewrites a KV entry whose liveness changed (``_reassess``). A backlog from here
        # covers a take-over from any position: every view up to the snapshot is written.
        for run_id, s in self.model.runs.items():
            self._live[run_id] = view_of(s, None)
        log.info(
            "projector: started from the snapshot at sequence %d (%d live runs)",
            snap.position,
            len(self.model.runs),
        )

    # --- snapshots -----------------------------------------------------------------------------

    def _snapshot_due(self, batch: Sequence[Applied]) -> bool:
        """Whether to take a snapshot now, at the end of ``batch``: one is due, and once
        ``batch`` is written every decision the model holds will be."""
        if not self.snapshot_every or not self.leading or self._rebuild_until:
            return False
        if (batch[-1].seq if batch else self.written) < self.model.position:
            return False
        if self._snapshot_task is not None and not self._snapshot_task.done():
            return False  # one at a time
        position = self.model.position
        if position <= self.snapshot_position:
            return False
        return (
            time.monotonic() >= self._next_snapshot
            or position - self.snapshot_position >= self.snapshot_decisions
        )

    def _store_snapshot(self, snap: ModelSnapshot[RunSummary]) -> None:
        """Store ``snap`` in the background (the views go on being written meanwhile)."""
        self._next_snapshot = time.monotonic() + self.snapshot_every
        self.snapshot_position = snap.position
        self._snapshot_task = asyncio.create_task(
            self._put_snapshot(snap), name="sojourn-projector-snapshot"
        )

    async def _put_snapshot(self, snap: ModelSnapshot[RunSummary]) -> None:
        snap = msgspec.structs.replace(snap, stream_created=self._stream_created)
        try:
            size = await write_snapshot(
                self.broker, self.names, snap, replicas=self.settings.replicas
            )
        except (SojournError, TimeoutError) as e:
            log.warning("projector: the snapshot at %d was not stored: %s", snap.position, e)
            return
        self.snapshots_written += 1
        log.info(
            "projector: snapshot at sequence %d stored (%d live runs, %d bytes)",
            snap.position,
            len(snap.runs),
            size,
        )

    async def _final_snapshot(self) -> None:
        """At a graceful stop, as leader: write what was folded and not yet written, then
        store a snapshot of it (bounded: a stop ends within seconds whatever the server's
        state; a snapshot not stored only means the next start reads more)."""
        if self._snapshot_task is not None:
            with contextlib.suppress(BaseException):
                await self._snapshot_task
        if not (self.snapshot_every and self.leading and self.model.position):
            return
        if self._broker is None or not self._broker.connected or self._rebuild_until:
            return
        with contextlib.suppress(SojournError, TimeoutError):
            async with asyncio.timeout(5.0):
                if self._applied:
                    batch, self._applied = self._applied, []
                    await self._apply(batch)
                if self.leading and self.written >= self.model.position > self.snapshot_position:
                    snap = self.model.snapshot(taken_at=time.time())
                    self.snapshot_position = snap.position
                    await self._put_snapshot(snap)

    def _on_decision(self, seq: int, s: RunSummary, events: tuple[RunEvent, ...]) -> None:
        m = self.model
        liveness: LivenessState | None = None
        if m.caught_up and not s.terminal:
            lease, beat = m.owner(s.run_id)
            wedge = m.wedges.get(s.run_id)
            liveness = classify(s, lease, time.time(), m.limits, wedge, beat).state
        view = view_of(s, liveness)
        if s.terminal:
            self._live.pop(s.run_id, None)
        else:
            self._live[s.run_id] = view
        self._times[seq] = m.applied_time
        self._applied.append(Applied(seq, view, events))

    async def _apply(self, batch: list[Applied]) -> None:
        if not batch:
            return
        if self.leading:
            # The views first: they are what watchers wait for; the local model follows.
            await self._write(batch)
        else:
            self._keep(batch)
        if self.sink is not None:
            self.rows_written += await self.sink.apply(batch)
        for a in batch:
            self._times.pop(a.seq, None)

    def _keep(self, batch: list[Applied]) -> None:
        """A follower keeps what the leader has not written yet, for a take-over."""
        if self._backlog_lost:
            return
        self._backlog.extend(a for a in batch if a.seq > self._leader_position)
        if len(self._backlog) > _BACKLOG_MAX:
            self._backlog.clear()
            self._backlog_lost = True

    # --- writing views -------------------------------------------------------------------------

    async def _write(self, batch: Sequence[Applied]) -> None:
        """Write the views of ``batch`` (change messages, then KV entries); what is at or
        below ``written`` is done already."""
        if not batch:
            return
        if self._rebuild_until:
            await self._rebuild_part(batch)
        items = [a for a in batch if a.seq > self.written and self._writable(a.view)]
        if not items:
            self._advance(batch[-1].seq)
            return
        top = items[-1].seq
        if top > self._horizon and not await self._extend_horizon(top + _HORIZON_AHEAD):
            self._backlog_from = self.written  # what we wrote is written; the rest is kept
            self._keep(list(items))
            return
        await self._learn(items)
        changes: list[tuple[str, bytes, dict[str, str]]] = []
        finals: dict[str, RunView] = {}
        for a in items:
            v = a.view
            run_id = v.run_id
            entry = self._kv.get(run_id)
            if entry is not None and entry.view is not None and entry.view.last_seq >= a.seq:
                continue  # both writes were done before
            finals[run_id] = v
            if self._published.get(run_id, 0) >= a.seq:
                continue  # its change message was stored before
            msg_id = f"{run_id}:{a.seq}"
            changes.append((self.names.change(v.agent, run_id), encode(v), {h.MSG_ID: msg_id}))
        await self._publish_all(changes)
        self.changes_published += len(changes)
        await self._put_all(list(finals.values()))
        for run_id, v in finals.items():
            self._published.pop(run_id, None)
            if v.liveness == "ended":
                self._kv.pop(run_id, None)
        self._advance(batch[-1].seq)

    def _writable(self, view: RunView) -> bool:
        """Whether ``view`` can be written: a view has a change subject only if its agent is
        a name. A run whose first message names none (a message no intake wrote: not a
        readable ``RunStarted``, published on an event subject by anyone) has no view; its
        decisions are counted (``malformed["events"]``) and passed over, and the views of
        every other run go on being written."""
        if _TOKEN.fullmatch(view.agent):
            return True
        self.malformed["events"] += 1
        return False

    def _advance(self, seq: int) -> None:
        if seq > self.written:
            self.written = seq
            self._written_time = self._times.get(seq, self._written_time)

    async def _learn(self, items: Sequence[Applied]) -> None:
        """Read the KV entries of the runs this batch writes whose entry this projector does
        not know, and, for decisions a previous leader may have begun writing (up to its
        horizon), their last change message. A run's first decision past the horizon needs
        neither: its key can only hold a pending view, and a refused write reads it then."""
        kv: set[str] = set()
        changes: dict[str, str] = {}
        for a in items:
            run_id = a.view.run_id
            if run_id in self._kv or run_id in kv:
                continue
            first = len(a.events) == a.view.events
            if a.seq <= self._recover_to:
                kv.add(run_id)
                changes[run_id] = self.names.change(a.view.agent, run_id)
            elif not first:
                kv.add(run_id)
        if not kv:
            return

        async def read_kv(run_id: str) -> None:
            self._kv[run_id] = await self._read_entry(run_id)

        async def read_change(run_id: str, subject: str) -> None:
            m = await self.broker.direct_get_last(self.names.changes_stream, subject)
            view = _decode_view(m.data) if m is not None else None
            if view is not None:
                self._published[run_id] = view.last_seq

        jobs = [read_kv(r) for r in kv] + [read_change(r, s) for r, s in changes.items()]
        for i in range(0, len(jobs), _PIPELINE):
            await asyncio.gather(*jobs[i : i + _PIPELINE])

    async def _read_entry(self, run_id: str) -> _Entry:
        m = await self.broker.direct_get_last(self.names.runs_kv_stream, self.names.run_key(run_id))
        if m is None:
            return _Entry(0, None)
        if m.header(h.KV_OPERATION) in ("DEL", "PURGE"):
            return _Entry(m.seq, None)
        return _Entry(m.seq, _decode_view(m.data))

    async def _publish_all(self, msgs: list[tuple[str, bytes, dict[str, str]]]) -> None:
        """Publish every message (deduplicated by its id); retried until each is stored, since
        a change message must never be missing.

        Atomic batches first: under ``sync_interval: always`` a batch costs one flush where
        single publishes cost one each. A batch the stream refuses (one id it holds already,
        after a takeover) or does not answer falls back to one publish per message, which
        settles each duplicate on its own."""
        todo = []
        for i in range(0, len(msgs), _BATCH):
            chunk = msgs[i : i + _BATCH]
            if not isinstance(await self._try_batch(chunk), PublishAck):
                todo.extend(chunk)
        delay = 0.1
        while todo:
            results = await self._gather([self._try(s, d, hd) for s, d, hd in todo])
            pairs = zip(todo, results, strict=True)
            failed = [m for m, r in pairs if not isinstance(r, PublishAck)]
            if not failed:
                return
            if self._stopping:
                raise BrokerUnavailable(f"{len(failed)} change messages not stored yet")
            log.warning("projector: %d change messages not stored yet; retrying", len(failed))
            todo = failed
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)

    async def _try(
        self, subject: str, data: bytes, headers: dict[str, str]
    ) -> PublishAck | JetStreamError | None:
        try:
            return await self.broker.try_publish(subject, data, headers)
        except TimeoutError:
            return None

    @staticmethod
    async def _gather(jobs: Sequence[Awaitable[T]]) -> list[T]:
        """Run ``jobs`` concurrently, at most ``_PIPELINE`` at a time, in order."""
        out: list[T] = []
        for i in range(0, len(jobs), _PIPELINE):
            out.extend(await asyncio.gather(*jobs[i : i + _PIPELINE]))
        return out

    async def _try_batch(
        self, msgs: Sequence[tuple[str, bytes, dict[str, str]]]
    ) -> PublishAck | JetStreamError | None:
        try:
            return await self.broker.try_publish_batch(msgs)
        except (TimeoutError, BrokerUnavailable) as e:
            log.debug("projector: a batch of %d was not acknowledged: %s", len(msgs), e)
            return None

    async def _put_all(self, views: list[RunView]) -> None:
        """Write the views (one per run) as KV entries by compare-and-set: in atomic batches,
        each message fenced on its key's sequence; a batch refused (one fence broken: another
        writer was there) or unanswered is written view by view (``_put``)."""
        rest: list[RunView] = []
        for i in range(0, len(views), _BATCH):
            chunk = views[i : i + _BATCH]
            entries = [self._kv.get(v.run_id) or _Entry(0, None) for v in chunk]
            ack = await self._try_batch(
                [
                    (self.names.run_key(v.run_id), encode(v), {_EXPECT: str(e.seq)})
                    for v, e in zip(chunk, entries, strict=True)
                ]
            )
            if isinstance(ack, PublishAck):
                first = ack.seq - len(chunk) + 1  # a batch is stored contiguously
                for k, v in enumerate(chunk):
                    self._kv[v.run_id] = _Entry(first + k, v)
                self.views_written += len(chunk)
            else:
                rest.extend(chunk)
        await self._gather([self._put(v) for v in rest])

    async def _put(self, view: RunView, *, only_newer: bool = True) -> bool:
        """Write ``view`` as its run's KV entry by compare-and-set; ``False`` when the entry
        already holds this decision or a later one (written by us before, or by another
        leader)."""
        run_id = view.run_id
        subject = self.names.run_key(run_id)
        data = encode(view)
        entry = self._kv.get(run_id) or _Entry(0, None)
        delay = 0.1
        while True:
            ack = await self._try(subject, data, {_EXPECT: str(entry.seq)})
            if isinstance(ack, PublishAck):
                self._kv[run_id] = _Entry(ack.seq, view)
                self.views_written += 1
                return True
            if isinstance(ack, JetStreamError) and ack.err_code == _WRONG_LAST:
                entry = await self._read_entry(run_id)
                self._kv[run_id] = entry
                cur = entry.view
                if cur is not None and cur.last_seq > 0 and only_newer:
                    if cur.last_seq >= view.last_seq:
                        return False
                continue
            if self._stopping:
                raise BrokerUnavailable(f"the view of {run_id} was not written")
            log.warning("projector: writing the view of %s: %s; retrying", run_id, ack)
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)

    # --- leadership ----------------------------------------------------------------------------

    def _record(self, now: float, position: int, horizon: int) -> bytes:
        return encode(
            LeaderRecord(
                owner=self.projector_id,
                expires_at=now + self.leader_ttl,
                position=position,
                horizon=horizon,
                at=now,
            )
        )

    async def _cas_record(self, expected: int, position: int, horizon: int) -> bool:
        subject = self.names.leader(ROLE)
        body = self._record(time.time(), position, horizon)
        ack = await self.broker.try_publish(subject, body, {_EXPECT: str(expected)})
        if isinstance(ack, PublishAck):
            self._leader_seq = ack.seq
            return True
        return False

    async def _extend_horizon(self, horizon: int) -> bool:
        """Move the horizon before writing past it; ``False``: leadership was lost."""
        if await self._cas_record(self._leader_seq, self.written, horizon):
            self._horizon = horizon
            return True
        log.warning("projector %s: lost the leadership", self.projector_id)
        self.leading = False
        return False

    async def _elect(self) -> None:
        """Renew the leadership, or take it if it is free or expired, or follow the leader."""
        if self.leading and await self._cas_record(self._leader_seq, self.written, self._horizon):
            return
        subject = self.names.leader(ROLE)
        m = await self.broker.direct_get_last(self.names.health_stream, subject)
        rec = _decode_record(m.data) if m is not None else None
        now = time.time()
        if rec is not None and rec.owner != self.projector_id and rec.expires_at > now:
            if self.leading:
                log.warning("projector %s: %s leads now", self.projector_id, rec.owner)
            self.leading = False
            self._follow(rec.position)
            return
        position = rec.position if rec is not None else 0
        horizon = max(position, rec.horizon if rec is not None else 0)
        if self.leading and rec is not None and rec.owner == self.projector_id:
            position, horizon = self.written, self._horizon
        if not await self._cas_record(m.seq if m is not None else 0, position, horizon):
            self.leading = False
            return
        if not self.leading:
            await self._take_over(position, horizon)

    def _follow(self, position: int) -> None:
        self._leader_position = max(self._leader_position, position)
        self._backlog = [a for a in self._backlog if a.seq > self._leader_position]
        self._backlog_from = self._leader_position

    async def _take_over(self, position: int, horizon: int) -> None:
        log.info(
            "projector %s leads (views written up to %d, checking up to %d)",
            self.projector_id,
            position,
            horizon,
        )
        self.leading = True
        self.written = position
        self._horizon = horizon
        self._recover_to = horizon
        self._kv.clear()
        self._published.clear()
        if self.rebuild and self.rebuild_seconds is None:
            self._rebuild_until = position
        covered = not self._backlog_lost and self._backlog_from <= position
        backlog, self._backlog = self._backlog, []
        if not covered:
            log.info("projector %s: folding again to take over", self.projector_id)
            await self._new_fold()
            return
        await self._write([a for a in backlog if a.seq > position])

    async def _resign(self) -> None:
        """Hand the leadership over at once: an expired record any projector may take."""
        subject = self.names.leader(ROLE)
        body = encode(
            LeaderRecord(
                owner=self.projector_id,
                expires_at=0.0,
                position=self.written,
                horizon=self._horizon,
                at=time.time(),
            )
        )
        await self.broker.try_publish(subject, body, {_EXPECT: str(self._leader_seq)})
        self.leading = False

    # --- the periodic pass ---------------------------------------------------------------------

    async def _tick(self) -> None:
        self._next_tick = time.monotonic() + self.interval
        await self._elect()
        await self._stream_state()
        if self.model.caught_up and not self._applied:
            await self._reassess()
            if not self.model.lag_events:
                self._scanned.set()

    async def _stream_state(self) -> None:
        try:
            info = await self.broker.api(f"$JS.API.STREAM.INFO.{self.names.events_stream}")
        except JetStreamError:
            return
        state = info.get("state", {})
        self._stream_created = str(info.get("created", ""))
        self.stream_last_seq = int(state.get("last_seq", 0) or 0)
        self.stream_last_time = _rfc3339(str(state.get("last_ts", "")))

    async def _reassess(self) -> None:
        """Judge every live run again and rewrite the views whose liveness changed."""
        judged = self.model.assess()
        changed: list[tuple[str, LivenessState]] = []
        for run_id, liv in judged.items():
            view = self._live.get(run_id)
            if view is None or liv.state == "ended":
                continue
            if view.liveness != liv.state:
                self._live[run_id] = msgspec.structs.replace(view, liveness=liv.state)
                changed.append((run_id, liv.state))
        if self.sink is not None and changed:
            await self.sink.set_liveness(changed)
        if not self.leading:
            return
        unknown = [r for r in self._live if r not in self._kv][:_READS_PER_TICK]

        async def read(run_id: str) -> None:
            self._kv[run_id] = await self._read_entry(run_id)

        await self._gather([read(r) for r in unknown])
        stale = []
        for run_id, view in self._live.items():
            entry = self._kv.get(run_id)
            if entry is None or entry.view is None:
                continue
            cur = entry.view
            if cur.last_seq == view.last_seq and cur.liveness != view.liveness:
                stale.append(view)
        if not stale:
            return
        await self._publish_all(
            [
                (
                    self.names.change(v.agent, v.run_id),
                    encode(v),
                    {h.MSG_ID: f"{v.run_id}:{v.last_seq}:{v.liveness}"},
                )
                for v in stale
            ]
        )
        self.changes_published += len(stale)
        await self._put_all(stale)

    # --- rebuild -------------------------------------------------------------------------------

    async def _verify(self, views: list[RunView]) -> None:
        """Rebuild: rewrite the KV entries that differ from the views recomputed from the
        history (a live run's liveness is the liveness pass's business, not compared)."""
        if not views:
            return
        for v in views:
            self._rebuild_views.pop(v.run_id, None)
        entries = await self._gather([self._read_entry(v.run_id) for v in views])
        fix = []
        for v, entry in zip(views, entries, strict=True):
            self._kv[v.run_id] = entry
            cur = entry.view
            if cur is not None and v.liveness != "ended":
                cur = msgspec.structs.replace(cur, liveness=v.liveness)
            if cur != v:
                fix.append(v)
        if fix:
            log.info("projector: rebuild rewrites %d views", len(fix))
        await self._gather([self._put(v, only_newer=False) for v in fix])
        for v in views:
            if v.liveness == "ended":
                self._kv.pop(v.run_id, None)

    async def _rebuild_part(self, batch: Sequence[Applied]) -> None:
        """Rebuild, for decisions up to where the last leader got: keep each run's last view,
        check an ended run's at once and the others' once the fold has passed that point."""
        for a in batch:
            if a.seq <= self._rebuild_until:
                self._rebuild_views[a.view.run_id] = a.view
            else:
                self._rebuild_views.pop(a.view.run_id, None)  # written anew below
        await self._verify([v for v in self._rebuild_views.values() if v.liveness == "ended"])
        if batch[-1].seq >= self._rebuild_until:
            await self._verify(list(self._rebuild_views.values()))
            self._rebuild_until = 0
            self._rebuild_done()

    async def _rebuild_finish(self) -> None:
        """Once the fold has caught up, a rebuild is over (for a leader, once it has checked
        every KV view up to where the last leader got)."""
        if self.rebuild and self.rebuild_seconds is None and not self._rebuild_until:
            self._rebuild_done()

    def _rebuild_done(self) -> None:
        if self.rebuild and self.rebuild_seconds is None:
            self.rebuild_seconds = time.monotonic() - self._rebuild_started
            log.info("projector: rebuilt in %.1fs", self.rebuild_seconds)

    # --- pending runs --------------------------------------------------------------------------

    async def _follow_inbox(self) -> None:
        """Pending views for new starts, removals for refused ones: at most every
        ``_INBOX_EVERY`` seconds, so that a burst of starts does not hold up the views of
        the runs already going."""
        now = time.monotonic()
        if now < self._next_inbox:
            return
        self._next_inbox = now + _INBOX_EVERY
        for follower in self._inbox:
            for _ in range(4):
                msgs = await follower.next_page()
                await self._on_starts(msgs)
                if not msgs or follower.pending == 0:
                    break
        for _ in range(4):
            msgs = await self._dlq.next_page()
            for m in msgs:
                await self._on_dead_letter(m)
            if not msgs or self._dlq.pending == 0:
                break

    def _known(self, run_id: str) -> bool:
        return run_id in self.model.runs or run_id in self._live

    async def _on_starts(self, msgs: Sequence[StoredMessage]) -> None:
        """Pending views for a page of stored starts, written together: change messages in
        one batch, then the keys that are still empty (created by compare-and-set on their
        sequence, so a view written meanwhile is never replaced)."""
        views: dict[str, RunView] = {}
        for m in msgs:
            try:
                parsed = self.names.parse_inbox(m.subject)
            except InvalidName:
                self.malformed["inbox"] += 1
                continue
            if parsed.kind != "start" or not parsed.name:
                self.malformed["inbox"] += 1
                continue
            run_id = parsed.name
            if not self._known(run_id) and run_id not in views:
                views[run_id] = pending_view(run_id, parsed.target, m.time or time.time())
        if not views:
            return
        if self.sink is not None:
            for view in views.values():
                await self.sink.put_pending(view)
        if not self.leading:
            return
        unknown = [r for r in views if r not in self._kv]
        entries = await self._gather([self._read_entry(r) for r in unknown])
        self._kv.update(zip(unknown, entries, strict=True))
        empty = [v for r, v in views.items() if self._kv[r].view is None]
        if not empty:
            return  # every one has a view already (pending, or the run's own)
        changes = [
            (self.names.change(v.agent, v.run_id), encode(v), {h.MSG_ID: f"{v.run_id}:0"})
            for v in empty
        ]
        await self._publish_all(changes)
        self.changes_published += len(changes)
        acks = await self._gather(
            [
                self._try(
                    self.names.run_key(v.run_id),
                    encode(v),
                    {_EXPECT: str(self._kv[v.run_id].seq)},
                )
                for v in empty
            ]
        )
        for v, ack in zip(empty, acks, strict=True):
            if isinstance(ack, PublishAck):
                self.views_written += 1
                self._kv[v.run_id] = _Entry(ack.seq, v)
            else:
                self._kv.pop(v.run_id, None)  # read again when next needed

    async def _on_dead_letter(self, m: StoredMessage) -> None:
        try:
            dl = decode_dead_letter(m.data)
            parsed = self.names.parse_inbox(dl.subject)
        except (msgspec.MsgspecError, InvalidName):
            self.malformed["dlq"] += 1
            return
        if parsed.kind != "start" or not parsed.name:
            return  # a start that named no run id has no pending view
        run_id = parsed.name
        if self._known(run_id):
            return
        if self.sink is not None:
            await self.sink.drop_pending(run_id)
        if not self.leading:
            return
        entry = self._kv.get(run_id) or await self._read_entry(run_id)
        if entry.view is None or entry.view.last_seq != 0:
            return  # no view, or the run's own: the start was not what was refused
        ack = await self._try(
            self.names.run_key(run_id),
            b"",
            {
                _EXPECT: str(entry.seq),
                h.KV_OPERATION: "DEL",
            },
        )
        if isinstance(ack, PublishAck):
            self._kv.pop(run_id, None)


def _decode_view(data: bytes) -> RunView | None:
    try:
        return decode_run_view(data)
    except msgspec.MsgspecError:
        return None


def _decode_record(data: bytes) -> LeaderRecord | None:
    try:
        rec: LeaderRecord = from_raw(data, LeaderRecord)
    except msgspec.MsgspecError:
        return None
    return rec


def _rfc3339(stamp: str) -> float:
    """A JetStream time stamp (RFC 3339, nanoseconds) as unix seconds; 0.0 if unreadable."""
    if not stamp or stamp.startswith("0001-"):
        return 0.0
    try:
        head, _, frac = stamp.rstrip("Z").partition(".")
        base = datetime.fromisoformat(head + "+00:00").timestamp()
        return base + (float("0." + frac.rstrip("Z")) if frac else 0.0)
    except ValueError:
        return 0.0
