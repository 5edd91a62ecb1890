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
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

import msgspec

from sojourn.broker import headers as h
from sojourn.broker.connection import Broker, header
from sojourn.broker.delivery import Delivery, StoredMessage
from sojourn.broker.eventstore import Decision, EventStore
from sojourn.broker.names import InboxSubject, Names
from sojourn.broker.registry import AgentRegistry
from sojourn.broker.wake import publish_wake
from sojourn.schemas.codec import (
    decode_budget,
    decode_cancel,
    decode_child_outcome,
    decode_decision,
    decode_events,
    decode_json,
    decode_resume,
    decode_start,
    encode,
    to_raw,
)
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import ConcurrencyConflict, HistoryError, InvalidName
from sojourn.schemas.events import (
    Budget,
    BudgetChanged,
    CancelRequested,
    RunCancelled,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunResumed,
    RunStarted,
    SignalReceived,
    TriggerInfo,
)
from sojourn.schemas.guard import BodyRefused, check_json
from sojourn.schemas.names import (
    RESERVED_SIGNAL_PREFIX,
    inbox_prefix,
    reserved_run_id,
    valid_reply_subject,
    validate_token,
)
from sojourn.schemas.wire import (
    CHILD_SIGNAL,
    DECIDE_SIGNAL,
    CancelBody,
    ChildOutcome,
    DeadLetter,
    ErrorBody,
    InDoubtDecision,
    IntakeError,
    IntakeOk,
    RejectCode,
    StartTrigger,
)

from ..agents.agent import Agent
from ..core.state import RunState, fold
from ..history.chain import continued_as, current_run
from ..history.pending import find_pending, scan_inbox
from ..history.snapshots import current as current_snapshot
from ..ops import metrics
from .faults import fault
from .interrupt import publish_interrupt

__all__ = ["REPLY_HEADER", "Intake", "Rejected", "dead_letter"]

log = logging.getLogger("sojourn.intake")

REPLY_HEADER = h.REPLY_TO

UNKNOWN_RUN_RETRIES = 5
"""Deliveries of a cancel for a run that does not exist yet before it is dead-lettered."""

HANDBACK_MAX_DELAY = 30.0
"""Longest pause before a handed-back trigger (its agent is served elsewhere) is looked at
again: the pause grows by a second per delivery up to this."""


def handback_delay(delivered: int) -> float:
    """The pause before a message handed back for another worker is delivered again: a second
    per delivery so far (at most ``HANDBACK_MAX_DELAY``), plus up to a second at random.

    The random part matters: intakes pull once a second, and a whole-second pause lands the
    message when the same intake's pull is again the oldest one waiting, so the worker that
    handed it back would take it every time and one that serves its agent never would.
    """
    return min(HANDBACK_MAX_DELAY, float(delivered)) + random.random()


DEAD_LETTER_HEADERS_MAX = 16 * 1024
"""Header bytes a dead-letter record keeps; beyond it the headers are summarised."""

_RECORD_OVERHEAD = 64 * 1024
"""Room left in a dead-letter message for everything but the body."""

OnCreated = Callable[[str, list[Decision], Delivery], Awaitable[bool]]
"""Called with a freshly created run: return True to run it at once (then the callee settles
the inbox message), False to have the intake wake it through the wake stream."""


@dataclass(frozen=True, slots=True)
class ScheduledFire:
    """The fire a scheduled run comes from: the schedule's name and the nominal fire time."""

    name: str
    at: float


class ScheduleRequests(Protocol):
    """What handles ``<prefix>.as.<sender>.schedule.<name>`` messages
    (``actors/worker/scheduler.py``): it answers and settles each, or raises ``Rejected``."""

    async def handle_request(self, msg: Delivery, inbox: InboxSubject) -> None: ...


class Screened(NamedTuple):
    """What ``Intake.screen`` says of a message: its parsed subject (``None``: not an inbox
    subject), why it is refused (``None``: go on), and whether it may be answered."""

    inbox: InboxSubject | None
    rejected: Rejected | None
    answerable: bool


class Rejected(Exception):
    def __init__(self, code: RejectCode, message: str) -> None:
        super().__init__(message)
        self.code: RejectCode = code
        self.message = message


DlqKind = Literal["start", "signal", "cancel", "other"]
_DLQ_KINDS: dict[str, DlqKind] = {
    "start": "start",
    "spawn": "start",
    "signal": "signal",
    "resume": "signal",
    "budget": "signal",
    "decide": "signal",
    "child": "signal",
    "cancel": "cancel",
}


_ENVELOPES: Mapping[str, int] = {"signal": 0, "schedule": 2}
"""How many levels of a body are its message's own wrapping, above the value it carries
(``{"input": ...}`` is 1, a signal's payload is the body, a schedule request's input sits in
its spec): the depth limit (``guard.MAX_DEPTH``) is the value's. Every other kind: 1."""


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
    ) -> None:
        self.broker = broker
        self.store = store
        self.names = names
        self.settings = settings
        self.registry = registry
        self.agents = agents
        self.writer = writer
        self.on_created = on_created
        self.schedules: ScheduleRequests | None = None
        """Set by the worker: the handler of schedule requests."""

    def _answerable(self, reply_to: str, sender: str | None) -> bool:
        """Whether the intake may answer a message from ``sender`` on ``reply_to`` (already a
        valid ``_INBOX.`` subject). Under authentication (this worker's connection has a user,
        so every sender is the broker's word) only in the sender's own inboxes,
        ``_INBOX.<sender>.``: a user may read only those, so no sender can push an answer into
        another user's pending request. Without authentication any inbox (anyone may read
        any)."""
        if self.broker.user is None or sender is None:
            return True
        return reply_to.startswith(inbox_prefix(sender) + ".")

    async def _agent_of(self, run_id: str) -> str | None:
        """The agent of an existing run, from its first stored message (for routing a wake)."""
        first = await self.broker.direct_get_next(
            self.names.events_stream, self.names.events(run_id), 1
        )
        if first is None:
            return None
        try:
            events = decode_events(first.data)
        except msgspec.DecodeError:  # a poison history: the worker that wakes it reports it
            return None
        return events[0].agent if events and isinstance(events[0], RunStarted) else None

    def screen(self, msg: Delivery) -> Screened:
        """The checks that need nothing but the message itself: its subject, reply subject,
        delivery count, size, header block and body bytes (``guard.check_json``), and a
        reserved signal name. Pure and quick (a body's check is one pass over it): the worker
        runs it as a message arrives, so that a message refused here is refused at once, not
        after the messages about the same run that came before it."""
        reply_to = msg.header(REPLY_HEADER)
        reply_ok = not reply_to or valid_reply_subject(reply_to)
        try:
            inbox = self.names.parse_inbox(msg.subject)
        except InvalidName as e:
            return Screened(None, Rejected("invalid_trigger", e.message), reply_ok)
        try:
            self._check(msg, inbox, reply_to, reply_ok)
        except Rejected as r:
            answerable = reply_ok and r.code != "invalid_reply_to"
            return Screened(inbox, r, answerable)
        return Screened(inbox, None, reply_ok)

    def _check(self, msg: Delivery, inbox: InboxSubject, reply_to: str, reply_ok: bool) -> None:
        if not reply_ok:
            raise Rejected(
                "invalid_reply_to",
                f"{REPLY_HEADER} must be a request/reply inbox (_INBOX.<tokens>, at most "
                "256 characters); nothing is answered elsewhere",
            )
        if reply_to and not self._answerable(reply_to, inbox.sender):
            raise Rejected(
                "invalid_reply_to",
                f"a message sent as {inbox.sender!r} is answered only in its inboxes "
                f"({inbox_prefix(inbox.sender)}.<tokens>); nothing is answered elsewhere",
            )
        if msg.num_delivered >= self.settings.max_deliveries:
            raise Rejected(
                "max_deliveries",
                f"delivered {msg.num_delivered} times without being settled "
                f"(Settings.max_deliveries = {self.settings.max_deliveries}); given up",
            )
        # A child's end notice carries the child's output, bounded by the largest value a
        # run may store: the user-facing limit must never refuse it.
        limit, what = (
            (self.settings.max_child_notice, "Settings.max_child_notice")
            if inbox.kind == "child"
            else (self.settings.max_payload, "Settings.max_payload")
        )
        if len(msg.data) > limit:
            raise Rejected(
                "payload_too_large",
                f"payload is {len(msg.data)} bytes; the limit is {limit} bytes ({what})",
            )
        if msg.header(h.GARBLED):
            raise Rejected(
                "invalid_headers",
                f"the message's header block cannot be parsed ({msg.header(h.GARBLED)})",
            )
        if msg.data.strip():
            try:
                check_json(msg.data, envelope=_ENVELOPES.get(inbox.kind, 1))
            except BodyRefused as e:
                raise Rejected(e.code, e.message) from None
        if inbox.kind == "signal" and inbox.name.startswith(RESERVED_SIGNAL_PREFIX):
            raise Rejected(
                "forbidden",
                f"signal names starting with {RESERVED_SIGNAL_PREFIX!r} are reserved: "
                "resume, decide and child notices travel on control subjects",
            )

    async def refuse(self, msg: Delivery, screened: Screened) -> None:
        """Settle a message ``screen`` refused: dead-lettered, answered where it may be,
        acked."""
        assert screened.rejected is not None
        kind = _DLQ_KINDS.get(screened.inbox.kind, "other") if screened.inbox else "other"
        r = screened.rejected
        await self._reject(msg, kind, r.code, r.message, screened.answerable)

    async def handle(self, msg: Delivery, screened: Screened | None = None) -> None:
        """Process one inbox message and settle it (ack, or nak to retry later).
        ``screened``: what ``screen`` said of it, when the caller asked already."""
        screened = screened or self.screen(msg)
        if screened.rejected is not None:
            await self.refuse(msg, screened)
            return
        inbox = screened.inbox
        assert inbox is not None
        kind = inbox.kind
        reply_ok = screened.answerable
        try:
            if inbox.kind in ("start", "spawn"):
                started = await self._start(msg, inbox)
                if started is None:
                    return
                answer, created, wake = started
                await self._reply(msg, encode(answer))
                if (
                    created is not None
                    and self.on_created is not None
                    and await self.on_created(answer.run_id, created, msg)
                ):
                    return  # the worker runs it now and settles msg when the run rests
                if wake:
                    await publish_wake(
                        self.broker, self.names, answer.run_id, "start", agent=inbox.target
                    )
                await msg.ack()
                return
            if inbox.kind == "schedule":
                if self.schedules is None:
                    raise Rejected("internal", "this process does not handle schedules")
                await self.schedules.handle_request(msg, inbox)
                return
            if inbox.kind == "cancel":
                handled = await self._cancel(msg, inbox)
            else:
                handled = await self._record(msg, inbox)
            if handled is None:
                return
            await self._reply(msg, encode(handled))
            await msg.ack()
        except Rejected as r:
            await self._reject(msg, _DLQ_KINDS.get(kind, "other"), r.code, r.message, reply_ok)
        except HistoryError as e:  # the run's history cannot be read: retrying cannot help
            await self._reject(msg, _DLQ_KINDS.get(kind, "other"), "internal", e.message)

    # --- start -------------------------------------------------------------------------------

    async def _start(
        self, msg: Delivery, inbox: InboxSubject
    ) -> tuple[IntakeOk, list[Decision] | None, bool] | None:
        """Create the run. Returns the answer, the run's whole history when this call created
        it (so it can run at once), and whether the run needs a wake.

        ``None`` means the message was handed back (nak) for another worker.
        """
        try:
            trigger = decode_start(msg.data)
        except msgspec.ValidationError as e:
            raise Rejected(
                "invalid_trigger", f'trigger must be {{"input": ..., "run_id": optional}}: {e}'
            ) from e
        except msgspec.DecodeError as e:
            raise Rejected("invalid_json", f"trigger is not valid JSON: {e}") from e
        parent = trigger.parent_run_id
        if inbox.name:  # the subject names the run (``start.<agent>.<run_id>``): it decides
            why = reserved_run_id(inbox.name)
            if why is not None:
                raise Rejected("invalid_run_id", f"run id {inbox.name!r} in the subject {why}")
            if trigger.run_id is None:
                trigger = msgspec.structs.replace(trigger, run_id=inbox.name)
            elif trigger.run_id != inbox.name:
                raise Rejected(
                    "invalid_run_id",
                    f"the subject names run {inbox.name!r} but the body's run_id is "
                    f"{trigger.run_id[:200]!r}",
                )
        if inbox.kind == "spawn":
            if parent is None or trigger.run_id is None:
                raise Rejected("invalid_trigger", "a spawn names its parent and the child's id")
            for value, what in ((parent, "parent_run_id"), (trigger.run_id, "run_id")):
                try:
                    validate_token(value, what)
                except InvalidName as e:
                    raise Rejected("invalid_run_id", e.message) from e
        elif parent is not None:
            raise Rejected(
                "forbidden", "parent_run_id is set by sojourn when a run starts a child run"
            )
        elif trigger.run_id is not None and reserved_run_id(trigger.run_id) is not None:
            raise Rejected(
                "invalid_run_id", f"run id {trigger.run_id!r} {reserved_run_id(trigger.run_id)}"
            )
        try:
            return await self._create(msg, inbox.target, trigger, sender=inbox.sender)
        except Rejected as r:
            if parent is not None and trigger.run_id is not None:
                # A parent awaits this child: tell it the child will never run.
                outcome = ChildOutcome(
                    child_run_id=trigger.run_id,
                    status="rejected",
                    output=to_raw(None),
                    error=ErrorBody(code=r.code, message=r.message),
                )
                await self.broker.publish(
                    self.names.child_end(parent, trigger.run_id, self._sender()),
                    encode(outcome),
                    {h.MSG_ID: f"child-end:{trigger.run_id}"},
                )
            raise

    def _sender(self) -> str:
        """This worker's sender token for the control messages it sends itself."""
        return self.broker.sender("worker")

    async def create_scheduled(
        self, msg: Delivery, agent_name: str, trigger: StartTrigger, fire: ScheduledFire
    ) -> tuple[IntakeOk, list[Decision] | None, bool] | None:
        """Create the run a schedule's fire starts (``trigger.run_id`` derived from the fire),
        as a start would; ``msg`` is the fire, or the inbox message of a ``trigger``.

        Raises:
            Rejected: the input no longer fits the agent (or the agent is unknown).
        """
        return await self._create(msg, agent_name, trigger, fire)

    async def _create(
        self,
        msg: Delivery,
        agent_name: str,
        trigger: StartTrigger,
        fire: ScheduledFire | None = None,
        *,
        sender: str | None = None,
    ) -> tuple[IntakeOk, list[Decision] | None, bool] | None:
        if trigger.parent_run_id:
            await self._check_parent(trigger.parent_run_id)
        agent = self.agents.get(agent_name)
        if agent is None:
            if await self.registry.is_known(agent_name):
                # Another worker serves it. Pauses grow, so a trigger waiting hours for its
                # agent's worker costs little, and is dead-lettered at max_deliveries.
                n = msg.num_delivered
                await msg.nak(delay=handback_delay(n))
                return None
            raise Rejected("unknown_agent", f"no worker serves an agent named '{agent_name}'")
        inbox_seq = msg.stream_seq if fire is None else 0
        run_id = trigger.run_id or _derived_run_id(agent_name, inbox_seq, msg.timestamp.isoformat())
        try:
            validate_token(run_id, "run_id")
        except InvalidName as e:
            raise Rejected("invalid_run_id", e.message) from e
        try:
            agent.decode_input(bytes(trigger.input))
        except msgspec.MsgspecError as e:  # a ValidationError; a DecodeError is refused sooner
            raise Rejected(
                "invalid_input", f"input does not match agent '{agent_name}': {e}"
            ) from e
        budget = agent.budget.over(trigger.budget) if agent.budget else trigger.budget
        if budget is not None and budget.empty:
            budget = None
        started = RunStarted(
            run_id=run_id,
            agent=agent_name,
            input=trigger.input,
            code_version=agent.version,
            parent_run_id=trigger.parent_run_id,
            trigger=TriggerInfo(
                inbox_seq=inbox_seq,
                msg_id=msg.header(h.MSG_ID) or None,
                received_at=time.time(),
                sent_by=sender,
            ),
            budget_usd=None if budget is None else budget.usd,
            budget_tokens=None if budget is None else budget.tokens,
            budget=None if budget is None else Budget(**msgspec.structs.asdict(budget)),
            schedule=None if fire is None else fire.name,
            scheduled_at=None if fire is None else fire.at,
            at=time.time(),
        )
        # A cancel sent while the run was pending waits in the inbox behind its start: looked
        # for while the start is appended, and recorded right after it, before the run runs
        # anything (every start pays this look, usually for nothing: in parallel it costs no
        # time).
        look = asyncio.ensure_future(
            self._queued_cancel(run_id) if fire is None else _nothing_queued()
        )
        msg_id = f"{run_id}:start:{inbox_seq}" if fire is None else f"{run_id}:fire"
        try:
            seq, earlier = await self.store.append_once(
                run_id, [started], expected_seq=0, writer=self.writer, msg_id=msg_id
            )
        except ConcurrencyConflict:
            await _dismiss(look)
            first = await self.store.first(run_id)
            made = first.events[0] if first and first.events else None
            ours = isinstance(made, RunStarted) and (
                made.trigger.inbox_seq == inbox_seq
                if fire is None
                else (made.schedule, made.scheduled_at) == (fire.name, fire.at)
            )
            # ours: a redelivery of the trigger that created this run. The worker that took it
            # may have died before the run rested, so wake it (a wake is only a hint).
            return IntakeOk(run_id=run_id, created=ours), None, ours
        except BaseException:
            await _dismiss(look)
            raise
        if earlier:  # we created it before and crashed or lost the ack: history may have grown
            await _dismiss(look)
            return IntakeOk(run_id=run_id, created=True), None, True
        history = [Decision(seq=seq, events=(started,), writer=self.writer, msg_id=msg_id)]
        queued = await look
        if queued is not None:
            cancel_seq, cancel = queued
            cancel_id = f"{run_id}:cancel:{cancel_seq}"  # what its own delivery would write
            try:
                seq = await self.store.append(
                    run_id, [cancel], expected_seq=seq, writer=self.writer, msg_id=cancel_id
                )
            except ConcurrencyConflict:
                # Something came in meanwhile: the cancel is recorded when it is delivered.
                return IntakeOk(run_id=run_id, created=True), None, True
            history.append(
                Decision(seq=seq, events=(cancel,), writer=self.writer, msg_id=cancel_id)
            )
        return IntakeOk(run_id=run_id, created=True), history, True

    async def _queued_cancel(self, run_id: str) -> tuple[int, CancelRequested] | None:
        """The oldest cancel of ``run_id`` stored in the inbox that the intake would accept:
        its inbox sequence and the event it would record (its sender is its subject's), or
        ``None``.

        When that cancel message is delivered later, ``_cancel`` finds the run cancelled at its
        start and records nothing more.
        """
        names = self.names
        # The two forms in parallel: every start pays this look, usually for nothing.
        found = await asyncio.gather(
            self._first_stored_cancel(names.cancel(run_id), run_id),
            self._first_stored_cancel(names.cancel(run_id, "*"), run_id),
        )
        return min((f for f in found if f is not None), key=lambda f: f[0], default=None)

    async def _first_stored_cancel(
        self, subject: str, run_id: str
    ) -> tuple[int, CancelRequested] | None:
        """The oldest cancel stored on ``subject`` that the intake would accept, with its
        inbox sequence."""
        async for m in scan_inbox(self.broker, self.names.inbox_stream, subject):
            event = self._stored_cancel(m, run_id)
            if event is not None:
                return m.seq, event
        return None

    def _stored_cancel(self, m: StoredMessage, run_id: str) -> CancelRequested | None:
        """The event a stored cancel message records when it is delivered, ``None`` if the
        intake would refuse it (the checks of ``handle`` and ``_cancel``, in their order)."""
        try:
            inbox = self.names.parse_inbox(m.subject)
        except InvalidName:
            return None
        if inbox.kind != "cancel" or inbox.target != run_id:
            return None
        reply_to = m.header(REPLY_HEADER)
        if reply_to and not valid_reply_subject(reply_to):
            return None
        if len(m.data) > self.settings.max_payload:
            return None
        try:
            body = _cancel_body(m.data)
        except Rejected:
            return None
        return CancelRequested(
            reason=body.reason, by=inbox.sender, terminate=body.terminate, at=time.time()
        )

    async def _check_parent(self, parent_run_id: str) -> None:
        """A child whose parent was cancelled (or ended) while its start was queued must not
        run: the parent's cancel cascade could not reach a run that did not exist yet."""
        history = await self.store.history(parent_run_id)
        if not history:
            raise Rejected("unknown_run", f"parent run '{parent_run_id}' does not exist")
        parent = fold(e for d in history for e in d.events)
        if parent.terminal or parent.cancel_requested is not None:
            raise Rejected(
                "run_ended",
                f"parent run '{parent_run_id}' is {parent.status}"
                + (" (cancel requested)" if parent.cancel_requested else ""),
            )

    # --- signals, resumes, decisions, child notices ------------------------------------------

    def _events_for(self, msg: Delivery, inbox: InboxSubject, state: RunState) -> list[RunEvent]:
        """The events a signal-like message records (none when it changes nothing).

        A decision on a suspended run also resumes it, in the same append: sent as two
        messages, the resume could be handled first (by another worker's intake), and the run
        would replay, find no decision and suspend again with the decision left unread.
        """
        events: list[RunEvent] = []
        event = self._event_for(msg, inbox, state)
        if event is not None:
            events.append(event)
            if inbox.kind == "decide" and state.status == "suspended":
                position = inbox.name.split(".")[0]
                note = f"decided for the step at position {position}"
                events.append(RunResumed(by=inbox.sender, note=note, at=time.time()))
            elif inbox.kind == "budget" and state.suspended_reason == "budget":
                # Resumed by the change, not granted the old budget again: the run checks its
                # new limits at its next step (and suspends again if one is still used up).
                note = "budget changed"
                events.append(RunResumed(by=inbox.sender, note=note, grant=False, at=time.time()))
        return events

    def _event_for(self, msg: Delivery, inbox: InboxSubject, state: RunState) -> RunEvent | None:
        """The event a signal-like message records, or ``None`` when it changes nothing."""
        sender = inbox.sender
        if inbox.kind == "budget":
            try:
                body = decode_budget(msg.data)
            except msgspec.MsgspecError as e:
                raise Rejected(
                    "invalid_trigger",
                    f'budget body must be limits like {{"usd": 5, "steps": 100}}: {e}',
                ) from e
            if body.empty:
                raise Rejected("invalid_trigger", "a budget change names at least one limit")
            return BudgetChanged(
                budget=Budget(**msgspec.structs.asdict(body)), by=sender, at=time.time()
            )
        if inbox.kind == "resume":
            if state.status != "suspended":
                return None  # resumed already: a no-op
            note = ""
            if msg.data.strip():
                try:
                    note = decode_resume(msg.data).note
                except msgspec.MsgspecError as e:
                    raise Rejected(
                        "invalid_trigger", f'resume body must be {{"note": ...}}: {e}'
                    ) from e
            return RunResumed(by=sender, note=note, at=time.time())
        name = inbox.name
        if inbox.kind == "decide":
            try:
                decision = decode_decision(msg.data)
            except msgspec.MsgspecError as e:
                raise Rejected(
                    "invalid_trigger",
                    f'decision must be {{"action": "retry"|"skip"|"fail", "result": ...}}: {e}',
                ) from e
            name = f"{DECIDE_SIGNAL}.{inbox.name}"
            payload = to_raw(
                InDoubtDecision(action=decision.action, result=decision.result, by=sender)
            )
        elif inbox.kind == "child":
            try:
                outcome = decode_child_outcome(msg.data)
            except msgspec.MsgspecError as e:
                raise Rejected("invalid_trigger", f"child notice is not a ChildOutcome: {e}") from e
            if outcome.child_run_id != inbox.name:
                raise Rejected("invalid_trigger", "child notice names another child run")
            name = f"{CHILD_SIGNAL}.{inbox.name}"
            payload = to_raw(outcome)
        else:
            try:
                payload = to_raw(decode_json(msg.data)) if msg.data.strip() else to_raw(None)
            except msgspec.DecodeError as e:
                raise Rejected("invalid_json", f"signal payload is not valid JSON: {e}") from e
        if len(state.signals) >= self.settings.max_buffered_signals:
            raise Rejected(
                "too_many_signals",
                f"run holds {len(state.signals)} unconsumed signals (the limit is "
                f"{self.settings.max_buffered_signals}, Settings.max_buffered_signals)",
            )
        return SignalReceived(
            name=name,
            payload=payload,
            signal_id=self._signal_id(msg, inbox),
            sent_by=sender,
            # Under authentication (our own connection has a user) the broker let only that
            # user, or a gateway speaking for it, publish as ``sender``.
            sender_verified=sender is not None and self.broker.user is not None,
            at=time.time(),
        )

    def _signal_id(self, msg: Delivery, inbox: InboxSubject) -> str:
        if inbox.kind == "child":
            return f"child-end:{inbox.name}"
        if inbox.kind == "decide":
            return f"decide:{inbox.name}:{msg.stream_seq}"
        sid = msg.header(h.SIGNAL_ID) or msg.header(h.MSG_ID)
        if sid and len(sid) <= 256:
            return sid
        return f"inbox-{msg.stream_seq}"

    async def _record(self, msg: Delivery, inbox: InboxSubject) -> IntakeOk | None:
        """Append a signal (once per signal id, ever), a resume or a decision, and wake the
        run. A message already recorded (a redelivery after a crash) wakes the run again:
        the crash may have come before the wake."""
        run_id = inbox.target
        inbox_seq = msg.stream_seq
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
                sid = self._signal_id(msg, inbox)
                if sid in snap.signal_ids:
                    break  # delivered before under this id: count once, wake again
            if state.terminal:
                if inbox.kind == "child":
                    return IntakeOk(run_id=run_id, created=False)  # parent already over
                if state.continued_as is not None:
                    # "The conversation" goes on in a later run of its chain: record it there.
                    run_id, _ = await current_run(self.broker, self.names, state.continued_as)
                    continue
                raise Rejected("run_ended", f"run '{run_id}' has ended ({state.status})")
            events = self._events_for(msg, inbox, state)
            if not events:
                return IntakeOk(run_id=run_id, created=False)
            try:
                await self.store.append(
                    run_id,
                    events,
                    expected_seq=snap.seq,
                    writer=self.writer,
                    msg_id=msg_id,
                )
                break
            except ConcurrencyConflict:
                continue
        else:
            await msg.nak(delay=0.2)
            return None
        fault("intake_recorded")
        agent = snap.state.agent or None
        await publish_wake(self.broker, self.names, run_id, "signal", agent=agent)
        return IntakeOk(run_id=run_id, created=False)

    # --- cancel ------------------------------------------------------------------------------

    async def _cancel(self, msg: Delivery, inbox: InboxSubject) -> IntakeOk | None:
        run_id = inbox.target
        body = _cancel_body(msg.data)
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
            if any(isinstance(e, (RunCompleted, RunFailed, RunCancelled)) for e in last_events):
                return IntakeOk(run_id=run_id, created=False)  # already over: nothing to do
            if await self._cancelled_at_start(run_id, last_events):
                break  # recorded with the start (it was pending): nothing more, wake again
            try:
                await self.store.append(
                    run_id,
                    [
                        CancelRequested(
                            reason=body.reason,
                            by=inbox.sender,
                            terminate=body.terminate,
                            at=time.time(),
                        )
                    ],
                    expected_seq=int(header(last, h.SEQUENCE)),
                    writer=self.writer,
                    msg_id=msg_id,
                )
                break
            except ConcurrencyConflict:
                continue
        else:
            await msg.nak(delay=0.5)
            return None
        fault("intake_recorded")
        # The worker executing the run (if any) interrupts its running step at once; the wake
        # brings a run that rests.
        await publish_interrupt(self.broker, self.names, run_id)
        await publish_wake(
            self.broker, self.names, run_id, "cancel", agent=await self._agent_of(run_id)
        )
        return IntakeOk(run_id=run_id, created=False)

    async def _cancelled_at_start(self, run_id: str, last: list[RunEvent]) -> bool:
        """Whether the run was asked to cancel at its start: a cancel sent while it was pending,
        recorded in the decision right after ``RunStarted`` (``_queued_cancel``; older
        versions recorded it in the same one). Any cancel delivered since adds nothing: the
        run never runs a step."""
        if any(isinstance(e, RunStarted) for e in last):
            return any(isinstance(e, CancelRequested) for e in last)
        first = await self.store.first(run_id)
        if first is None:
            return False
        if any(isinstance(e, CancelRequested) for e in first.events):
            return True
        second = await self.broker.direct_get_next(
            self.names.events_stream, self.names.events(run_id), first.seq + 1
        )
        return second is not None and any(
            isinstance(e, CancelRequested) for e in decode_events(second.data)
        )

    # --- runs that do not exist (yet) --------------------------------------------------------

    async def _not_yet(self, msg: Delivery, run_id: str) -> None:
        """A signal, cancel, resume or decision for a run with no history: hand it back while
        its start may still come, else refuse it ``unknown_run``.

        Its start may be on its way (the first ``UNKNOWN_RUN_RETRIES`` deliveries, a second
        apart), or stored in the inbox and not yet taken (the run is pending: no worker of its
        agent is up). A pending run's messages are handed back with pauses growing like a
        start's for another worker's agent, bounded by ``Settings.max_deliveries``; when a
        worker creates the run they apply in order.

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
        if pending is not None:
            await msg.nak(delay=handback_delay(n))
            return
        raise Rejected("unknown_run", f"no run with id '{run_id}'")

    # --- replies and rejections --------------------------------------------------------------

    async def reply(self, msg: Delivery, body: bytes) -> None:
        """Answer ``msg`` on its ``Sojourn-Reply-To``, if it has a valid one (best effort)."""
        await self._reply(msg, body)

    async def _reply(self, msg: Delivery, body: bytes) -> None:
        reply_to = msg.header(REPLY_HEADER)
        if not reply_to or not valid_reply_subject(reply_to):
            return
        try:
            await self.broker.publish_core(reply_to, body)
        except Exception as e:  # an answer is a courtesy: it must not block the trigger
            log.warning("cannot answer on %r: %s", reply_to, e)

    async def refuse_malformed(
        self, msg: Delivery, error: BaseException, screened: Screened | None
    ) -> None:
        """Refuse a message whose bytes made a decoder fail where no check caught it first (a
        decode error, ``RecursionError``, a ``UnicodeError``): the message's fault, so it is
        dead-lettered and answered on its first delivery (where ``screen`` said it may be:
        ``None``, nowhere), never retried."""
        if isinstance(error, BodyRefused):
            code: RejectCode = error.code
        elif isinstance(error, RecursionError):
            code = "too_deep"
        elif isinstance(error, UnicodeError):
            code = "invalid_encoding"
        else:
            code = "invalid_json"
        inbox = screened.inbox if screened is not None else None
        kind = _DLQ_KINDS.get(inbox.kind, "other") if inbox is not None else "other"
        message = f"the message cannot be read: {type(error).__name__}: {str(error)[:500]}"
        answer = screened is not None and screened.answerable
        await self._reject(msg, kind, code, message, answer)

    async def _reject(
        self, msg: Delivery, kind: DlqKind, code: RejectCode, message: str, answer: bool = True
    ) -> None:
        record = dead_letter(
            msg, kind, code, message, limit=self.broker.max_payload or (1024 * 1024)
        )
        await self.broker.publish(self.names.dlq(kind), encode(record))
        metrics.DEAD_LETTERS.labels(code).inc()
        log.info("rejected %r: %s: %s", msg.subject[:200], code, message)
        if answer:
            error = IntakeError(error=ErrorBody(code=code, message=message))
            await self._reply(msg, encode(error))
        await msg.ack()


def _cancel_body(data: bytes) -> CancelBody:
    """A cancel message's body (empty: no reason).

    Raises:
        Rejected: ``invalid_trigger`` (not a cancel body) or ``invalid_json``.
    """
    if not data.strip():
        return CancelBody()
    try:
        return decode_cancel(data)
    except msgspec.ValidationError as e:
        raise Rejected("invalid_trigger", f'cancel body must be {{"reason": ...}}: {e}') from e
    except msgspec.DecodeError as e:
        raise Rejected("invalid_json", f"cancel body is not valid JSON: {e}") from e


def dead_letter(msg: Delivery, kind: DlqKind, code: str, message: str, *, limit: int) -> DeadLetter:
    """A dead-letter record of ``msg`` that fits in a message of ``limit`` bytes.

    The body is kept whole when its base64 fits; otherwise its head is kept, marked
    ``truncated``, with the size and SHA-256 of the whole. Oversized headers are summarised.
    """
    data = bytes(msg.data)
    room = max(0, (limit - _RECORD_OVERHEAD) * 3 // 4)  # base64 grows 4/3
    headers = dict(msg.headers)
    if sum(len(k) + len(v) for k, v in headers.items()) > DEAD_LETTER_HEADERS_MAX:
        headers = {k[:256]: v[:256] for k, v in list(headers.items())[:32] if isinstance(v, str)}
        headers[h.DLQ_NOTE] = "headers truncated"
    return DeadLetter(
        code=code,
        message=message,
        subject=msg.subject[:1024],
        data=data[:room],
        headers=headers,
        inbox_seq=msg.stream_seq,
        rejected_at=time.time(),
        kind=kind,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        truncated=len(data) > room,
    )


async def _nothing_queued() -> tuple[int, CancelRequested] | None:
    """A scheduled run's start never waits behind a cancel in the inbox: a cancel for it
    before it exists is refused ``unknown_run`` (no client can start a run of that id)."""
    return None


async def _dismiss(task: asyncio.Future[tuple[int, CancelRequested] | None]) -> None:
    """Cancel a look whose answer is no longer wanted, and let it end (whatever it raised)."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _derived_run_id(agent: str, inbox_seq: int, stored_at: str) -> str:
    """A run id that is the same on every redelivery of the same inbox message."""
    digest = hashlib.blake2b(f"{agent}:{inbox_seq}:{stored_at}".encode(), digest_size=10)
    return f"r{digest.hexdigest()}"


def agent_in(history: list[Decision]) -> str | None:
    """The agent a history's ``RunStarted`` names, if it starts with one."""
    first = history[0].events[0] if history and history[0].events else None
    return first.agent if isinstance(first, RunStarted) else None
