"""Concurrency keys in the worker (decision 0048): admission at the start, the queue, and the
release at the end.

A start under a key (``StartTrigger.concurrency``, or the agent's ``Concurrency``) either
takes a slot at once (the key's slots record names its run, written by compare-and-set
**before** the run is created, as a singleton's record is) or is **queued**: an entry on the
key's queue subject (create-only, its stream sequence the run's ticket), then the run created
with ``RunStarted.concurrency.ticket``, which folds to ``pending`` waiting on ``queue:<key>``:
no worker, task or slot holds it. Every writer of the key then **pumps** it: while the oldest
entry's run is still queued and a slot is free, take the slot for it (compare-and-set), record
``RunAdmitted`` (fenced), wake it and remove the entry. The intake pumps after it queues a
run; an ended run's side jobs (redone until its wake is acked) release its slot and pump.
Because each writes first and then looks (the queue entry before reading the slots; the
release before reading the queue), one of two racing parties always sees the other: a slot
never stays free while a run is queued.

Whatever crashes, the records are enough to finish: a slot taken for a run not created yet
belongs to a start still in the inbox (redelivered, it finds its slot and creates the run); a
queue entry whose run does not exist and whose start is gone is dropped; a slot taken for a
queued run not yet admitted is found by the next pump (the queueing start's or the ended
run's redelivery); a holder whose run ended (or never came) is reclaimed once the key is full.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import msgspec

from sojourn.broker.concurrency import ConcurrencyStore
from sojourn.broker.delivery import Delivery
from sojourn.broker.eventstore import EventStore
from sojourn.broker.names import InboxSubject
from sojourn.broker.wake import publish_wake
from sojourn.schemas.codec import decode_events
from sojourn.schemas.concurrency import (
    QueueEntry,
    SlotHolder,
    SlotsRecord,
    concurrency_fault,
    key_token,
    with_holder,
    without_holder,
)
from sojourn.schemas.errors import ConcurrencyConflict, HistoryError, InvalidName
from sojourn.schemas.events import ConcurrencyInfo, RunAdmitted
from sojourn.schemas.flow import key_fault
from sojourn.schemas.lifecycle import TERMINAL_EVENTS
from sojourn.schemas.names import validate_token
from sojourn.schemas.wire import StartTrigger

from ..agents.agent import Agent
from ..core.state import RunState
from ..history.chain import current_run
from ..history.snapshots import current as current_snapshot
from ..ops import metrics
from .faults import fault
from .opening import Opening
from .refusals import Rejected
from .singletons import check_input, served
from .starts import Created, Starts, _derived_run_id

__all__ = ["CAS_TRIES", "PUMP_MAX", "REAP_AFTER", "KeySlots", "limited", "limited_start"]

log = logging.getLogger("sojourn.concurrency")

CAS_TRIES = 50
"""Compare-and-set attempts on one key's slots record before giving up (the message is
handed back, or the side job raises and is redone)."""

PUMP_MAX = 1000
"""Queued runs one pump admits at most (a key whose limit rose a lot: the next pump goes on)."""

REAP_AFTER = 5.0
"""A holder is looked at (did its run end, or never come?) only once it held its slot this
long, and at most this often by one worker, and only when its key is full."""

REAP_PER_LOOK = 8
"""Holders one full key's look checks at most."""

Took = Literal["taken", "held", "full"]
"""What an attempt to take a slot found: it took one, the run held one already, none free."""


def limited(agent: Agent[object, object] | None, trigger: StartTrigger) -> bool:
    """Whether a start goes through its key's admission: it names a concurrency, or its agent
    (served here) declares one."""
    return trigger.concurrency is not None or (agent is not None and agent.concurrency is not None)


async def limited_start(
    starts: Starts, msg: Delivery, inbox: InboxSubject, trigger: StartTrigger
) -> Created | Opening | None:
    """A start (or a child's spawn) under a concurrency key: checked, then admitted at once
    or queued. ``None``: handed back (another worker serves the agent, or the key's record
    kept changing).

    Raises:
        Rejected: ``invalid_concurrency`` (a bad key or limit, a key the agent's function
            could not make, a start naming one for an agent that declares its own),
            ``invalid_input``, ``invalid_run_id``, ``unknown_agent``.
    """
    agent_name = inbox.target
    agent = await served(starts, msg, agent_name)
    if agent is None:
        return None
    body = trigger.concurrency
    declared = agent.concurrency
    if body is not None:
        if declared is not None:
            raise Rejected(
                "invalid_concurrency",
                f"agent '{agent_name}' declares its concurrency key: a start names none",
            )
        why = concurrency_fault(body)
        if why is not None:
            raise Rejected("invalid_concurrency", why)
        check_input(agent, bytes(trigger.input))
        key, limit = body.key, body.limit
    else:
        assert declared is not None
        try:
            value = agent.decode_input(bytes(trigger.input))
        except msgspec.MsgspecError as e:
            raise Rejected(
                "invalid_input", f"input does not match agent '{agent_name}': {e}"
            ) from e
        try:
            made = declared.key(value)
        except Exception as e:  # the agent's own function: whatever it raises refuses the start
            raise Rejected(
                "invalid_concurrency",
                f"agent '{agent_name}''s concurrency key raised {type(e).__name__}: {e}"[:500],
            ) from e
        if made is None:  # this run is not limited
            return await starts.create(msg, agent_name, trigger, sender=inbox.sender)
        why = key_fault(made)
        if why is not None:
            raise Rejected("invalid_concurrency", f"agent '{agent_name}''s concurrency key: {why}")
        key, limit = made, declared.limit
    run_id = trigger.run_id or _derived_run_id(
        agent_name, msg.stream_seq, msg.timestamp.isoformat()
    )
    try:
        validate_token(run_id, "run_id")
    except InvalidName as e:
        raise Rejected("invalid_run_id", e.message) from e
    trigger = msgspec.structs.replace(trigger, run_id=run_id, concurrency=None)
    slots = KeySlots(starts.store, starts.writer, starts.clock.now)
    return await slots.start(starts, msg, inbox, trigger, key, limit)


@dataclass(frozen=True, slots=True)
class _KeyedStart:
    """A start under a concurrency key, as its delivery brought it: ``trigger`` names its run
    (``run_id`` set), ``key`` and ``limit`` its key and the key's slots."""

    starts: Starts
    msg: Delivery
    inbox: InboxSubject
    trigger: StartTrigger
    key: str
    limit: int

    @property
    def agent(self) -> str:
        return self.inbox.target

    @property
    def run_id(self) -> str:
        assert self.trigger.run_id is not None
        return self.trigger.run_id

    async def create(
        self, concurrency: ConcurrencyInfo | None = None, *, stored: bool = False
    ) -> Created | Opening | None:
        """Create the run (``concurrency``: the slot or the queue place it holds; ``stored``:
        never opened in memory), as ``Starts.create`` does."""
        return await self.starts.create(
            self.msg,
            self.agent,
            self.trigger,
            sender=self.inbox.sender,
            stored=stored,
            concurrency=concurrency,
        )


class KeySlots:
    """Concurrency keys' slots and queues, as one worker's intake and activations use them."""

    def __init__(self, store: EventStore, writer: str, now: Callable[[], float]) -> None:
        self.events = store
        self.broker = store.broker
        self.names = store.names
        self.writer = writer
        self.now = now
        self.store = ConcurrencyStore(store.broker, store.names)

    # --- the start ----------------------------------------------------------------------------

    async def start(
        self,
        starts: Starts,
        msg: Delivery,
        inbox: InboxSubject,
        trigger: StartTrigger,
        key: str,
        limit: int,
    ) -> Created | Opening | None:
        """Admit the start ``msg`` brought (``trigger``, its run id set) under ``key``'s
        ``limit`` slots, or queue it; ``None``: handed back (the key's record kept changing)."""
        start = _KeyedStart(starts, msg, inbox, trigger, key, limit)
        agent, run_id = start.agent, start.run_id
        token = key_token(key)
        if msg.num_delivered > 1:  # a redelivery: go on from what an earlier delivery did
            ticket = await self.store.entry(agent, token, run_id)
            if ticket:
                return await self._queued(start, ticket)
            rec, _ = await self.store.slots(agent, token)
            if rec is not None and rec.holds(run_id):
                return await self._admitted(start, False)
            if await self.events.first(run_id) is not None:  # answered as an existing run
                return await start.create()
        _, head, _ = await self.store.head(agent, token)
        if head == 0:  # nobody queued: a start never passes a queued run
            took = await self._take(agent, token, key, run_id, limit, msg.stream_seq)
            if took is None:
                await msg.nak(delay=0.5)
                return None
            if took != "full":
                return await self._admitted(start, took == "taken")
        if await self.events.first(run_id) is not None:
            # the run exists (the id started before): one run, answered as such, and nothing
            # queued for it (it holds its slot, or its place, or it ended)
            return await start.create()
        entry = QueueEntry(
            agent=agent,
            key=key,
            run_id=run_id,
            limit=limit,
            inbox_seq=msg.stream_seq,
            at=self.now(),
        )
        ticket = await self.store.enqueue(token, entry)
        metrics.CONCURRENCY_QUEUED.labels(metrics.agent_label(agent)).inc()
        return await self._queued(start, ticket)

    async def _admitted(self, start: _KeyedStart, added: bool) -> Created | Opening | None:
        """Create a run that holds its slot (``added``: taken by this delivery)."""
        agent, run_id = start.agent, start.run_id
        fault("concurrency_slot_taken", run_id)
        token = key_token(start.key)
        try:
            created = await start.create(ConcurrencyInfo(key=start.key, limit=start.limit))
        except Rejected:
            if added:  # refused after all (its attributes, its parent): the slot goes back
                await self.give_back(agent, token, run_id, how="refused")
                await self.pump(agent, token)
            raise
        if added:
            metrics.CONCURRENCY_ADMITTED.labels(metrics.agent_label(agent), "start").inc()
        if added and created is not None and not isinstance(created, Opening):
            if not created[0].created:  # the id was another run's: the slot was not its to take
                await self.give_back(agent, token, run_id, how="refused")
                await self.pump(agent, token)
        return created

    async def _queued(self, start: _KeyedStart, ticket: int) -> Created | None:
        """Create a queued run (its entry is in the queue at ``ticket``), then pump its key:
        a slot may have freed meanwhile. Answered at once; nothing is woken."""
        agent, run_id = start.agent, start.run_id
        fault("concurrency_queued", run_id)
        token = key_token(start.key)
        info = ConcurrencyInfo(key=start.key, limit=start.limit, ticket=ticket)
        try:
            created = await start.create(info, stored=True)
        except Rejected:  # refused after all: it leaves the queue
            await self.store.dequeue(agent, token, run_id)
            await self.pump(agent, token)
            raise
        if created is None:
            return None
        assert not isinstance(created, Opening)
        await self.pump(agent, token)
        return created[0], None, False

    # --- slots --------------------------------------------------------------------------------

    async def _take(
        self, agent: str, token: str, key: str, run_id: str, limit: int, inbox_seq: int
    ) -> Took | None:
        """Take a slot of the key for ``run_id`` (``taken``), find it holds one already
        (``held``), or find them all taken (``full``); ``None``: the record kept changing."""
        for _ in range(CAS_TRIES):
            rec, seq = await self.store.slots(agent, token)
            if rec is None or (rec.agent, rec.key) != (agent, key):
                rec = SlotsRecord(agent=agent, key=key, limit=limit)  # none, or not the key's
            if rec.holds(run_id):
                return "held"
            if len(rec.holders) >= limit:
                if await self._reap(rec, token, seq):
                    continue
                return "full"
            now = self.now()
            new = with_holder(rec, SlotHolder(run_id, inbox_seq, now), limit, now)
            try:
                await self.store.put_slots(token, new, seq)
            except ConcurrencyConflict:
                continue
            return "taken"
        return None

    async def give_back(self, agent: str, token: str, holder: str, how: str = "ended") -> bool:
        """Release every slot ``holder`` holds of the key (``False``: it held none).

        Raises:
            ConcurrencyConflict: the record kept changing (the caller's message is redone).
        """
        for _ in range(CAS_TRIES):
            rec, seq = await self.store.slots(agent, token)
            if rec is None or not rec.holds(holder):
                return False
            try:
                await self.store.put_slots(token, without_holder(rec, holder, self.now()), seq)
            except ConcurrencyConflict:
                continue
            metrics.CONCURRENCY_RELEASED.labels(metrics.agent_label(agent), how).inc()
            return True
        raise ConcurrencyConflict(
            f"the slots of {agent}/{token} kept changing", run_id=holder, expected=0
        )

    async def release(self, s: RunState) -> None:
        """An ended run's side job: give its slot back (a chain that continues keeps it), leave
        the queue (a run cancelled while queued) and admit the next queued runs. Idempotent."""
        c = s.concurrency
        if c is None or not s.terminal or s.continued_as is not None:
            return
        token = key_token(c.key)
        if c.ticket:
            await self.store.dequeue(s.agent, token, s.run_id)
        await self.give_back(s.agent, token, s.chain_root or s.run_id)
        await self.pump(s.agent, token)

    # --- the queue ----------------------------------------------------------------------------

    async def pump(self, agent: str, token: str) -> None:
        """Admit the key's oldest queued runs while slots are free."""
        for _ in range(PUMP_MAX):
            entry, seq, subject = await self.store.head(agent, token)
            if seq == 0:
                break
            if entry is None or entry.agent != agent or key_token(entry.key) != token:
                await self.store.drop(subject)  # not a worker's: removed
                continue
            snap = await current_snapshot(self.events, entry.run_id)
            if snap is None:
                if await self._start_pending(entry.inbox_seq):
                    break  # its start creates it, and pumps then
                await self.store.dequeue(agent, token, entry.run_id)
                continue
            st = snap.state
            c = st.concurrency
            if (
                not st.queued
                or c is None
                or c.key != entry.key
                or c.ticket != seq
                or st.cancel_requested is not None
            ):
                # admitted, ended, asked to cancel (its end leaves the queue too), or another
                # run's id: not to be admitted from here
                await self.store.dequeue(agent, token, entry.run_id)
                continue
            took = await self._take(agent, token, entry.key, entry.run_id, entry.limit, 0)
            if took is None:
                raise ConcurrencyConflict(
                    f"the slots of {agent}/{token} kept changing", run_id=entry.run_id, expected=0
                )
            if took == "full":
                break
            fault("concurrency_admitted", entry.run_id)
            try:
                await self.events.append(
                    entry.run_id,
                    [RunAdmitted(key=entry.key, ticket=seq, at=self.now())],
                    expected_seq=snap.seq,
                    writer=self.writer,
                    msg_id=f"{entry.run_id}:admitted:{seq}",
                )
            except ConcurrencyConflict:
                continue  # a signal or a cancel came in: look again (the slot is its)
            await publish_wake(
                self.broker,
                self.names,
                entry.run_id,
                "start",
                agent=agent,
                priority=st.priority,
                fairness=st.fairness,
            )
            await self.store.dequeue(agent, token, entry.run_id)
            if took == "taken":  # counted by the pump whose write gave it the slot: once
                label = metrics.agent_label(agent)
                metrics.CONCURRENCY_ADMITTED.labels(label, "queue").inc()
                wait = max(0.0, self.now() - entry.at)
                metrics.CONCURRENCY_QUEUE_WAIT.labels(label).observe(wait)

    async def _start_pending(self, inbox_seq: int) -> bool:
        """Whether the start at ``inbox_seq`` is still in the inbox (a work queue: removed
        once acknowledged), so that the run it names may still be created."""
        if inbox_seq <= 0:
            return False
        stored = await self.broker.direct_get_next(
            self.names.inbox_stream, f"{self.names.prefix}.>", inbox_seq
        )
        return stored is not None and stored.seq == inbox_seq

    async def _reap(self, rec: SlotsRecord, token: str, seq: int) -> bool:
        """Reclaim the slots of holders whose runs ended (their release was lost) or never
        came (their start is gone), among the oldest not looked at lately; whether any was."""
        now = self.now()
        looked = 0
        reaped = False
        for holder in sorted(rec.holders, key=lambda h: h.since):
            if looked >= REAP_PER_LOOK or now - holder.since < REAP_AFTER:
                break
            if not _checked.due(rec.agent, token, holder.run_id):
                continue
            looked += 1
            if await self._dead(holder):
                log.warning(
                    "run %s held a slot of key %r of %s and is over: reclaimed",
                    holder.run_id,
                    rec.key[:64],
                    rec.agent,
                )
                await self.give_back(rec.agent, token, holder.run_id, how="reaped")
                reaped = True
        return reaped

    async def _dead(self, holder: SlotHolder) -> bool:
        """Whether a holder's run (its chain's current run) ended, or never will exist."""
        try:
            _, last = await current_run(self.broker, self.names, holder.run_id)
        except HistoryError:
            return False  # a chain too long to follow now is not an ended one
        if last is None:
            return not await self._start_pending(holder.inbox_seq)
        try:
            events = decode_events(last.data)
        except msgspec.MsgspecError:
            return False  # a poison history: wedged, not ended (an operator looks)
        return bool(events) and isinstance(events[-1], TERMINAL_EVENTS)


class _Checked:
    """When this process last looked at each holder (bounded: the oldest forgotten)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self.at: OrderedDict[tuple[str, str, str], float] = OrderedDict()

    def due(self, agent: str, token: str, run_id: str) -> bool:
        now = time.monotonic()
        k = (agent, token, run_id)
        last = self.at.get(k)
        if last is not None and now - last < REAP_AFTER:
            return False
        self.at[k] = now
        self.at.move_to_end(k)
        while len(self.at) > self.size:
            self.at.popitem(last=False)
        return True


_checked = _Checked()
