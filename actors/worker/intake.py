"""The intake: turns inbound messages (starts, cancels, signals, control) into run events, or
rejects them.

Every inbound message ends in exactly one of two places: an event in a run's history (plus a
wake), or a dead-letter record on ``<prefix>.dlq.<kind>`` with the reason and the original
bytes. It is acknowledged only after that write, so a crash in between redelivers it, and the
writes are idempotent (deterministic Msg-Ids, sequence fences), so a redelivery lands once.

Everything in a message is data, never an address: the subject is parsed and every token
validated (``Names.parse_inbox``) before it names anything, ids in bodies are validated the
same way, and a ``Sojourn-Reply-To`` header is answered only when it is a request/reply inbox
(``_INBOX.<tokens>``), which can never name a sojourn subject. Who sent a message is the
``as.<sender>`` token of its subject (the broker lets an authenticated user publish only on
its own), never a header or a field the sender chose.

``Intake`` takes each message to its handler: starts to ``worker/starts.py``, schedule requests
to the ``Scheduler``, and those about an existing run (signals, resumes, budget changes,
decisions, child notices, cancels) it records itself, with the events ``worker/control.py``
makes of them. What it refuses, ``worker/refusals.py`` screens, dead-letters and answers.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import msgspec

from sojourn.broker import headers as h
from sojourn.broker.archive import ArchiveStore
from sojourn.broker.connection import Broker, header
from sojourn.broker.delivery import Delivery
from sojourn.broker.eventstore import Decision, EventStore
from sojourn.broker.names import InboxSubject, Names
from sojourn.broker.registry import AgentRegistry
from sojourn.broker.wake import publish_wake
from sojourn.schemas.codec import decode_events, encode
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import ConcurrencyConflict, HistoryError
from sojourn.schemas.events import CancelRequested, RunEvent, RunStarted
from sojourn.schemas.fairness import Fairness, classify
from sojourn.schemas.flow import DEBOUNCED_RUN_ID
from sojourn.schemas.lifecycle import TERMINAL_EVENTS
from sojourn.schemas.limits import Limit
from sojourn.schemas.priority import PRIORITY_DEFAULT, Priority
from sojourn.schemas.wire import IntakeOk

from ..agents.agent import Agent
from ..history.chain import continued_as, current_run
from ..history.pending import find_pending
from ..history.snapshots import current as current_snapshot
from .clock import Clock
from .control import cancel_body, cancel_requested, events_for, signal_id
from .faults import fault
from .holds import AgentHolds
from .interrupt import publish_interrupt
from .limits import SharedLimits
from .opening import Opening
from .refusals import Refusals, Rejected, Screened, dlq_kind, reply
from .starts import Created, Starts, dismiss, handback_delay
from .updates import known_update, update_body, update_requested

__all__ = ["Intake", "OnCreated", "ScheduleRequests"]

UNKNOWN_RUN_RETRIES = 5
"""Deliveries of a cancel for a run that does not exist yet before it is dead-lettered."""

OnCreated = Callable[[str, list[Decision], Delivery, Opening | None], Awaitable[bool]]
"""Called with a freshly created run (or one opened in memory, with its ``Opening``): return
True to run it at once (then the callee settles the inbox message), False to have the intake
wake it through the wake stream (an opened run is stored first)."""


class ScheduleRequests(Protocol):
    """What handles ``<prefix>.as.<sender>.schedule.<name>`` messages
    (``actors/worker/scheduler.py``): it answers and settles each, or raises ``Rejected``."""

    async def handle_request(self, msg: Delivery, inbox: InboxSubject) -> None: ...


class Intake:
    """Processes inbox messages for the agents one worker serves."""

    def __init__(
        self,
        *,
        broker: Broker,
        store: EventStore,
        names: Names,
        settings: Settings,
        registry: AgentRegistry,
        agents: Mapping[str, Agent[object, object]],
        writer: str,
        on_created: OnCreated | None = None,
        opens: Callable[[str], bool] | None = None,
        clock: Clock | None = None,
        limits: Mapping[str, Limit] | None = None,
        served_elsewhere: Callable[[str], bool] | None = None,
    ) -> None:
        """``opens``: whether the worker would execute a run created now at once (then it is
        opened in memory and stored with its first decision: ``worker/opening.py``).
        ``clock``: the runs' clock, which stamps what is recorded (``worker/clock.py``).
        ``limits``: the shared rate limits the worker declares, besides its agents'.
        ``served_elsewhere``: whether another live worker serves an agent (its heartbeats say).

        Raises:
            ValueError: two declarations of one limit differ."""
        self.clock = clock or Clock()
        self.broker = broker
        self.store = store
        self.names = names
        self.settings = settings
        self.writer = writer
        self.on_created = on_created
        self.schedules: ScheduleRequests | None = None
        """Set by the worker: the handler of schedule requests."""
        self.refusals = Refusals(broker, names, settings)
        """Screens messages and refuses those not acted on."""
        self.starts = Starts(
            store,
            registry,
            agents,
            writer,
            opens=opens,
            clock=self.clock,
            served_elsewhere=served_elsewhere,
        )
        """Creates the runs starts, spawns and schedule fires ask for."""
        self.holds = AgentHolds(broker, names, store, writer, self.clock)
        """The agents' holds, and the requests that change them (``worker/holds.py``)."""
        declared = dict(limits or {})
        for a in agents.values():
            for name, limit in a.limits.items():
                if declared.setdefault(name, limit) != limit:
                    raise ValueError(f"limit {name!r} is declared twice, with different rates")
        self.limits = SharedLimits(broker, names, writer, self.clock, declared)
        """The shared rate limits (``worker/limits.py``), and the requests that change them."""

    async def start(self) -> None:
        """Follow the agents' holds and the shared limits (declaring this worker's)."""
        await self.holds.start()
        await self.limits.start()

    async def stop(self) -> None:
        await self.holds.stop()
        await self.limits.stop()

    def kill(self) -> None:
        """Stop following at once, as the death of the process would (``Worker.kill``)."""
        self.holds.kill()
        self.limits.kill()

    async def _route_of(self, run_id: str) -> tuple[str | None, Priority, Fairness | None]:
        """The agent and priority of an existing run, from its first stored message (for
        routing a wake: its agent's consumer, its priority's lane)."""
        first = await self.broker.direct_get_next(
            self.names.events_stream, self.names.events(run_id), 1
        )
        if first is None:
            return None, PRIORITY_DEFAULT, None
        try:
            events = decode_events(first.data)
        except msgspec.DecodeError:  # a poison history: the worker that wakes it reports it
            return None, PRIORITY_DEFAULT, None
        if not events or not isinstance(events[0], RunStarted):
            return None, PRIORITY_DEFAULT, None
        return events[0].agent, events[0].priority, events[0].fairness

    async def handle(
        self,
        msg: Delivery,
        screened: Screened | None = None,
        progress: asyncio.Event | None = None,
    ) -> None:
        """Process one inbox message and settle it (ack, or nak to retry later).
        ``screened``: what ``Refusals.screen`` said of it, when the caller asked already.
        ``progress`` (a start's): set once the run it opens has its first append handed to
        the broker (``Opening.sent``); the caller sets it anyway when this returns."""
        screened = screened or self.refusals.screen(msg)
        if screened.rejected is not None:
            await self.refusals.refuse(msg, screened)
            return
        inbox = screened.inbox
        assert inbox is not None
        kind = inbox.kind
        reply_ok = screened.answerable
        try:
            if inbox.kind in ("start", "spawn"):
                started = await self.starts.start(msg, inbox)
                if isinstance(started, Opening):
                    if progress is not None:
                        started.sent = progress  # read by its activation's first append
                    started = await self._open(started, msg)
                if started is None:
                    return
                answer, created, wake = started
                await reply(self.broker, msg, encode(answer))
                if (
                    created is not None
                    and self.on_created is not None
                    and await self.on_created(answer.run_id, created, msg, None)
                ):
                    return  # the worker runs it now and settles msg when the run rests
                if wake:
                    await publish_wake(
                        self.broker,
                        self.names,
                        answer.run_id,
                        "start",
                        agent=inbox.target,
                        priority=inbox.priority,
                        fairness=classify(msg.headers),
                    )
                await msg.ack()
                return
            if inbox.kind == "schedule":
                if self.schedules is None:
                    raise Rejected("internal", "this process does not handle schedules")
                await self.schedules.handle_request(msg, inbox)
                return
            if inbox.kind == "hold":
                await self.holds.handle_request(msg, inbox)
                return
            if inbox.kind == "limit":
                await self.limits.handle_request(msg, inbox)
                return
            if inbox.kind == "cancel":
                handled = await self._cancel(msg, inbox)
            else:
                handled = await self._record(msg, inbox)
            if handled is None:
                return
            await reply(self.broker, msg, encode(handled))
            await msg.ack()
        except Rejected as r:
            await self.refusals.reject(msg, dlq_kind(kind), r.code, r.message, reply_ok)
        except HistoryError as e:  # the run's history cannot be read: retrying cannot help
            await self.refusals.reject(msg, dlq_kind(kind), "internal", e.message)

    async def _open(self, opening: Opening, msg: Delivery) -> Created | None:
        """Have the worker execute a run opened in memory, and answer once its first append
        stored it (``worker/opening.py``); ``None`` when the worker settles ``msg`` itself
        (the run executes, or its activation ended before storing anything). When the run
        existed already, what a start of an existing run gets."""
        run_id = opening.run_id
        if self.on_created is None or not await self.on_created(
            run_id, opening.history(), msg, opening
        ):
            return await self.starts.store_opening(opening)
        try:
            how = await opening.settled
        finally:
            await dismiss(opening.look)
        if how == "stored":
            await reply(self.broker, msg, encode(IntakeOk(run_id=run_id, created=True)))
            return None
        if how == "earlier":  # this trigger created it before: the run may not rest yet
            return IntakeOk(run_id=run_id, created=True), None, True
        if how == "exists":
            return await self.starts.existing(opening.started)
        return None  # abandoned: the activation settled msg; its redelivery creates the run

    # --- signals, resumes, decisions, child notices ------------------------------------------

    async def _record(self, msg: Delivery, inbox: InboxSubject) -> IntakeOk | None:
        """Append a signal (once per signal id, ever), a resume or a decision, and wake the
        run. A message already recorded (a redelivery after a crash) wakes the run again:
        the crash may have come before the wake."""
        run_id = inbox.target
        inbox_seq = msg.stream_seq
        update = update_body(msg.data) if inbox.kind == "update" else None  # checked first
        for _ in range(20):
            # The history folded from the store's snapshot of it: only what came after the
            # snapshot is read and looked at (``history/snapshots.py``).
            snap = await current_snapshot(self.store, run_id)
            if snap is None:
                if inbox.kind == "child":
                    return IntakeOk(run_id=run_id, created=False)  # no such parent: drop
                await self._not_yet(msg, run_id)
                return None
            msg_id = f"{run_id}:signal:{inbox_seq}"
            if msg_id in snap.intake_ids:
                break  # recorded by an earlier delivery of this very message
            state = snap.state
            if inbox.kind in ("signal", "child"):
                sid = signal_id(msg, inbox)
                if sid in snap.signal_ids:
                    break  # delivered before under this id: count once, wake again
            if update is not None and known_update(state, update.update_id) is not None:
                if state.terminal:  # decided (or never) before the end: the history says
                    return IntakeOk(run_id=run_id, created=False)
                break  # received before under this id: once per id, wake again
            if state.terminal:
                if inbox.kind == "child":
                    return IntakeOk(run_id=run_id, created=False)  # parent already over
                if state.continued_as is not None:
                    # "The conversation" goes on in a later run of its chain: record it there.
                    run_id, _ = await current_run(self.broker, self.names, state.continued_as)
                    continue
                raise Rejected("run_ended", f"run '{run_id}' has ended ({state.status})")
            authenticated = self.broker.user is not None
            events: list[RunEvent] = (
                [
                    update_requested(
                        update,
                        inbox,
                        state,
                        settings=self.settings,
                        authenticated=authenticated,
                        now=self.clock.now(),
                    )
                ]
                if update is not None
                else events_for(
                    msg,
                    inbox,
                    state,
                    settings=self.settings,
                    authenticated=authenticated,
                    now=self.clock.now(),
                )
            )
            if not events:
                return IntakeOk(run_id=run_id, created=False)
            if await self._appended(run_id, events, snap.seq, msg_id):
                break
        else:
            await msg.nak(delay=0.2)
            return None
        fault("intake_recorded")
        agent = snap.state.agent or None
        await publish_wake(
            self.broker,
            self.names,
            run_id,
            "signal",
            agent=agent,
            priority=snap.state.priority,
            fairness=snap.state.fairness,
        )
        return IntakeOk(run_id=run_id, created=False)

    # --- cancel ------------------------------------------------------------------------------

    async def _cancel(self, msg: Delivery, inbox: InboxSubject) -> IntakeOk | None:
        run_id = inbox.target
        body = cancel_body(msg.data)
        inbox_seq = msg.stream_seq
        for _ in range(20):
            msg_id = f"{run_id}:cancel:{inbox_seq}"
            last = await self.broker.direct_get_last(
                self.names.events_stream, self.names.events(run_id)
            )
            if last is None:
                await self._not_yet(msg, run_id)
                return None
            if header(last, h.MSG_ID) == msg_id:
                break  # recorded by an earlier delivery: wake again
            last_events = decode_events(last.data)
            nxt = continued_as(last_events)
            if nxt is not None:  # cancel the conversation: its chain's current run
                run_id, _ = await current_run(self.broker, self.names, nxt)
                continue
            if any(isinstance(e, TERMINAL_EVENTS) for e in last_events):
                return IntakeOk(run_id=run_id, created=False)  # already over: nothing to do
            if await self._cancelled_at_start(run_id, last_events):
                break  # recorded with the start (it was pending): nothing more, wake again
            cancel: list[RunEvent] = [cancel_requested(body, inbox.sender, self.clock.now())]
            if await self._appended(run_id, cancel, int(header(last, h.SEQUENCE)), msg_id):
                break
        else:
            await msg.nak(delay=0.5)
            return None
        fault("intake_recorded")
        # The worker executing the run (if any) interrupts its running step at once; the wake
        # brings a run that rests.
        await publish_interrupt(self.broker, self.names, run_id)
        agent, priority, fairness = await self._route_of(run_id)
        await publish_wake(
            self.broker,
            self.names,
            run_id,
            "cancel",
            agent=agent,
            priority=priority,
            fairness=fairness,
        )
        return IntakeOk(run_id=run_id, created=False)

    async def _cancelled_at_start(self, run_id: str, last: list[RunEvent]) -> bool:
        """Whether the run was asked to cancel at its start: a cancel sent while it was pending,
        recorded in the decision right after a ``RunStarted`` stored alone (``Starts`` looks
        for it; older versions recorded it in the same one). Any cancel delivered since adds
        nothing: the run never runs a step."""
        if any(isinstance(e, RunStarted) for e in last):
            return any(isinstance(e, CancelRequested) for e in last)
        first = await self.store.first(run_id)
        if first is None:
            return False
        if any(isinstance(e, CancelRequested) for e in first.events):
            return True
        if len(first.events) > 1:  # stored with its first decision: no cancel came before it
            return False
        second = await self.broker.direct_get_next(
            self.names.events_stream, self.names.events(run_id), first.seq + 1
        )
        return second is not None and any(
            isinstance(e, CancelRequested) for e in decode_events(second.data)
        )

    async def _appended(
        self, run_id: str, events: list[RunEvent], expected_seq: int, msg_id: str
    ) -> bool:
        """Append ``events`` to the run, fenced at ``expected_seq``, under ``msg_id``;
        ``False`` when the run moved on meanwhile (look again)."""
        try:
            await self.store.append(
                run_id, events, expected_seq=expected_seq, writer=self.writer, msg_id=msg_id
            )
        except ConcurrencyConflict:
            return False
        return True

    # --- runs that do not exist (yet) --------------------------------------------------------

    async def _not_yet(self, msg: Delivery, run_id: str) -> None:
        """A signal, cancel, resume or decision for a run with no history: hand it back while
        its start may still come, else refuse it ``unknown_run``.

        Its start may be on its way (the first ``UNKNOWN_RUN_RETRIES`` deliveries, a second
        apart), or stored in the inbox and not yet taken. A start of an agent this worker or
        another live one serves is taken soon (it waits for an ack wait or a hand-back at
        most): its run's messages come back a second or two apart, so that they apply within a
        second or two of the run's creation, however often they were delivered before (a
        worker that died with them counts too). Otherwise the run is pending (no live worker of
        its agent is up): its messages are handed back with pauses growing like a start's for
        an agent no live worker serves, bounded by ``Settings.max_deliveries``; when a worker
        creates the run they apply in order.

        Raises:
            Rejected: ``unknown_run``.
        """
        n = msg.num_delivered
        if n < UNKNOWN_RUN_RETRIES:
            await msg.nak(delay=1.0)
            return
        pending = await find_pending(
            self.broker, self.names, run_id, max_payload=self.settings.max_payload
        )
        if pending is not None and self.starts.soon_served(pending.agent):
            await msg.nak(delay=1.0 + random.random())
            return
        if pending is not None or (
            DEBOUNCED_RUN_ID.fullmatch(run_id)
            and not await ArchiveStore(self.broker, self.names).exists(run_id)
        ):
            # A debounced run exists only once its burst fires (its id was answered before):
            # until then, like a pending run's, its messages wait in the inbox; the run's start
            # records a cancel waiting there before it runs anything. (One that ended long ago
            # and was archived is not coming.)
            await msg.nak(delay=handback_delay(n))
            return
        raise Rejected("unknown_run", f"no run with id '{run_id}'")
