"""Creating a fork (decision 0041): a start whose body says ``fork``, made by the intake.

A client asks for a fork the way it asks for a start, on ``<prefix>[.as.<sender>].start.<agent>
.<run_id>`` with ``StartTrigger.fork``: the same subject, the same permission, the same
answer. The worker's intake (the only writer of histories) reads the old run's history, cuts
it where the fork re-executes (``core/fork.py``) and stores the fork's first decision,
create-only under the trigger's Msg-Id: its ``RunStarted`` (``forked_from``) and the copied
events in one message, so a fork exists whole or not at all. A redelivered trigger finds the
fork it created (``RunStarted.trigger.inbox_seq``); the same run id asked for by another
trigger is that run, as for a start. The old run is only read: forking a live run leaves it
running.

Value references in the copied events stay as they are: pieces are content-addressed and kept
forever (decision 0023), so both runs read the same ones.
"""

from __future__ import annotations

import msgspec

from sojourn.broker import headers as h
from sojourn.broker.delivery import Delivery
from sojourn.broker.eventstore import Decision
from sojourn.schemas.codec import encode_events
from sojourn.schemas.errors import ConcurrencyConflict, InvalidName, PayloadTooLarge
from sojourn.schemas.events import ForkOrigin, RunEvent, RunStarted, SignalReceived, TriggerInfo
from sojourn.schemas.names import RESERVED_SIGNAL_PREFIX, validate_signal_name, validate_token
from sojourn.schemas.tracing import trace_context
from sojourn.schemas.wire import ForkBody, IntakeOk, StartTrigger

from ..core.fork import ForkRefused, plan_fork
from .faults import fault
from .refusals import Rejected
from .starts import Created, Starts

__all__ = ["create_fork", "fork_signal_id"]


def fork_signal_id(run_id: str) -> str:
    """The id of the signal a fork starts with (``ForkBody.signal``)."""
    return f"fork:{run_id}"


async def create_fork(
    starts: Starts,
    msg: Delivery,
    agent_name: str,
    trigger: StartTrigger,
    sender: str | None,
) -> Created | None:
    """Create the fork ``trigger`` asks for (``None``: handed back for a worker serving the
    agent).

    Raises:
        Rejected: the fork cannot be made (``invalid_fork``, ``unknown_run``,
            ``invalid_input``, ``invalid_run_id``, ``payload_too_large``...).
    """
    fork = trigger.fork
    assert fork is not None
    agent = starts.agents.get(agent_name)
    if agent is None:
        if await starts.registry.is_known(agent_name):
            await starts.hand_back(msg, agent_name)
            return None
        raise Rejected("unknown_agent", f"no worker serves an agent named '{agent_name}'")
    if trigger.run_id is None:
        raise Rejected("invalid_run_id", "a fork names its run id")
    if trigger.budget is not None or trigger.attributes or trigger.parent_run_id:
        raise Rejected(
            "invalid_trigger", "a fork inherits its budget and attributes, and has no parent"
        )
    try:
        old = validate_token(fork.run_id, "run_id")
    except InvalidName as e:
        raise Rejected("invalid_run_id", e.message) from e
    if old == trigger.run_id:
        raise Rejected("invalid_fork", "a fork is a new run: it needs a run id of its own")
    history = await starts.store.load(old)
    try:
        plan = plan_fork(
            old,
            [e for d in history for e in d.events],
            from_step=fork.from_step,
            from_failure=fork.from_failure,
        )
    except ForkRefused as r:
        raise Rejected(r.code, r.message) from r
    if plan.started.agent != agent_name:
        raise Rejected(
            "invalid_fork",
            f"run '{old}' is a run of agent '{plan.started.agent}', not of '{agent_name}'",
        )
    now = starts.clock.now()
    started = _fork_started(starts, msg, trigger, fork, plan.started, sender, now)
    if fork.new_input:
        try:
            agent.decode_input(bytes(trigger.input))
        except msgspec.MsgspecError as e:
            raise Rejected(
                "invalid_input", f"input does not match agent '{agent_name}': {e}"
            ) from e
    elif bytes(trigger.input).strip() != b"null":
        raise Rejected("invalid_trigger", "a fork that keeps the old input sends input null")
    started = msgspec.structs.replace(
        started,
        code_version=agent.version,
        forked_from=ForkOrigin(run_id=old, position=plan.position, copied=len(plan.copied)),
    )
    events: list[RunEvent] = [started, *plan.copied]
    if fork.signal is not None:
        events.append(_extra_signal(fork, started.run_id, sender, starts, now))
    return await _store(starts, started, events, msg.stream_seq)


def _fork_started(
    starts: Starts,
    msg: Delivery,
    trigger: StartTrigger,
    fork: ForkBody,
    old: RunStarted,
    sender: str | None,
    now: float,
) -> RunStarted:
    """The fork's ``RunStarted``: the old one's (agent, budget, what its chain used, its
    schedule and attributes), with the fork's own id, trigger, trace and input, outside any
    chain and without a parent (a fork's end notifies nobody)."""
    assert trigger.run_id is not None
    tp, ts = trace_context(msg.header(h.TRACEPARENT), msg.header(h.TRACESTATE))
    new_input = fork.new_input
    return msgspec.structs.replace(
        old,
        run_id=trigger.run_id,
        input=trigger.input if new_input else old.input,
        input_ref=None if new_input else old.input_ref,
        trigger=TriggerInfo(
            inbox_seq=msg.stream_seq,
            msg_id=msg.header(h.MSG_ID) or None,
            received_at=now,
            sent_by=sender,
        ),
        parent_run_id=None,
        previous_run_id=None,
        chain_root=None,
        generation=1,
        traceparent=tp,
        tracestate=ts,
        concurrency=None,  # a fork counts against no concurrency key (decision 0048)
        at=now,
    )


def _extra_signal(
    fork: ForkBody, run_id: str, sender: str | None, starts: Starts, now: float
) -> SignalReceived:
    """The signal the fork starts with, after the copied events."""
    assert fork.signal is not None
    try:
        name = validate_signal_name(fork.signal.name)
    except InvalidName as e:
        raise Rejected("invalid_trigger", e.message) from e
    if name.startswith(RESERVED_SIGNAL_PREFIX):
        raise Rejected(
            "forbidden", f"signal names starting with {RESERVED_SIGNAL_PREFIX!r} are reserved"
        )
    return SignalReceived(
        name=name,
        payload=fork.signal.payload,
        signal_id=fork_signal_id(run_id),
        sent_by=sender,
        sender_verified=starts.broker.user is not None and sender is not None,
        at=now,
    )


async def _store(
    starts: Starts, started: RunStarted, events: list[RunEvent], inbox_seq: int
) -> Created:
    """Store the fork's first decision, create-only; a fork that exists is this trigger's
    (a redelivery) or another's (``created`` false), as for a start."""
    run_id = started.run_id
    msg_id = f"{run_id}:start:{inbox_seq}"
    size = len(encode_events(events))
    if size > starts.store.max_decision:
        raise Rejected(
            "payload_too_large",
            f"the fork's copied history is {size} bytes; one message holds "
            f"{starts.store.max_decision}: fork from an earlier position",
        )
    try:
        seq, earlier = await starts.store.append_once(
            run_id, events, expected_seq=0, writer=starts.writer, msg_id=msg_id
        )
    except ConcurrencyConflict:
        return await starts.existing(started)
    except PayloadTooLarge as e:
        raise Rejected("payload_too_large", e.message) from e
    if earlier:
        return IntakeOk(run_id=run_id, created=True), None, True
    fault("forked")
    history = [Decision(seq=seq, events=tuple(events), writer=starts.writer, msg_id=msg_id)]
    return IntakeOk(run_id=run_id, created=True), history, True
