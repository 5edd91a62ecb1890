"""Keyed starts in the intake (decision 0047): which path a start with a key takes, and
singleton starts.

A start naming ``singleton_key`` K starts a run only if no run started with K (for its agent)
is live; otherwise it attaches: the answer names the live run (``attached``). The key's record
(``broker/flow.py``) names its run; it is written by compare-and-set **before** the run is
created, so of two starts racing (on any workers) exactly one writes it, and the other reads
it and attaches. Whatever crashes in between, the record is enough to finish or undo:

- the record names a run that exists: live unless its chain's current run's last event is an
  end (a suspended run is live); an ended one is replaced by the next start's;
- it names a run that does not exist yet, and the start that wrote it is still in the inbox
  (not acknowledged: being created, or to be redelivered after its worker died): attach, the
  redelivery creates it (it finds the record naming its own run, and goes on);
- it names a run that does not exist and its start is gone (refused after the record was
  written): the record is dead, and the next start replaces it.
"""

from __future__ import annotations

import logging

import msgspec

from sojourn.broker.delivery import Delivery
from sojourn.broker.flow import FlowStore
from sojourn.broker.names import InboxSubject
from sojourn.schemas.attributes import InvalidAttributes, validate_attributes
from sojourn.schemas.errors import ConcurrencyConflict, InvalidName
from sojourn.schemas.flow import SingletonRecord, key_fault, key_token
from sojourn.schemas.names import validate_token
from sojourn.schemas.wire import IntakeOk, StartTrigger

from ..agents.agent import Agent
from ..history.keyed import singleton_run
from ..ops import metrics
from .faults import fault
from .opening import Opening
from .refusals import Rejected
from .starts import Created, Starts, _derived_run_id

__all__ = ["CAS_TRIES", "Singletons", "keyed_start", "served"]

log = logging.getLogger("sojourn.flow")

CAS_TRIES = 20
"""Compare-and-set attempts on one key's record before the start is handed back (0.5 s)."""


async def keyed_start(
    starts: Starts, msg: Delivery, inbox: InboxSubject, trigger: StartTrigger
) -> Created | Opening | None:
    """A start with a singleton key or a debounce: checked, then taken to its path.

    Raises:
        Rejected: ``invalid_trigger`` (not a plain start, or both at once), ``invalid_key``,
            ``invalid_debounce``, and whatever a start is refused.
    """
    if inbox.kind != "start" or trigger.fork is not None:
        raise Rejected(
            "invalid_trigger", "only a plain start may have a singleton key or be debounced"
        )
    if trigger.singleton_key is not None and trigger.debounce is not None:
        raise Rejected("invalid_trigger", "a start has a singleton_key or a debounce, not both")
    if trigger.debounce is not None:
        from .debounce import Debounces, check_debounce  # it builds on this module

        check_debounce(trigger)
        return await Debounces(starts).trigger(msg, inbox, trigger)
    why = key_fault(trigger.singleton_key)
    if why is not None:
        raise Rejected("invalid_key", f"singleton_key: {why}")
    return await Singletons(starts).start(msg, inbox, trigger)


async def served(starts: Starts, msg: Delivery, agent_name: str) -> Agent[object, object] | None:
    """The agent, if this worker serves it; ``None`` after handing ``msg`` back for a worker
    that does (as ``Starts`` does with any start), before anything is written.

    Raises:
        Rejected: ``unknown_agent``.
    """
    agent = starts.agents.get(agent_name)
    if agent is not None:
        return agent
    if await starts.registry.is_known(agent_name):
        await starts.hand_back(msg, agent_name)
        return None
    raise Rejected("unknown_agent", f"no worker serves an agent named '{agent_name}'")


def check_input(agent: Agent[object, object], data: bytes) -> None:
    """Refuse (``invalid_input``) an input the agent does not take, before any record."""
    try:
        agent.decode_input(data)
    except msgspec.MsgspecError as e:
        raise Rejected("invalid_input", f"input does not match agent '{agent.name}': {e}") from e


class Singletons:
    """Singleton starts, for one worker's intake."""

    def __init__(self, starts: Starts) -> None:
        self.starts = starts
        self.broker = starts.broker
        self.names = starts.names
        self.store = FlowStore(starts.broker, starts.names)

    async def start(
        self, msg: Delivery, inbox: InboxSubject, trigger: StartTrigger
    ) -> Created | Opening | None:
        """Attach to the key's live run, or record this start's run as the key's and create
        it (``None``: handed back)."""
        key = trigger.singleton_key
        assert key is not None
        agent_name = inbox.target
        agent = await served(self.starts, msg, agent_name)
        if agent is None:
            return None
        check_input(agent, bytes(trigger.input))
        if trigger.attributes:  # refused before any record, as the start would be after it
            try:
                validate_attributes(trigger.attributes)
            except InvalidAttributes as e:
                raise Rejected("invalid_attributes", e.message) from e
        run_id = trigger.run_id or _derived_run_id(
            agent_name, msg.stream_seq, msg.timestamp.isoformat()
        )
        try:
            validate_token(run_id, "run_id")
        except InvalidName as e:
            raise Rejected("invalid_run_id", e.message) from e
        token = key_token(key)
        for _ in range(CAS_TRIES):
            rec, seq = await self.store.singleton(agent_name, token)
            if rec is not None and (rec.agent, rec.key) == (agent_name, key):
                if rec.run_id == run_id:
                    break  # this start's own record (a redelivery): create the run
                live, _ = await singleton_run(self.broker, self.names, rec)
                if live is not None:
                    metrics.STARTS_ATTACHED.labels(metrics.agent_label(agent_name)).inc()
                    answer = IntakeOk(run_id=live, created=False, attached=True)
                    return answer, None, False
            record = SingletonRecord(
                agent=agent_name,
                key=key,
                run_id=run_id,
                inbox_seq=msg.stream_seq,
                at=self.starts.clock.now(),
            )
            try:
                await self.store.put_singleton(token, record, seq)
                break
            except ConcurrencyConflict:
                continue
        else:
            await msg.nak(delay=0.5)
            return None
        fault("singleton_recorded", run_id)
        trigger = msgspec.structs.replace(trigger, run_id=run_id)
        return await self.starts.create(msg, agent_name, trigger, sender=inbox.sender)
