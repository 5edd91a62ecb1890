"""Continue-as-new: a run that ends by starting the next run of its chain, history reset.

``ctx.continue_as_new(input)`` raises ``ContinueAsNew``; the activation then (``start_next``)
appends the next run's ``RunStarted`` itself, create-only, under an id derived from the
chain's first run and the next generation (``chain_run_id``), wakes it, and only then records
its own end, ``RunCompleted(continued_as=<next>)``. A crash in between replays the run to
the same call, finds the next run already created by this one (its ``previous_run_id``) and
records the end: the next run is started once. Ids of the form ``<run>-g<n>`` are reserved
(``CHAIN_RUN_ID``): no trigger may take the next run's id first.

The next run inherits what the old one started with: every field of its ``RunStarted``
(agent, parent, budget and limits, whatever a newer version adds) except the ones that say
which run this is, its input and the trigger; and the signals it holds that no wait consumed
(buffered in the same first decision, with their ids, so none is lost or counted twice).
A signal that reaches the old run after that (in the moment before its end is stored) is
passed on after the end, once; a cancel likewise.

Readers follow the chain (``current_run``): the old run's last event names the next; a long
chain is crossed by probing the derived ids of later generations (exponentially, then by
bisection), so finding the current run of a chain of n runs from its first id costs about
2 log2(n) direct gets, whatever n.
"""

from __future__ import annotations

import hashlib
import time

import msgspec

from sojourn.broker.connection import Broker
from sojourn.broker.delivery import StoredMessage
from sojourn.broker.eventstore import EventStore
from sojourn.broker.headers import MSG_ID, SIGNAL_ID
from sojourn.broker.names import Names
from sojourn.broker.wake import publish_wake
from sojourn.schemas.codec import decode_events, encode
from sojourn.schemas.errors import ConcurrencyConflict, HistoryError, InvalidName, SojournError
from sojourn.schemas.events import (
    Carried,
    RunCompleted,
    RunEvent,
    RunStarted,
    SignalReceived,
    TriggerInfo,
)
from sojourn.schemas.names import RESERVED_SIGNAL_PREFIX, validate_token
from sojourn.schemas.wire import CancelBody

from ..core.state import RunState
from .values import Values

__all__ = [
    "ChainTaken",
    "ContinueAsNew",
    "chain_run_id",
    "continued_as",
    "current_run",
    "pass_on",
    "start_next",
]

WALK = 3
"""Runs followed one by one before the later generations are probed instead."""

PROBES_MAX = 200
"""Direct gets one search for a chain's current run may make: a bound on what a hostile or
broken history can cost (2 log2 of any real chain's length is far below)."""


class ContinueAsNew(BaseException):
    """Unwinds agent code at ``ctx.continue_as_new``: the activation ends the run and starts
    the next one with ``input``. A ``BaseException``, so ``except Exception`` cannot keep the
    run going after it asked to continue as new."""

    def __init__(self, input: msgspec.Raw) -> None:
        super().__init__("continue as new")
        self.input = input


class ChainTaken(SojournError):
    """The id of the chain's next run is held by a run this chain did not start (a run
    created before the ``<run>-g<n>`` form was reserved)."""


def chain_run_id(root: str, generation: int) -> str:
    """The id of generation ``generation`` (2, 3, ...) of the chain whose first run is
    ``root``: ``<root>-g<n>``, hashed to stay within 128 characters (like a child's id)."""
    plain = f"{root}-g{generation}"
    if len(plain) <= 128:
        return plain
    digest = hashlib.blake2b(root.encode(), digest_size=12).hexdigest()
    return f"{root[:80]}-h{digest}-g{generation}"


def continued_as(events: list[RunEvent] | tuple[RunEvent, ...]) -> str | None:
    """The run a decision says its run continued as, if it holds such an end."""
    for e in events:
        if isinstance(e, RunCompleted) and e.continued_as is not None:
            return e.continued_as
    return None


def _next_in(m: StoredMessage) -> str | None:
    """The next run named by a run's last message (validated: it becomes a subject)."""
    try:
        nxt = continued_as(decode_events(m.data))
    except msgspec.MsgspecError:
        return None
    if nxt is None:
        return None
    try:
        return validate_token(nxt, "run_id")
    except InvalidName:
        return None


async def current_run(
    broker: Broker, names: Names, run_id: str
) -> tuple[str, StoredMessage | None]:
    """The run of ``run_id``'s chain that has not continued (``run_id`` itself for a run
    that did not), and its last message (``None``: no such run).

    Raises:
        HistoryError: the chain could not be followed within ``PROBES_MAX`` reads.
    """
    stream = names.events_stream
    reads = 0

    async def last_of(rid: str) -> StoredMessage | None:
        nonlocal reads
        reads += 1
        if reads > PROBES_MAX:
            raise HistoryError(f"run {run_id}: its chain could not be followed", run_id=run_id)
        return await broker.direct_get_last(stream, names.events(rid))

    rid = run_id
    last = await last_of(rid)
    walked = 0
    while last is not None:
        nxt = _next_in(last)
        if nxt is None:
            return rid, last
        if walked < WALK:
            rid, walked = nxt, walked + 1
            last = await last_of(rid)
            continue
        # A long chain: its later runs have derived ids; find the latest one that exists.
        first = await broker.direct_get_next(stream, names.events(nxt), 1)
        reads += 1
        started = _started_in(first)
        if started is None or started.chain_root is None:
            rid, walked = nxt, 0  # not a chain run after all: follow it one by one
            last = await last_of(rid)
            continue
        root, low = started.chain_root, started.generation
        step = 1
        high = None
        while high is None:
            probe = await last_of(chain_run_id(root, low + step))
            if probe is None:
                high = low + step
            else:
                low += step
                step *= 2
        while high - low > 1:
            mid = (low + high) // 2
            if await last_of(chain_run_id(root, mid)) is None:
                high = mid
            else:
                low = mid
        rid, walked = chain_run_id(root, low), 0
        last = await last_of(rid)
    return rid, None


def _started_in(m: StoredMessage | None) -> RunStarted | None:
    if m is None:
        return None
    try:
        events = decode_events(m.data)
    except msgspec.MsgspecError:
        return None
    return events[0] if events and isinstance(events[0], RunStarted) else None


async def start_next(
    *,
    store: EventStore,
    values: Values,
    run_id: str,
    agent: str,
    code_version: str | None,
    state: RunState,
    consumed: set[str],
    input: msgspec.Raw,
    writer: str,
    carried: Carried | None = None,
) -> str:
    """Create the next run of ``run_id``'s chain (once: a repeat finds it created) and wake
    it; returns its id.

    Raises:
        ChainTaken: the next run's id is held by a run this chain did not start.
        HistoryError: the run's history does not start with ``RunStarted``.
    """
    first = await store.first(run_id)
    started = first.events[0] if first is not None and first.events else None
    if not isinstance(started, RunStarted):
        raise HistoryError(f"run {run_id}: its history does not start with run.started.v1")
    root = started.chain_root or run_id
    generation = started.generation + 1
    nxt = chain_run_id(root, generation)
    now = time.time()
    new = msgspec.structs.replace(
        started,
        run_id=nxt,
        input=input,
        input_ref=None,
        code_version=code_version,
        trigger=TriggerInfo(msg_id=f"continue:{run_id}", received_at=now),
        previous_run_id=run_id,
        chain_root=root,
        generation=generation,
        carried=carried,
        # the chain keeps its concurrency slot (decision 0048): the next run is never queued
        concurrency=None
        if started.concurrency is None
        else msgspec.structs.replace(started.concurrency, ticket=0),
        at=now,
    )
    passed: list[RunEvent] = [
        SignalReceived(
            name=r.name,
            payload=r.payload,
            signal_id=r.signal_id,
            sent_by=r.sent_by,
            sender_verified=r.sender_verified,
            at=r.at,
        )
        for r in state.signals
        if r.signal_id not in consumed and not r.name.startswith(RESERVED_SIGNAL_PREFIX)
    ]
    events = await values.externalize([new, *passed])
    try:
        await store.append(nxt, events, expected_seq=0, writer=writer, msg_id=f"{nxt}:continue")
    except ConcurrencyConflict:
        there = await store.first(nxt)
        head = there.events[0] if there is not None and there.events else None
        if not (isinstance(head, RunStarted) and head.previous_run_id == run_id):
            raise ChainTaken(
                f"run {run_id} cannot continue as new: the id {nxt!r} of its chain's next run "
                "is held by another run",
                run_id=run_id,
            ) from None
    await publish_wake(store.broker, store.names, nxt, "start", agent=agent)
    return nxt


async def pass_on(
    store: EventStore, state: RunState, consumed: set[str], nxt: str, sender: str
) -> None:
    """After a continued run's end: pass what reached it too late for the next run's start
    (signals no wait took and that were not carried, a cancel) on to the chain. Idempotent
    (the intake counts a signal id once per run; cancels carry a fixed Msg-Id)."""
    broker, names = store.broker, store.names
    if state.cancel_requested is not None:
        await broker.publish(
            names.cancel(nxt, sender),
            encode(CancelBody(reason=state.cancel_requested, terminate=state.terminate_requested)),
            {MSG_ID: f"chain-cancel:{nxt}"},
        )
    user = [
        s
        for s in state.signals
        if s.signal_id not in consumed and not s.name.startswith(RESERVED_SIGNAL_PREFIX)
    ]
    if not user:
        return
    there = await store.first(nxt)
    carried = {
        e.signal_id for e in (there.events if there else ()) if isinstance(e, SignalReceived)
    }
    for s in user:
        if s.signal_id in carried:
            continue
        headers = {SIGNAL_ID: s.signal_id, MSG_ID: f"chain-signal:{nxt}:{s.signal_id}"[:256]}
        await broker.publish(names.signal(nxt, s.name, sender), bytes(s.payload), headers)
