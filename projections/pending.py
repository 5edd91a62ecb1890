"""Pending views: runs whose start is stored in the inbox and not yet taken, and their removal.

The projector follows the inbox for starts naming their run id: a run it does not know yet gets
a ``pending`` view (``views.pending_view``), in the read model and, as leader, in the runs
bucket, where it is created only if the key is empty (a view written meanwhile is never
replaced). It follows the dead letters of starts too: the pending view of a refused start is
deleted, unless the run has begun.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import msgspec

from sojourn.broker import headers as h
from sojourn.broker.connection import Broker
from sojourn.broker.delivery import PublishAck, StoredMessage
from sojourn.broker.follow import StreamFollower
from sojourn.broker.names import Names
from sojourn.schemas.codec import decode_dead_letter, encode
from sojourn.schemas.errors import InvalidName
from sojourn.schemas.views import RunView

from .leadership import Leadership
from .sink import ViewSink
from .views import pending_view
from .viewstore import EXPECT, Entry, ViewStore

__all__ = ["PendingViews"]

_INBOX_EVERY = 0.1
"""Seconds between two looks at the inbox for new starts (pending views)."""


class PendingViews:
    """Follows the inbox's starts and the dead letters of starts into pending views.

    Args:
        names: the deployment's names.
        store: the leader's writes.
        lead: the projector's leadership (only a leader writes the runs bucket).
        sink: the read model fed from the fold, if any.
        known: whether the fold knows a run (it has a view of its own, never replaced).
        malformed: the projector's counts of malformed messages, by source (``inbox``,
            ``dlq``).
    """

    def __init__(
        self,
        names: Names,
        store: ViewStore,
        lead: Leadership,
        sink: ViewSink | None,
        known: Callable[[str], bool],
        malformed: dict[str, int],
    ) -> None:
        self.names = names
        self._store = store
        self._lead = lead
        self._sink = sink
        self._known = known
        self._malformed = malformed
        self._inbox: list[StreamFollower] = []
        self._dlq: list[StreamFollower] = []
        self._next = 0.0

    def open(self, broker: Broker) -> None:
        """Follow the inbox's starts and the dead letters of starts from their beginning."""
        names = self.names
        p = names.prefix
        # The default lane's forms and the other priorities' (``<prefix>[.as.<sender>].p<n>.
        # start.<agent>.<run_id>``: the inbox stores no other form with that many tokens).
        self._inbox = [
            StreamFollower(broker, names.inbox_stream, f"{p}.start.*.*"),
            StreamFollower(broker, names.inbox_stream, f"{p}.as.*.start.*.*"),
            StreamFollower(broker, names.inbox_stream, f"{p}.*.start.*.*"),
            StreamFollower(broker, names.inbox_stream, f"{p}.as.*.*.start.*.*"),
        ]
        self._dlq = [StreamFollower(broker, names.dlq_stream, names.dlq("start"))]

    async def follow(self) -> None:
        """Pending views for new starts, removals for refused ones: at most every
        ``_INBOX_EVERY`` seconds, so that a burst of starts does not hold up the views of
        the runs already going."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + _INBOX_EVERY
        for follower in self._inbox:
            for _ in range(4):
                msgs = await follower.next_page()
                await self._on_starts(msgs)
                if not msgs or follower.pending == 0:
                    break
        for dlq in self._dlq:
            for _ in range(4):
                msgs = await dlq.next_page()
                for m in msgs:
                    await self._on_dead_letter(m)
                if not msgs or dlq.pending == 0:
                    break

    async def _on_starts(self, msgs: Sequence[StoredMessage]) -> None:
        """Pending views for a page of stored starts, written together: change messages in
        one batch, then the keys that are still empty (created by compare-and-set on their
        sequence, so a view written meanwhile is never replaced)."""
        views: dict[str, RunView] = {}
        for m in msgs:
            try:
                parsed = self.names.parse_inbox(m.subject)
            except InvalidName:
                self._malformed["inbox"] += 1
                continue
            if parsed.kind != "start" or not parsed.name:
                self._malformed["inbox"] += 1
                continue
            run_id = parsed.name
            if not self._known(run_id) and run_id not in views:
                views[run_id] = pending_view(
                    run_id, parsed.target, m.time or time.time(), parsed.priority
                )
        if not views:
            return
        if self._sink is not None:
            for view in views.values():
                await self._sink.put_pending(view)
        if not self._lead.leading:
            return
        store = self._store
        unknown = [r for r in views if r not in store.entries]
        entries = await store.gather([store.read_entry(r) for r in unknown])
        store.entries.update(zip(unknown, entries, strict=True))
        empty = [v for r, v in views.items() if store.entries[r].view is None]
        if not empty:
            return  # every one has a view already (pending, or the run's own)
        await store.publish_all(
            [
                (self.names.change(v.agent, v.run_id), encode(v), {h.MSG_ID: f"{v.run_id}:0"})
                for v in empty
            ]
        )
        acks = await store.gather(
            [
                store.try_publish(
                    self.names.run_key(v.run_id),
                    encode(v),
                    {EXPECT: str(store.entries[v.run_id].seq)},
                )
                for v in empty
            ]
        )
        for v, ack in zip(empty, acks, strict=True):
            if isinstance(ack, PublishAck):
                store.views_written += 1
                store.entries[v.run_id] = Entry(ack.seq, v)
            else:
                store.entries.pop(v.run_id, None)  # read again when next needed

    async def _on_dead_letter(self, m: StoredMessage) -> None:
        try:
            dl = decode_dead_letter(m.data)
            parsed = self.names.parse_inbox(dl.subject)
        except (msgspec.MsgspecError, InvalidName):
            self._malformed["dlq"] += 1
            return
        if parsed.kind != "start" or not parsed.name:
            return  # a start that named no run id has no pending view
        run_id = parsed.name
        if self._known(run_id):
            return
        if self._sink is not None:
            await self._sink.drop_pending(run_id)
        if not self._lead.leading:
            return
        store = self._store
        entry = store.entries.get(run_id) or await store.read_entry(run_id)
        if entry.view is None or entry.view.last_seq != 0:
            return  # no view, or the run's own: the start was not what was refused
        ack = await store.try_publish(
            self.names.run_key(run_id), b"", {EXPECT: str(entry.seq), h.KV_OPERATION: "DEL"}
        )
        if isinstance(ack, PublishAck):
            store.entries.pop(run_id, None)
