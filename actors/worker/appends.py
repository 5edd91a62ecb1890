"""One activation's appends to its run's history: serialized, fenced, batched, never lost.

The rules (the module doc of ``worker/activation.py`` says why):

- Appends are serialized and fenced (``expected_seq`` = the last sequence this activation saw).
- Events the machine records wait in ``pending`` for the next decision; if none follows within
  ``flush_delay``, they are flushed alone.
- On ``ConcurrencyConflict`` what was appended since is read: events other parties append
  (``EXTERNAL_EVENTS``) commute with ours and are folded in, and the decision is appended again
  on top; anything else means another worker owns the run (``Fenced``), and nothing more is
  written.
- A broker outage keeps the events buffered (``BrokerLost``); a decision whose ack was lost is
  sent again first, unchanged, so the store can tell whether it landed. Any other failure is
  kept (``refused``) and raised again by every later append (``AppendRefused``).
- A decision larger than the server takes is split into several messages, in order
  (``fit_prefix``).
- A run this worker's intake opened in memory (``worker/opening.py``) is stored by the first
  append: its ``RunStarted`` and the first decision as one message, create-only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from sojourn.broker.connection import JetStreamError
from sojourn.broker.eventstore import Decision, EventStore
from sojourn.schemas.codec import encode_events
from sojourn.schemas.errors import (
    BrokerUnavailable,
    ConcurrencyConflict,
    Fenced,
    PayloadTooLarge,
)
from sojourn.schemas.events import (
    BudgetChanged,
    CancelRequested,
    PauseLifted,
    PauseRequested,
    RunEvent,
    SignalReceived,
    StepStarted,
    UpdateRequested,
)

from ..core.actions import RunCancelledInterrupt
from ..core.machine import Machine
from ..core.state import _OP_EVENTS, fold
from ..history.values import Values, values_for
from ..ops.metrics import APPENDS, EVENTS_APPENDED
from .faults import fault
from .opening import Opening

__all__ = [
    "EXTERNAL_EVENTS",
    "KEPT_HISTORY_MAX",
    "AppendRefused",
    "Appender",
    "BrokerLost",
    "broker_io",
    "fit_prefix",
    "is_outage",
]

EXTERNAL_EVENTS = (
    CancelRequested,
    SignalReceived,
    BudgetChanged,
    PauseRequested,
    PauseLifted,
    UpdateRequested,
)
"""Events other parties append to a run without owning it; they commute with our decisions."""

T = TypeVar("T")

KEPT_HISTORY_MAX = 16
"""Decisions of a run's history kept with its in-process timer, at most (longer ones are in
the worker's history cache, which reads only what came after)."""


class BrokerLost(BaseException):
    """Unwinds agent code when an append could not reach the broker in time.

    A ``BaseException`` so that an agent's ``except Exception`` cannot turn a broker outage
    into a recorded failure of the run.
    """


class AppendRefused(BaseException):
    """Unwinds agent code when a decision could not be stored for a reason other than a broker
    outage (a JetStream error, a decision the server would refuse).

    The activation keeps the original error (``Appender.refused``): every later journaled
    call and the end of the activation raise this again, and ``Activation.run`` ends with the
    original error, so the worker retries the run later from its last recorded event (and
    gives up after ``max_activation_failures``). A ``BaseException`` so that agent code cannot
    go on to record an outcome the history does not support.
    """


def is_outage(e: BaseException) -> bool:
    """Whether an append failed because the broker is away (keep the events, try later)."""
    if isinstance(e, BrokerUnavailable):
        return True
    return isinstance(e, JetStreamError) and e.code == 503


def fit_prefix(sizes: list[int], limit: int) -> int:
    """How many of the leading events fit in one message of at most ``limit`` bytes, given each
    event's encoded size (a decision is the JSON array ``[e1,e2,...]``); 0 if not even one."""
    used = 1  # "["
    for n, size in enumerate(sizes):
        used += size + 1  # the event, then "," or "]"
        if used > limit:
            return n
    return len(sizes)


async def broker_io(op: Awaitable[T]) -> T:
    """Broker I/O done on behalf of agent code: an outage unwinds it as ``BrokerLost``."""
    try:
        return await op
    except (BrokerUnavailable, JetStreamError) as e:
        raise BrokerLost() from e


class Appender:
    """Appends one activation's decisions to its run's history, as ``writer``.

    ``machine`` gives the activation's run machine: its ``pending`` events are what the next
    append takes, and its ``state`` takes what others appended meanwhile.
    """

    def __init__(
        self,
        *,
        run_id: str,
        store: EventStore,
        writer: str,
        history: list[Decision],
        keep_history: bool,
        flush_delay: float,
        metric_agent: str,
        machine: Callable[[], Machine],
        opening: Opening | None = None,
    ) -> None:
        """``keep_history``: keep ``decisions`` while the history is short. ``opening``: the
        run is not stored yet; the first append stores it (``history`` is its ``RunStarted``,
        held in memory)."""
        self.run_id = run_id
        self.store = store
        self.writer = writer
        self.flush_delay = flush_delay
        self._machine = machine
        self._appends_metric = APPENDS.labels(metric_agent)
        self._events_metric = EVENTS_APPENDED.labels(metric_agent)
        self.last_seq = history[-1].seq if history else 0
        self.decisions: list[Decision] | None = (
            list(history) if keep_history and len(history) <= KEPT_HISTORY_MAX else None
        )
        """The run's history as this activation knows it (what it loaded, what it and others
        appended since), while short: handed to the in-process timer of a wait it parks on."""
        self.fenced = False
        self.appends = 0
        self._lock = asyncio.Lock()
        self._flush_handle: asyncio.TimerHandle | None = None
        """The flush timer: armed at most once, and left armed when a decision takes the
        events (it looks at ``_flush_at`` when it fires), so a step costs no timer of its own."""
        self._flush_at: float | None = None
        """Loop time by which the events queued since the last append are to be flushed (none:
        nothing queued since)."""
        self.refused: Exception | None = None
        """Why an append failed for good, once one did (see ``AppendRefused``)."""
        self._unacked: list[RunEvent] = []
        """A decision whose append may have landed (its ack was lost in an outage): the next
        decision sends it first, unchanged, so the store can tell whether it landed."""
        self._opening = opening
        self.on_stored: Callable[[Sequence[RunEvent]], None] | None = None
        """Told of every batch of events this activation stored (its ``RunTrace``)."""

    @property
    def stored(self) -> bool:
        """Whether the run is stored (not opened in memory, waiting for its first append)."""
        return self._opening is None

    @property
    def values(self) -> Values:
        """Large values by reference (the worker's piece store and cache)."""
        store = self.store
        return values_for(store.broker, store.names, store.settings)

    @property
    def quiet(self) -> bool:
        """Whether nothing is pending, in flight or unacknowledged, and every append so far was
        stored (neither fenced nor refused)."""
        return not (
            self.fenced
            or self.refused is not None
            or self._machine().pending
            or self._unacked
            or self._lock.locked()
        )

    def arm_flush(self) -> None:
        """Events were queued: make sure they are flushed within ``flush_delay`` if no decision
        follows."""
        if self._flush_at is None:
            loop = asyncio.get_running_loop()
            self._flush_at = due = loop.time() + self.flush_delay
            if self._flush_handle is None:
                self._flush_handle = loop.call_at(due, self._flush_soon)

    def _flush_soon(self) -> None:
        self._flush_handle = None
        due = self._flush_at
        if due is None or not self._machine().pending or self.fenced or self.refused is not None:
            return
        loop = asyncio.get_running_loop()
        if loop.time() < due:  # these events were queued after the timer was armed
            self._flush_handle = loop.call_at(due, self._flush_soon)
            return
        if self._lock.locked():
            # An append is in flight and did not take these events: look again shortly.
            self._flush_handle = loop.call_later(self.flush_delay, self._flush_soon)
            return
        task = asyncio.get_running_loop().create_task(self.flush_quietly())
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def flush_quietly(self) -> None:
        """The flush timer's append. Nothing it meets is dropped: an outage keeps the events
        buffered for the next decision, and any other failure is kept in ``refused`` for the
        agent's next journaled call (or the end of the activation) to raise."""
        try:
            await self.commit([])
        except (Fenced, RunCancelledInterrupt, BrokerLost, AppendRefused):
            pass
        except Exception as e:  # pragma: no cover - commit turns failures into AppendRefused
            if self.refused is None:
                self.refused = e

    def check_live(self) -> None:
        """Called before every journaled operation: stop if nothing more may be written."""
        if self.fenced:
            raise Fenced(self.run_id)
        if self.refused is not None:
            raise AppendRefused()

    async def commit(self, events: list[RunEvent]) -> None:
        """Append the buffered events plus ``events`` as one decision, fenced.

        Buffered events are taken when the append starts; events buffered while it is in flight
        wait for the next decision (or the flush timer). A decision larger than the server
        accepts is appended as several messages, in order; a single event that does not fit is
        refused (it cannot happen with values within ``max_value``).

        Raises:
            Fenced: another worker owns the run.
            RunCancelledInterrupt: a cancel came in while this decision was starting a step.
            BrokerLost: the broker stayed away; the events not stored stay buffered.
            AppendRefused: this or an earlier append failed for another reason.
        """
        async with self._lock:
            if self.refused is not None:
                raise AppendRefused()
            if self.fenced:
                raise Fenced(self.run_id)
            m = self._machine()
            taken, m.pending = m.pending, []
            self._flush_at = None  # the timer, if armed, finds nothing to flush
            unacked, self._unacked = self._unacked, []
            batch = [*unacked, *taken, *events]
            if self._opening is not None and await self._open(batch) == len(batch):
                return  # stored with the run's RunStarted
            if not batch:
                return
            ours = len(batch) - len(events)  # batch[ours:] are ``events``
            starts = any(isinstance(e, StepStarted) for e in events)
            fixed = len(unacked)  # the first message must be exactly ``unacked``
            done = 0  # batch[:done] is stored
            stop = 0  # batch[done:stop] is the message being appended
            cap: int | None = None  # at most this many events in the next message
            interrupted = False
            if starts and m.cancel_due():
                # A cancel is known already (a notice, a look): start nothing new.
                batch, interrupted = batch[:ours], True
            try:
                while done < len(batch):
                    if fixed:
                        stop = done + fixed
                    else:
                        stop = len(batch) if cap is None else done + cap
                    chunk = batch[done:stop]
                    try:
                        seq = await self._append(chunk)
                    except PayloadTooLarge:
                        if fixed or len(chunk) == 1:
                            raise
                        sizes = [len(encode_events([e])) - 2 for e in batch[done:]]
                        cap = fit_prefix(sizes, self.store.max_decision)
                        if cap == 0:
                            raise
                        continue
                    except ConcurrencyConflict:
                        await self._rebase()
                        if starts and done <= ours < len(batch) and m.cancel_due():
                            # Cancelled while we were about to start a step: record what
                            # already happened, but start nothing new.
                            batch, interrupted = batch[:ours], True
                        continue
                    self._stored(chunk, seq)
                    done, fixed, cap = stop, 0, None
            except BrokerLost:
                # Keep what was not stored for the next decision. The message in flight may
                # have landed: it is sent first next time, unchanged (same fence, same
                # Msg-Id), so the store's landed check can tell.
                self._unacked = batch[done:stop]
                m.pending[:0] = batch[max(stop, done) : max(ours, stop, done)]
                raise
            except (Fenced, RunCancelledInterrupt):
                raise
            except Exception as e:
                self.refused = e
                raise AppendRefused() from e
            if interrupted:
                for dropped in events:
                    if isinstance(dropped, StepStarted):
                        m.start_dropped(dropped)
                raise RunCancelledInterrupt()

    async def _open(self, batch: list[RunEvent]) -> int:
        """Store the opened run's ``RunStarted``: with ``batch`` as one message when no cancel
        waits behind the start and it fits, else alone (then the cancel). Returns how many of
        ``batch`` were stored with it (all or none), and settles the opening.

        Raises:
            Fenced: the run was not created by this append (it existed, or an earlier delivery
                of the trigger created it): this activation stops, and the intake answers.
        """
        opening = self._opening
        assert opening is not None and not self._unacked
        self._opening = None
        fault("opening")
        try:
            queued = None if opening.look is None else await opening.look
            first: list[RunEvent] = [opening.started]
            if queued is None and batch:
                first += await self.values.externalize(batch)
                if len(encode_events(first)) > self.store.max_decision:
                    first = [opening.started]
            opening.sent.set()  # its publish is queued before this task next waits
            seq, earlier = await self.store.append_once(
                self.run_id, first, expected_seq=0, writer=self.writer, msg_id=opening.msg_id
            )
        except ConcurrencyConflict:
            opening.settle("exists")
            self.fenced = True
            raise Fenced(self.run_id) from None
        except BaseException as e:  # the intake hands the trigger back: nothing is stored
            opening.fail(e)
            self.fenced = True
            raise Fenced(self.run_id) from e
        if earlier:
            opening.settle("earlier")
            self.fenced = True
            raise Fenced(self.run_id)
        merged = batch if len(first) > 1 else []  # as recorded, not by reference
        if self.decisions is not None:  # in place: an in-process timer may hold the list
            stored = (opening.started, *merged)
            self.decisions[:] = [Decision(seq, stored, self.writer, opening.msg_id)]
        self.last_seq = seq
        self.appends += 1
        self._appends_metric.inc()
        self._events_metric.inc(len(first))
        others = [e for e in merged if not isinstance(e, _OP_EVENTS)]
        if others:
            m = self._machine()
            m.state = fold(others, m.state)
        opening.settle("stored")
        if self.on_stored is not None:
            self.on_stored((opening.started, *merged))
        fault("opened")
        if queued is not None:
            cancel_seq, cancel = queued
            try:
                seq = await self.store.append(
                    self.run_id,
                    [cancel],
                    expected_seq=seq,
                    writer=self.writer,
                    msg_id=f"{self.run_id}:cancel:{cancel_seq}",  # what its delivery would write
                )
            except ConcurrencyConflict:
                return 0  # something came in meanwhile: the cancel is recorded when delivered
            self._stored([cancel], seq)
        return len(merged)

    def _stored(self, batch: list[RunEvent], seq: int) -> None:
        self.appends += 1
        if self.decisions is not None:
            mid = f"{self.run_id}:{self.last_seq}:{self.writer}"
            self.decisions.append(Decision(seq, tuple(batch), self.writer, mid))
            if len(self.decisions) > KEPT_HISTORY_MAX:
                self.decisions = None
        self.last_seq = seq
        self._appends_metric.inc()
        self._events_metric.inc(len(batch))
        if self.on_stored is not None:
            self.on_stored(batch)
        # Live operations need no folding (the journal only consults what was recorded
        # before this activation); folding them would copy the op index on every step.
        others = [e for e in batch if not isinstance(e, _OP_EVENTS)]
        if others:
            m = self._machine()
            m.state = fold(others, m.state)

    async def _append(self, batch: list[RunEvent]) -> int:
        try:
            batch = await self.values.externalize(batch)  # large values by reference
            return await self.store.append(
                self.run_id, batch, expected_seq=self.last_seq, writer=self.writer
            )
        except (BrokerUnavailable, JetStreamError) as e:
            if is_outage(e):
                raise BrokerLost() from e
            raise

    async def _rebase(self) -> None:
        newer = await broker_io(self.store.load(self.run_id, after_seq=self.last_seq))
        foreign = [e for d in newer for e in d.events if not isinstance(e, EXTERNAL_EVENTS)]
        if foreign or not newer:
            self.fenced = True
            raise Fenced(self.run_id)
        self.take(newer)

    async def catch_up(self) -> None:
        """Fold in what others appended since this activation's last decision (a cancel, a
        signal). A decision of another writer is left to the fence: this activation's next
        append is refused, as it would have been without the look."""
        async with self._lock:
            if self.fenced:
                return
            newer = await self.store.load(self.run_id, after_seq=self.last_seq)
            if not newer:
                return
            if any(not isinstance(e, EXTERNAL_EVENTS) for d in newer for e in d.events):
                return
            self.take(newer)

    def take(self, newer: list[Decision]) -> None:
        """Fold in ``newer`` (what was appended after ``last_seq``; not empty) and move on
        past it."""
        m = self._machine()
        m.state = fold((e for d in newer for e in d.events), m.state)
        self.last_seq = newer[-1].seq
        if self.decisions is not None:
            self.decisions.extend(newer)

    def disarm(self) -> None:
        """Cancel the flush timer (the activation ends)."""
        self._flush_at = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None

    def refusal(self) -> Exception:
        """The error an activation ends with when an append was refused."""
        e = self.refused
        assert e is not None
        return e
