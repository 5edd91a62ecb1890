"""Starting runs: what the intake does with a start, a child's spawn or a schedule's fire.

A start is checked (the run id its subject or body names, a child's parent), then the run is
created: its ``RunStarted`` appended create-only under a Msg-Id that is the same on every
delivery, so a redelivery finds the run it created. A cancel sent while the run was pending
waits in the inbox behind its start: it is looked for while the start is appended and recorded
right after it. A start for an agent this worker does not serve is handed back for one that
does (``handback_delay``); a refused child start tells its parent.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import msgspec

from sojourn.broker import headers as h
from sojourn.broker.delivery import Delivery, StoredMessage
from sojourn.broker.eventstore import Decision, EventStore
from sojourn.broker.names import InboxSubject
from sojourn.broker.registry import AgentRegistry
from sojourn.broker.tasks import cancel_and_wait
from sojourn.schemas.attributes import InvalidAttributes, validate_attributes
from sojourn.schemas.codec import decode_start, encode, to_raw
from sojourn.schemas.errors import ConcurrencyConflict, InvalidName
from sojourn.schemas.events import (
    Budget,
    CancelRequested,
    ConcurrencyInfo,
    RunStarted,
    TriggerInfo,
)
from sojourn.schemas.fairness import Fairness, read_fairness
from sojourn.schemas.flow import DEBOUNCED_RUN_ID
from sojourn.schemas.names import reserved_run_id, valid_reply_subject, validate_token
from sojourn.schemas.priority import PRIORITY_DEFAULT, Priority
from sojourn.schemas.tracing import trace_context
from sojourn.schemas.wire import ChildOutcome, ErrorBody, IntakeOk, StartTrigger

from ..agents.agent import Agent
from ..core.state import fold
from ..history.pending import scan_inbox
from .clock import Clock
from .control import cancel_body, cancel_requested
from .opening import Opening, QueuedCancel
from .refusals import REPLY_HEADER, Rejected

__all__ = [
    "HANDBACK_MAX_DELAY",
    "Created",
    "ScheduledFire",
    "Starts",
    "dismiss",
    "handback_delay",
    "handoff_delay",
    "started_by",
]

HANDBACK_MAX_DELAY = 30.0
"""Longest pause before a handed-back trigger (its agent is served elsewhere) is looked at
again: the pause grows by a second per delivery up to this."""


HANDOFF_FIRST = 0.01
"""Seconds before a trigger handed back a second time for another live worker serving its
agent is delivered again; each hand-back after it doubles the pause (at most
``HANDBACK_MAX_DELAY``). The first hand-back has none."""


def handoff_delay(delivered: int) -> float:
    """The pause before a message handed back for another *live* worker that serves its
    agent is delivered again: none the first time, then 10 ms doubling with each delivery (at
    most ``HANDBACK_MAX_DELAY``), plus up to half of it at random.

    Intakes share one consumer, and the server gives a message to the oldest pull request
    waiting: a worker idle for another agent is the one waiting longest, so it takes nearly
    every start of a busier agent first. A pause of a second (``handback_delay``) cost each such
    start a second or two, and any pause at all some 10 ms (the server's timer); handed back at
    once, it goes to the next waiting intake within a millisecond or two. The doubling bounds
    what the hand-backs cost while every worker of the agent is busy (no pull of theirs
    waiting): a few dozen over half a minute, not one per round trip.
    """
    if delivered <= 1:
        return 0.0
    pause = min(HANDBACK_MAX_DELAY, HANDOFF_FIRST * 2.0 ** min(delivered - 2, 16))
    return pause * (1.0 + random.random() / 2)


def _nowhere(agent: str) -> bool:
    """No other live worker is known to serve ``agent`` (a ``Starts`` without heartbeats)."""
    return False


def handback_delay(delivered: int) -> float:
    """The pause before a message handed back for another worker is delivered again: a second
    per delivery so far (at most ``HANDBACK_MAX_DELAY``), plus up to a second at random.

    The random part matters: intakes pull once a second, and a whole-second pause lands the
    message when the same intake's pull is again the oldest one waiting, so the worker that
    handed it back would take it every time and one that serves its agent never would.
    """
    return min(HANDBACK_MAX_DELAY, float(delivered)) + random.random()


Created = tuple[IntakeOk, list[Decision] | None, bool]
"""A start's result: the answer, the run's whole history when this call created it (so it can
run at once), and whether the run needs a wake."""


@dataclass(frozen=True, slots=True)
class ScheduledFire:
    """The fire a scheduled run comes from: the schedule's name and the nominal fire time."""

    name: str
    at: float


class Starts:
    """Creates the runs one worker's intake is asked to start, of the agents it serves,
    appending to ``store`` (and reading through its broker) as ``writer``."""

    def __init__(
        self,
        store: EventStore,
        registry: AgentRegistry,
        agents: Mapping[str, Agent[object, object]],
        writer: str,
        opens: Callable[[str], bool] | None = None,
        clock: Clock | None = None,
        served_elsewhere: Callable[[str], bool] | None = None,
    ) -> None:
        """``opens``: whether this worker executes a run it creates now at once (then it is
        opened in memory and stored with its first decision, ``worker/opening.py``);
        ``clock``: the runs' clock (``worker/clock.py``); ``served_elsewhere``: whether another
        live worker serves an agent (its heartbeats say; ``None``: not known here)."""
        self.clock = clock or Clock()
        self.served_elsewhere: Callable[[str], bool] = served_elsewhere or _nowhere
        self.broker = store.broker
        self.store = store
        self.names = store.names
        self.settings = store.settings
        self.registry = registry
        self.agents = agents
        self.writer = writer
        self.opens = opens

    async def start(self, msg: Delivery, inbox: InboxSubject) -> Created | Opening | None:
        """Create the run a start or a spawn asks for (``Created``), or open it in memory when
        this worker executes it at once (``Opening``: stored with its first decision).

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
        if trigger.concurrency is not None and (
            trigger.singleton_key is not None
            or trigger.debounce is not None
            or trigger.fork is not None
        ):
            raise Rejected(
                "invalid_concurrency", "a singleton, debounced or forked start takes no concurrency"
            )
        if trigger.singleton_key is not None or trigger.debounce is not None:
            from .singletons import keyed_start  # keyed starts build on this module (0047)

            return await keyed_start(self, msg, inbox, trigger)
        if trigger.fork is not None:  # a fork of another run (decision 0041)
            if inbox.kind != "start":
                raise Rejected("invalid_trigger", "a child run is not a fork")
            from .forks import create_fork  # it builds on this module

            return await create_fork(self, msg, inbox.target, trigger, inbox.sender)
        try:
            from .concurrency import limited, limited_start  # it builds on this module (0048)

            if limited(self.agents.get(inbox.target), trigger):
                return await limited_start(self, msg, inbox, trigger)
            return await self._create(
                msg, inbox.target, trigger, sender=inbox.sender, lane=inbox.priority
            )
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

    def soon_served(self, agent_name: str) -> bool:
        """Whether a start of ``agent_name`` is taken soon: this worker or another live one
        serves the agent."""
        return agent_name in self.agents or self.served_elsewhere(agent_name)

    async def hand_back(self, msg: Delivery, agent_name: str) -> None:
        """Hand ``msg`` (a trigger of an agent another worker serves) back for that worker: at
        once when a live worker serves the agent (``handoff_delay``), else with pauses growing
        by a second per delivery (``handback_delay``), so that a trigger waiting hours for its
        agent's worker costs little; dead-lettered at ``max_deliveries`` either way."""
        n = msg.num_delivered
        if self.served_elsewhere(agent_name):
            await msg.nak(delay=handoff_delay(n))
        else:
            await msg.nak(delay=handback_delay(n))

    def _lane_of(self, msg: Delivery) -> Priority:
        """The priority of the lane ``msg`` came on (decision 0049): a start's or spawn's
        ``p<n>`` token; a schedule's fire and a debounced start come on the default lane."""
        try:
            return self.names.parse_inbox(msg.subject).priority
        except InvalidName:
            return PRIORITY_DEFAULT

    def _sender(self) -> str:
        """This worker's sender token for the control messages it sends itself."""
        return self.broker.sender("worker")

    async def create(
        self,
        msg: Delivery,
        agent_name: str,
        trigger: StartTrigger,
        *,
        sender: str | None,
        stored: bool = False,
        concurrency: ConcurrencyInfo | None = None,
    ) -> Created | Opening | None:
        """Create the run ``trigger`` names, as a start does, for a module that decided first
        whether to (``worker/singletons.py``, ``worker/debounce.py``: decision 0047);
        ``stored``: never opened in memory (the caller executes or wakes it)."""
        created = await self._create(
            msg, agent_name, trigger, sender=sender, concurrency=concurrency
        )
        if stored and isinstance(created, Opening):
            return await self.store_opening(created)
        return created

    async def create_scheduled(
        self, msg: Delivery, agent_name: str, trigger: StartTrigger, fire: ScheduledFire
    ) -> Created | None:
        """Create the run a schedule's fire starts (``trigger.run_id`` derived from the fire),
        as a start would; ``msg`` is the fire, or the inbox message of a ``trigger``.

        Raises:
            Rejected: the input no longer fits the agent (or the agent is unknown).
        """
        created = await self._create(msg, agent_name, trigger, fire)
        assert not isinstance(created, Opening)  # a fire's run is stored before it runs
        return created

    async def _create(
        self,
        msg: Delivery,
        agent_name: str,
        trigger: StartTrigger,
        fire: ScheduledFire | None = None,
        *,
        sender: str | None = None,
        concurrency: ConcurrencyInfo | None = None,
        lane: Priority | None = None,
    ) -> Created | Opening | None:
        """``lane``: the priority of the lane ``msg`` came on, when its subject is parsed
        already (else parsed again: ``_lane_of``)."""
        if trigger.parent_run_id:
            await self._check_parent(trigger.parent_run_id)
        agent = self.agents.get(agent_name)
        if agent is None:
            if await self.registry.is_known(agent_name):
                await self.hand_back(msg, agent_name)
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
        attributes = None
        if trigger.attributes:
            try:
                checked = validate_attributes(trigger.attributes)
            except InvalidAttributes as e:
                raise Rejected("invalid_attributes", e.message) from e
            attributes = {k: v for k, v in checked.items() if v is not None}
        budget = agent.budget.over(trigger.budget) if agent.budget else trigger.budget
        if budget is not None and budget.empty:
            budget = None
        try:
            fairness = read_fairness(msg.headers)
        except InvalidName as e:
            raise Rejected("invalid_fairness", e.message) from e
        now = self.clock.now()
        tp, ts = trace_context(msg.header(h.TRACEPARENT), msg.header(h.TRACESTATE))
        started = RunStarted(
            run_id=run_id,
            agent=agent_name,
            input=trigger.input,
            code_version=agent.version,
            parent_run_id=trigger.parent_run_id,
            trigger=TriggerInfo(
                inbox_seq=inbox_seq,
                msg_id=msg.header(h.MSG_ID) or None,
                received_at=now,
                sent_by=sender,
            ),
            budget_usd=None if budget is None else budget.usd,
            budget_tokens=None if budget is None else budget.tokens,
            budget=None if budget is None else Budget(**msgspec.structs.asdict(budget)),
            schedule=None if fire is None else fire.name,
            scheduled_at=None if fire is None else fire.at,
            traceparent=tp,
            tracestate=ts,
            attributes=attributes,
            concurrency=concurrency,
            priority=self._lane_of(msg) if lane is None else lane,
            fairness=None if fairness == Fairness() else fairness,
            at=now,
        )
        # A cancel sent while the run was pending waits in the inbox behind its start: looked
        # for while the start is stored, and recorded right after it, before the run runs
        # anything. Only a start delivered with messages behind it (or delivered before) can
        # have one: a cancel stored after the start was delivered finds the run starting, and
        # interrupts it like any cancel.
        # A debounced run's id was answered to its burst's starts long before the run exists:
        # a cancel sent meanwhile waits in the inbox (decision 0047), so its start always looks.
        look = None
        if fire is None and (
            msg.num_pending > 0 or msg.num_delivered > 1 or DEBOUNCED_RUN_ID.fullmatch(run_id)
        ):
            look = asyncio.ensure_future(self._queued_cancel(run_id))
        msg_id = f"{run_id}:start:{inbox_seq}" if fire is None else f"{run_id}:fire"
        if fire is None and self.opens is not None and self.opens(run_id):
            return Opening(started, msg_id, self.writer, look)
        return await self._store(started, msg_id, look, fire)

    async def store_opening(self, opening: Opening) -> Created:
        """Store an opened run's ``RunStarted`` alone, as the intake does for a run it does
        not execute at once (the worker declined it after all)."""
        return await self._store(opening.started, opening.msg_id, opening.look, None)

    async def _store(
        self,
        started: RunStarted,
        msg_id: str,
        look: Awaitable[QueuedCancel | None] | None,
        fire: ScheduledFire | None,
    ) -> Created:
        run_id = started.run_id
        try:
            seq, earlier = await self.store.append_once(
                run_id, [started], expected_seq=0, writer=self.writer, msg_id=msg_id
            )
        except ConcurrencyConflict:
            await dismiss(look)
            return await self.existing(started, fire)
        except BaseException:
            await dismiss(look)
            raise
        if earlier:  # we created it before and crashed or lost the ack: history may have grown
            await dismiss(look)
            return IntakeOk(run_id=run_id, created=True), None, True
        history = [Decision(seq=seq, events=(started,), writer=self.writer, msg_id=msg_id)]
        queued = None if look is None else await look
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

    async def existing(self, started: RunStarted, fire: ScheduledFire | None = None) -> Created:
        """The answer to a start of a run that exists: ``created`` when this very trigger (or
        fire) created it (a redelivery), and then the run is woken, for the worker that took it
        may have died before the run rested (a wake is only a hint)."""
        first = await self.store.first(started.run_id)
        made = first.events[0] if first and first.events else None
        ours = isinstance(made, RunStarted) and (
            made.trigger.inbox_seq == started.trigger.inbox_seq
            if fire is None
            else (made.schedule, made.scheduled_at) == (fire.name, fire.at)
        )
        return IntakeOk(run_id=started.run_id, created=ours), None, ours

    async def _queued_cancel(self, run_id: str) -> QueuedCancel | None:
        """The oldest cancel of ``run_id`` stored in the inbox that the intake would accept:
        its inbox sequence and the event it would record (its sender is its subject's), or
        ``None``.

        When that cancel message is delivered later, the intake finds the run cancelled at its
        start and records nothing more.
        """
        names = self.names
        forms = [names.cancel(run_id), names.cancel(run_id, "*")]
        # Every start delivered with messages behind it pays this look, usually for nothing:
        # one request says whether either form holds anything before the two are scanned.
        if not await self.broker.direct_get_last_of(self.names.inbox_stream, forms):
            return None
        found = await asyncio.gather(*(self._first_stored_cancel(f, run_id) for f in forms))
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
        intake would refuse it (the checks of ``Intake.handle`` and ``Intake._cancel``, in their
        order)."""
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
            body = cancel_body(m.data)
        except Rejected:
            return None
        return cancel_requested(body, inbox.sender, self.clock.now())

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


async def dismiss(look: Awaitable[QueuedCancel | None] | None) -> None:
    """Cancel a look whose answer is no longer wanted, and let it end (whatever it raised)."""
    if look is None:
        return
    await cancel_and_wait(asyncio.ensure_future(look))  # bounded: a cancel can be swallowed


def _derived_run_id(agent: str, inbox_seq: int, stored_at: str) -> str:
    """A run id that is the same on every redelivery of the same inbox message."""
    digest = hashlib.blake2b(f"{agent}:{inbox_seq}:{stored_at}".encode(), digest_size=10)
    return f"r{digest.hexdigest()}"


def started_by(history: list[Decision]) -> str | None:
    """The agent a history's first event starts the run for; ``None`` when that event is not
    a ``RunStarted`` naming one (the intake writes nothing else first)."""
    first = history[0].events[0] if history and history[0].events else None
    if not isinstance(first, RunStarted):
        return None
    try:
        return validate_token(first.agent, "agent")
    except InvalidName:
        return None
