"""Watching one run: its views as the projector writes them, or its decisions as they land.

Two followers, for two kinds of reader:

- ``watch_run`` yields a run's ``RunView``s (``schemas/views.py``) in order until it ends: the
  change messages already stored in the changes stream, then each new one. It needs a
  projector (``sojourn projector``, or ``sojourn dev``) and is what ``Client.watch`` returns.
- ``follow_history`` yields a run's stored decisions in order until it ends, from the events
  stream itself: it works without a projector (``sojourn watch`` builds its timeline on it).

Both follow the same pattern as ``Client.result``: a core subscription first (flushed, so the
server has it before anything is read), then the stored messages, then each new one; and a
re-read of what is stored every ``REREAD_EVERY`` seconds, because a core subscription misses
what is published while the connection is down. A live message is never trusted on its own: a
change body is validated like any wire input, and a live event message is only a hint (a
fenced writer's refused append is published too), so decisions are read back from the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import msgspec

from sojourn.broker.connection import Broker
from sojourn.broker.delivery import Delivery
from sojourn.broker.eventstore import Decision, EventStore
from sojourn.broker.names import Names
from sojourn.schemas.codec import decode_events, decode_run_view
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import RunNotFound
from sojourn.schemas.events import RunEvent, RunStarted
from sojourn.schemas.health import LivenessState
from sojourn.schemas.lifecycle import TERMINAL_EVENTS
from sojourn.schemas.names import TOKEN_PATTERN, validate_token
from sojourn.schemas.views import RunView
from sojourn.schemas.vocabulary import is_terminal

from ..history.chain import continued_as
from ..history.pending import find_pending

__all__ = [
    "LIVE_QUEUE",
    "REREAD_EVERY",
    "VIEW_MAX_BYTES",
    "Presence",
    "ViewOrder",
    "agent_of",
    "decode_change",
    "decode_view",
    "end_in",
    "follow_history",
    "presence",
    "read_view",
    "watch_run",
]

T = TypeVar("T")

_HINTED_FIRST = 0.002
_HINTED_LAST = 1.0
"""After a live view, the stream is read again after 2, 4, 8 ... ms until it shows it, for
at most about 2 s; then the regular re-read (``REREAD_EVERY``) takes over."""

REREAD_EVERY = 5.0
"""Seconds between two re-reads of what is stored: the most a view or a decision published
while the connection was down arrives late."""

SETTLE_FIRST = 0.004
SETTLE_LAST = 0.5
"""After the first read, the stream is read again after 4, 8, 16 ... ms, for about 1 s, before
the regular re-read takes over: a message published just before the subscription was in place
is never heard, and the server stores it a moment after delivering it to the subscribers it
had, so the first read may have missed it too (found by bench.gateway: 1 watch in 100 waited
the whole ``REREAD_EVERY``)."""

VIEW_MAX_BYTES = 256 * 1024
"""The largest change body read: a view is a few hundred bytes (its lists are bounded,
``CHILDREN_SHOWN``, ``ERROR_MESSAGE_MAX``); anything far larger is not one."""

LIVE_QUEUE = 1024
"""Live views held for a slow reader; past that they are dropped and read back from the
changes stream instead (at once), so a flood costs memory for this many only."""

_BATCH = 256
_TOKEN = re.compile(TOKEN_PATTERN)

Presence = Literal["exists", "pending", "missing"]
"""What is known of a run id: it has a history or a view, only a stored start (or a pending
view), or nothing at all."""


@dataclass(slots=True)
class ViewOrder:
    """Which views of one run a watcher passes on: each once, in order (pure).

    A run's views only move forward in ``last_seq``; several views of one decision differ only
    in liveness (the projector publishes liveness changes too). So a view is new when its
    ``last_seq`` is above the last one passed, or equal to it with a liveness not yet seen for
    that decision. Anything else is a copy (the same view read live and from the stream) or
    older than what was already passed on (a stored view read back after a newer live one).
    """

    last_seq: int = -1
    seen: set[LivenessState | None] = field(default_factory=set)

    def admit(self, view: RunView) -> bool:
        """Whether ``view`` is new; if so it is recorded as passed on."""
        if view.last_seq < self.last_seq:
            return False
        if view.last_seq > self.last_seq:
            self.last_seq = view.last_seq
            self.seen = {view.liveness}
            return True
        if view.liveness in self.seen:
            return False
        self.seen.add(view.liveness)
        return True

    def passed(self, view: RunView) -> bool:
        """Whether ``view`` (or a later one) was passed on already."""
        return view.last_seq < self.last_seq or (
            view.last_seq == self.last_seq and view.liveness in self.seen
        )


def decode_view(run_id: str, data: bytes) -> RunView | None:
    """A view of ``run_id`` (a runs-bucket value or a change body), or ``None`` when the bytes
    are not one: larger than ``VIEW_MAX_BYTES``, not a ``RunView``, or naming another run."""
    if len(data) > VIEW_MAX_BYTES:
        return None
    try:
        view = decode_run_view(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if view.run_id != run_id or view.last_seq < 0:
        return None
    return view


def decode_change(names: Names, run_id: str, subject: str, data: bytes) -> RunView | None:
    """A change message of ``run_id`` as a view, or ``None`` when it is not a valid one.

    The bytes are hostile: the subject must be ``<prefix>.runs.<agent>.<run_id>`` (full match)
    and the body a view of this run (``decode_view``) and of that agent.
    """
    m = re.fullmatch(
        rf"{re.escape(names.prefix)}\.runs\.({TOKEN_PATTERN})\.{re.escape(run_id)}", subject
    )
    if m is None:
        return None
    view = decode_view(run_id, data)
    return view if view is not None and view.agent == m.group(1) else None


def end_in(data: bytes) -> RunEvent | None:
    """The event that ends a run among a stored message's events (an events-stream message:
    one decision), or ``None`` when it holds none or cannot be decoded."""
    try:
        events = decode_events(data)
    except msgspec.MsgspecError:
        return None
    return next((e for e in events if isinstance(e, TERMINAL_EVENTS)), None)


async def presence(broker: Broker, names: Names, run_id: str) -> Presence:
    """Whether ``run_id`` exists (a history or a view), is only pending (its start stored in
    the inbox, or a view saying ``pending``), or is unknown.

    The inbox is looked at before the history: the intake acknowledges a start only after it
    wrote the run's first event, so a start gone from the inbox is found in the history.
    """
    validate_token(run_id, "run_id")
    pending = await _stored_start(broker, names, run_id)
    if await broker.direct_get_last(names.events_stream, names.events(run_id)) is not None:
        return "exists"
    view = await read_view(broker, names, run_id)
    if view is not None:
        return "pending" if view.status == "pending" else "exists"
    return "pending" if pending is not None else "missing"


async def agent_of(broker: Broker, names: Names, run_id: str) -> str | None:
    """The agent of ``run_id`` as the trusted records say (its view in the runs bucket, its
    stored start, its ``RunStarted``), ``None`` when nothing is known of the run. A watch
    listens on that agent's change subject only, so a view published under another agent's
    name is never heard. A name that is not a subject token is no agent (it would become a
    wildcard in the subscription)."""
    view = await read_view(broker, names, run_id)
    if view is not None and _TOKEN.fullmatch(view.agent):
        return view.agent
    agent = await _stored_start(broker, names, run_id)  # before the history: see presence
    if agent is not None:
        return agent
    first = await broker.direct_get_next(names.events_stream, names.events(run_id), 1)
    if first is None:
        return None
    try:
        events = decode_events(first.data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    start = events[0] if events else None
    if isinstance(start, RunStarted) and _TOKEN.fullmatch(start.agent):
        return start.agent
    return None


async def read_view(broker: Broker, names: Names, run_id: str) -> RunView | None:
    """The run's view in the runs bucket (``None``: no entry, a delete marker, not a view)."""
    m = await broker.direct_get_last(names.runs_kv_stream, names.run_key(run_id))
    return None if m is None else decode_view(run_id, m.data)


async def _stored_start(broker: Broker, names: Names, run_id: str) -> str | None:
    """The agent of a start of ``run_id`` stored in the inbox and not yet taken (one the
    intake would not refuse at once: ``find_pending``); ``None`` when there is none."""
    pending = await find_pending(broker, names, run_id, max_payload=broker.max_payload)
    return None if pending is None else pending.agent


class _Deadline:
    """An optional deadline: how long a broker call may still take."""

    def __init__(self, run_id: str, timeout: float | None) -> None:
        self.run_id = run_id
        self.timeout = timeout
        self.at = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> float | None:
        return None if self.at is None else self.at - time.monotonic()

    def expired(self) -> TimeoutError:
        return TimeoutError(f"run {self.run_id} did not end within {self.timeout}s")

    async def bound(self, aw: Coroutine[Any, Any, T]) -> T:
        """``aw``'s result, if it comes before the deadline. A deadline already passed closes
        ``aw`` unawaited (a coroutine dropped unawaited is a warning when it is collected)."""
        left = self.remaining()
        if left is None:
            return await aw
        if left <= 0:
            aw.close()
            raise self.expired()
        try:
            return await asyncio.wait_for(aw, left)
        except TimeoutError:
            raise self.expired() from None


class _ViewWatch:
    """One ``watch_run``: the live queue, the stored position and the order of views."""

    def __init__(
        self, broker: Broker, names: Names, run_id: str, agent: str, deadline: _Deadline
    ) -> None:
        self.broker = broker
        self.names = names
        self.run_id = run_id
        self.subject = names.change(agent, run_id)
        self.deadline = deadline
        self.order = ViewOrder()
        self.live: asyncio.Queue[RunView] = asyncio.Queue(LIVE_QUEUE)
        self.overflowed = False
        self.stored_from = 1  # the next changes-stream sequence to read

    async def on_change(self, msg: Delivery) -> None:
        view = decode_change(self.names, self.run_id, msg.subject, msg.data)
        if view is None:
            return
        try:
            self.live.put_nowait(view)
        except asyncio.QueueFull:
            self.overflowed = True  # read back from the stream instead

    async def stored(self) -> AsyncIterator[RunView]:
        """The stored change messages after the last one read, decoded (invalid ones skipped)."""
        while True:
            msgs, more = await self.deadline.bound(
                self.broker.direct_get_batch(
                    self.names.changes_stream, self.subject, self.stored_from, _BATCH
                )
            )
            for m in msgs:
                self.stored_from = max(self.stored_from, m.seq + 1)
                view = decode_change(self.names, self.run_id, m.subject, m.data)
                if view is not None:
                    yield view
            if not msgs or more == 0:
                return

    async def fresh(self) -> AsyncIterator[RunView]:
        """The stored views not passed on yet, in the stream's order (recorded as passed)."""
        async for view in self.stored():
            if self.order.admit(view):
                yield view

    async def views(self) -> AsyncGenerator[RunView, None]:
        """Every view of the run, each once, in order, for as long as it is iterated: the
        stored ones, then new ones as live messages hint at them."""
        found = False
        async for view in self.fresh():
            found = True
            yield view
        if not found:
            # Aged out, or none written yet. The projector stores a change message before it
            # puts its view in the bucket, so read the bucket, then the stream again: if the
            # stream shows nothing even now, the entry's changes aged out and it is where to
            # start; if it does, they were being written just now and are the ones to pass on.
            entry = await self.kv_view()
            async for view in self.fresh():
                found = True
                yield view
            if not found and entry is not None and self.order.admit(entry):
                yield entry
        settle = SETTLE_FIRST
        reread_at = time.monotonic() + settle
        while True:
            now = time.monotonic()
            if self.overflowed or now >= reread_at:
                self.overflowed = False
                if settle and settle <= SETTLE_LAST:
                    settle *= 2
                    reread_at = now + settle
                else:
                    settle = 0.0
                    reread_at = now + REREAD_EVERY
                async for view in self.fresh():
                    yield view
                if self.order.last_seq <= 0 and (
                    await self.deadline.bound(presence(self.broker, self.names, self.run_id))
                    == "missing"
                ):
                    # Pending (or nothing seen yet), and now nothing is known at all: the start
                    # was refused (the projector deletes a refused start's pending view).
                    raise RunNotFound(
                        f"no run with id '{self.run_id}': its start was refused (see the dead "
                        "letters)",
                        run_id=self.run_id,
                    )
                continue
            left = self.deadline.remaining()
            if left is not None and left <= 0:
                raise self.deadline.expired()
            wait = reread_at - now if left is None else min(left, reread_at - now)
            try:
                hint = await asyncio.wait_for(self.live.get(), wait)
            except TimeoutError:
                continue
            # A live view is a hint: views are passed on from the stream, in its order. A
            # live message can arrive before the stream shows it, and before an earlier view
            # the stream does not show yet either (a batch is stored only when committed):
            # passed on live, it would make that earlier view look old, and it would be lost.
            pause = _HINTED_FIRST
            while not self.order.passed(hint):
                async for view in self.fresh():
                    yield view
                if self.order.passed(hint) or pause > _HINTED_LAST:
                    break  # not stored (yet): the regular re-read picks it up
                await asyncio.sleep(pause)
                pause *= 2

    async def kv_view(self) -> RunView | None:
        """The run's entry in the runs bucket, if it holds a valid view of this run."""
        view = await self.deadline.bound(read_view(self.broker, self.names, self.run_id))
        return (
            view
            if view is not None and self.subject == self.names.change(view.agent, self.run_id)
            else None
        )


async def watch_run(
    broker: Broker, names: Names, run_id: str, *, timeout: float | None = None
) -> AsyncGenerator[RunView, None]:
    """Yield ``run_id``'s views in order until the first terminal one (status ``completed``,
    ``failed`` or ``cancelled``), which is yielded last.

    First the views stored in the changes stream (kept ``Settings.changes_max_age``); if none
    are left, the run's entry in the runs bucket; then each new view as the projector
    publishes it. No view is yielded twice or out of order (``ViewOrder``). A pending run is
    watched until it runs and ends. A run with a history but no view yet (no projector
    running) yields nothing until a projector writes one.

    Use it with ``contextlib.aclosing`` (or run it to its end) so its subscription is closed
    as soon as the reader stops.

    Raises:
        RunNotFound: nothing is known of the run: no view, no stored change, no history and no
            stored start.
        TimeoutError: the run did not end within ``timeout`` seconds.
        InvalidName: ``run_id`` is not a valid run id.
    """
    validate_token(run_id, "run_id")
    deadline = _Deadline(run_id, timeout)
    agent = await deadline.bound(agent_of(broker, names, run_id))
    if agent is None:
        raise RunNotFound(f"no run with id '{run_id}'", run_id=run_id)
    w = _ViewWatch(broker, names, run_id, agent, deadline)
    sub = await broker.subscribe(w.subject, cb=w.on_change)
    try:
        await deadline.bound(broker.flush())  # the server has our SUB before we read
        async with contextlib.aclosing(w.views()) as views:
            async for view in views:
                yield view
                if is_terminal(view.status):
                    return
    finally:
        await sub.unsubscribe()


async def follow_history(
    broker: Broker, names: Names, run_id: str, *, after_seq: int = 0
) -> AsyncGenerator[Decision, None]:
    """Yield ``run_id``'s stored decisions after ``after_seq`` in order, then each new one as
    it is appended, until (and including) the decision that ends the run; a run that
    continued as new is followed on into its chain's next runs (their decisions from the
    first), until the chain's last run ends.

    Reads the events stream only, so it needs no projector. A run whose start is stored and
    not yet taken is waited for.

    Raises:
        RunNotFound: the run has no history and no stored start, or its stored start was
            taken without a history being written (the intake refused it: see the dead
            letters).
        HistoryError: a stored event cannot be decoded.
    """
    validate_token(run_id, "run_id")
    store = EventStore(broker, names, Settings(prefix=names.prefix))
    while True:
        nxt: str | None = None
        async for d in _follow_one(broker, names, store, run_id, after_seq):
            yield d
            nxt = continued_as(d.events)
        if nxt is None:
            return
        # The run continued as new: follow its chain's next run from its start.
        run_id, after_seq = validate_token(nxt, "run_id"), 0


async def _follow_one(
    broker: Broker, names: Names, store: EventStore, run_id: str, after_seq: int
) -> AsyncGenerator[Decision, None]:
    """``follow_history`` for one run of a chain."""
    changed = asyncio.Event()

    async def on_event(_msg: Delivery) -> None:
        changed.set()  # only a hint: what was stored is read back

    sub = await broker.subscribe(names.events(run_id), cb=on_event)
    try:
        await broker.flush()
        seq = after_seq
        seen_start = False
        hinted = 1  # the first read may miss what was published just before the subscription
        while True:
            decisions = await store.load(run_id, after_seq=seq)
            for d in decisions:
                seq = d.seq
                yield d
                if any(isinstance(e, TERMINAL_EVENTS) for e in d.events):
                    return
            if seq == 0 and not decisions:
                state = await presence(broker, names, run_id)
                if state == "missing":
                    why = (
                        ": its start was taken but no history was written (the intake "
                        "refused it: see the dead letters)"
                        if seen_start
                        else ""
                    )
                    raise RunNotFound(f"no run with id '{run_id}'{why}", run_id=run_id)
                seen_start = seen_start or state == "pending"
            wait = REREAD_EVERY
            if hinted:
                # The live message can overtake the stored copy's visibility to a direct get
                # by a moment: look again shortly rather than in REREAD_EVERY.
                wait = min(wait, 0.005 * 2**hinted)
                hinted = hinted + 1 if hinted < 7 else 0
            try:
                await asyncio.wait_for(changed.wait(), wait)
            except TimeoutError:
                pass
            if changed.is_set():
                changed.clear()
                hinted = 1
    finally:
        await sub.unsubscribe()
