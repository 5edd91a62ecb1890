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
from datetime import datetime

import msgspec

from sojourn.broker import BROKER_ERRORS
from sojourn.broker.connection import Broker, ConnectOptions, JetStreamError
from sojourn.broker.delivery import Delivery, Subscription
from sojourn.broker.names import Names
from sojourn.broker.tasks import STOP_GRACE, cancel_and_wait
from sojourn.broker.topology import ensure_topology
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import SojournError
from sojourn.schemas.events import RunEvent
from sojourn.schemas.health import LivenessState
from sojourn.schemas.names import TOKEN_PATTERN
from sojourn.schemas.views import RunView

from .leadership import Backlog, Leadership
from .liveness import classify
from .model import RunModel, read_snapshot
from .pending import PendingViews
from .queues import placed, positions
from .rebuild import Rebuild
from .sink import Applied, ViewSink
from .snapshots import Snapshots
from .summary import RunSummary
from .views import view_of
from .viewstore import ViewStore

__all__ = ["Applied", "Projector", "ViewSink"]

log = logging.getLogger("sojourn.projector")

_TOKEN = re.compile(TOKEN_PATTERN)  # an agent name: what a change subject can hold
_HORIZON_AHEAD = 1000
"""How far past a batch the leader moves its horizon, so the leader record is not rewritten
before every small batch (a new leader checks at most this many more decisions)."""


class Projector:
    """Keeps the read side of one deployment current (``sojourn projector``).

    Its parts, each with its own state: the leader's writes (``ViewStore``), the leader record
    (``Leadership``) and a follower's ``Backlog``, the snapshot schedule (``Snapshots``),
    pending views from the inbox (``PendingViews``) and a ``Rebuild``. It owns the fold, the
    views made from it and not yet written, and the loop.

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
        self.interval = interval
        self.poll = poll
        self.from_snapshot = from_snapshot and not rebuild
        self.projector_id = (
            projector_id or f"pj-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        self._url = nats
        self._broker = broker
        self._owns_broker = broker is None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        # counters (exported by ``sojourn.actors.ops.metrics``), with those of the parts
        self.rows_written = 0
        self.malformed = {"inbox": 0, "dlq": 0, "events": 0}
        self._stream = _StreamState()

        def connection() -> Broker:
            return self.broker

        self._store = ViewStore(connection, self.names, lambda: self._stopping)
        self._lead = Leadership(
            connection, self.names, self.projector_id, max(leader_ttl, 2 * interval)
        )
        self._backlog = Backlog()
        self._rebuild = Rebuild(self._store, rebuild)
        self._snapshots = Snapshots(
            connection,
            self.names,
            replicas=self.settings.replicas,
            stream_created=lambda: self._stream.created,
            every=snapshot_every,
            decisions=snapshot_decisions,
        )
        self._pending = PendingViews(
            self.names, self._store, self._lead, sink, self._known, self.malformed
        )
        self.written = 0
        """Every view of a decision up to this events sequence is written (as leader)."""
        # the fold and the views made from it
        self.model: RunModel
        self._applied: list[Applied] = []
        self._times: dict[int, float] = {}
        self._written_time = 0.0
        self._live: dict[str, RunView] = {}
        self._scanned = asyncio.Event()
        self._next_tick = 0.0
        self._appended = asyncio.Event()
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
        self._snapshots.start_clock()
        await self._new_fold()
        self._pending.open(b)
        if self._rebuild.wanted:
            self._rebuild.begin()
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
        # Bounded, cancelled again while it goes on: a cancel swallowed in nats-py would
        # otherwise leave the stop waiting forever.
        await cancel_and_wait(self._task, STOP_GRACE)
        await self._final_snapshot()
        if self.leading and self._broker is not None and self._broker.connected:
            # Bounded: a stop ends within a couple of seconds whatever the server's state (a
            # record left behind only makes the next leader wait for it to expire).
            with contextlib.suppress(SojournError, TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._store.flush_steps()  # the step records held back
            with contextlib.suppress(SojournError, TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._lead.resign(self.written)
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

    # --- what it reports -----------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        """Whether this projector leads (writes the views)."""
        return self._lead.leading

    @property
    def position(self) -> int:
        """How far this projector's own work goes: what it wrote as leader, else what it
        folded."""
        return self.written if self.leading else self.model.position

    @property
    def lag_events(self) -> int:
        return max(0, self._stream.last_seq - self.position)

    @property
    def lag_seconds(self) -> float:
        if self.lag_events == 0 or not self._stream.last_time:
            return 0.0
        done = self._written_time if self.leading else self.model.applied_time
        return max(0.0, self._stream.last_time - done) if done else 0.0

    @property
    def views_written(self) -> int:
        return self._store.views_written

    @property
    def changes_published(self) -> int:
        return self._store.changes_published

    @property
    def rebuild_seconds(self) -> float | None:
        """How long the rebuild took, once it is over (``None`` before, or without one)."""
        return self._rebuild.seconds

    @property
    def snapshots_written(self) -> int:
        return self._snapshots.written

    # --- the loop ------------------------------------------------------------------------------

    async def _loop(self) -> None:
        me = asyncio.current_task()
        while not self._stopping and not (me is not None and me.cancelling()):
            busy = False
            try:
                if time.monotonic() >= self._next_tick:
                    await self._tick()
                busy = await self._step()
                await self._pending.follow()
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
            with contextlib.suppress(BaseException):
                await cancel_and_wait(read, STOP_GRACE)
            self._applied[:0] = batch  # not lost: written on the next pass
            raise
        caught_up = await read
        if snap is not None and self.leading and self.written >= snap.position:
            self._snapshots.store(snap)
        if caught_up and not self._applied:
            self._rebuild.caught_up()
        return bool(batch) or bool(self._applied) or not caught_up

    async def _new_fold(self) -> None:
        """A fresh fold (at start, and when a follower's backlog overflowed): from the stored
        snapshot if one may be used, else from sequence 1."""
        self.model = RunModel(self.broker, self.names, self.settings)
        self.model.on_decision = self._on_decision
        self._applied.clear()
        self._live.clear()
        self._store.entries.clear()
        self._backlog.reset()
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
        self._snapshots.position = max(self._snapshots.position, snap.position)
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
        self._applied.append(Applied(seq, view, events, s))

    def _known(self, run_id: str) -> bool:
        return run_id in self.model.runs or run_id in self._live

    async def _apply(self, batch: list[Applied]) -> None:
        if not batch:
            return
        if self.leading:
            # The views first: they are what watchers wait for; the local model follows.
            await self._write(batch)
        else:
            self._backlog.keep(batch)
        if self.sink is not None:
            self.rows_written += await self.sink.apply(batch)
        for a in batch:
            self._times.pop(a.seq, None)

    # --- snapshots -----------------------------------------------------------------------------

    def _snapshot_due(self, batch: list[Applied]) -> bool:
        """Whether to take a snapshot now, at the end of ``batch``: one is due, and once
        ``batch`` is written every decision the model holds will be."""
        if not self.leading or self._rebuild.until:
            return False
        end = batch[-1].seq if batch else self.written
        return self._snapshots.due(end, self.model.position)

    async def _final_snapshot(self) -> None:
        """At a graceful stop, as leader: write what was folded and not yet written, then
        store a snapshot of it (bounded: a stop ends within seconds whatever the server's
        state; a snapshot not stored only means the next start reads more)."""
        snapshots = self._snapshots
        await snapshots.settle()
        if not (snapshots.every and self.leading and self.model.position):
            return
        if self._broker is None or not self._broker.connected or self._rebuild.until:
            return
        with contextlib.suppress(SojournError, TimeoutError):
            async with asyncio.timeout(5.0):
                if self._applied:
                    batch, self._applied = self._applied, []
                    await self._apply(batch)
                if self.leading and self.written >= self.model.position > snapshots.position:
                    snap = self.model.snapshot(taken_at=time.time())
                    snapshots.position = snap.position
                    await snapshots.put(snap)

    # --- writing views -------------------------------------------------------------------------

    async def _write(self, batch: list[Applied]) -> None:
        """Write the views of ``batch`` (change messages, then KV entries); what is at or
        below ``written`` is done already."""
        if not batch:
            return
        if self._rebuild.until:
            await self._rebuild.check(batch)
        items = [a for a in batch if a.seq > self.written and self._writable(a.view)]
        if not items:
            self._advance(batch[-1].seq)
            return
        top = items[-1].seq
        if top > self._lead.horizon and not await self._extend_horizon(top + _HORIZON_AHEAD):
            self._backlog.lost_lead(self.written, items)
            return
        await self._store.write(items, self._lead.recover_to)
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

    # --- leadership ----------------------------------------------------------------------------

    async def _extend_horizon(self, horizon: int) -> bool:
        """Move the horizon before writing past it; ``False``: leadership was lost."""
        return await self._lead.extend(self.written, horizon)

    async def _elect(self) -> None:
        """Renew the leadership, or take it if it is free or expired, or follow the leader."""
        lead = self._lead
        if lead.leading and await lead.renew(self.written):
            return
        seq, rec = await lead.read()
        now = time.time()
        if rec is not None and rec.owner != self.projector_id and rec.expires_at > now:
            if lead.leading:
                log.warning("projector %s: %s leads now", self.projector_id, rec.owner)
            lead.leading = False
            self._backlog.follow(rec.position)
            return
        position = rec.position if rec is not None else 0
        horizon = max(position, rec.horizon if rec is not None else 0)
        if lead.leading and rec is not None and rec.owner == self.projector_id:
            position, horizon = self.written, lead.horizon
        if not await lead.cas(seq, position, horizon):
            lead.leading = False
            return
        if not lead.leading:
            await self._take_over(position, horizon)

    async def _take_over(self, position: int, horizon: int) -> None:
        log.info(
            "projector %s leads (views written up to %d, checking up to %d)",
            self.projector_id,
            position,
            horizon,
        )
        self._lead.took(horizon)
        self.written = position
        self._store.forget()
        self._rebuild.check_to(position)
        backlog = self._backlog.take(position)
        if backlog is None:
            log.info("projector %s: folding again to take over", self.projector_id)
            await self._new_fold()
            return
        await self._write(backlog)

    # --- the periodic pass ---------------------------------------------------------------------

    async def _tick(self) -> None:
        self._next_tick = time.monotonic() + self.interval
        await self._elect()
        await self._stream.refresh(self.broker, self.names.events_stream)
        if self.leading:
            await self._store.flush_steps()  # the step records held back (decision 0040)
        if self.model.caught_up and not self._applied:
            await self._reassess()
            if not self.model.lag_events:
                self._scanned.set()

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
        # queued runs' places in their keys' queues (decision 0048)
        self._live.update(placed(self._live, positions(self.model.runs.values())))
        if self.sink is not None and changed:
            await self.sink.set_liveness(changed)
        if self.leading:
            await self._store.rewrite_liveness(self._live)


class _StreamState:
    """The events stream's state as last read: when it was created, its last message's
    sequence and time (unix seconds; 0.0 unknown)."""

    def __init__(self) -> None:
        self.created = ""
        self.last_seq = 0
        self.last_time = 0.0

    async def refresh(self, broker: Broker, stream: str) -> None:
        """Read them again (kept as they were when the stream does not answer)."""
        try:
            info = await broker.api(f"$JS.API.STREAM.INFO.{stream}")
        except JetStreamError:
            return
        state = info.get("state", {})
        self.created = str(info.get("created", ""))
        self.last_seq = int(state.get("last_seq", 0) or 0)
        self.last_time = _rfc3339(str(state.get("last_ts", "")))


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
