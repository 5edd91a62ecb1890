"""Debounced starts (decision 0047): a burst of starts of an agent under one key starts one
run, ``seconds`` after the last of them, with the last input or the list of all of them.

The burst is a record the broker keeps (``broker/flow.py``), rewritten by compare-and-set by
each trigger the intake takes: its inputs, how many triggers, and its deadline (the last
trigger's inbox time plus ``seconds``). After each write the trigger arms the burst's fire, a
one-shot message schedule at the deadline that replaces the pending one, so no process needs to
be alive for the fire to be stored. The agent's durable consumer ``debounce-<agent>`` takes the
fire to a worker serving the agent (``DebounceFires``), which **closes** the burst by
compare-and-set, then creates its run, create-only, under an id derived from the burst
(``debounced_run_id``: the first trigger's inbox sequence), so every trigger's answer can name
the run its burst will start.

Why nothing is lost or started twice:

- a trigger whose write lands before the close is in the run (the close reads the record it
  replaces); one that finds the burst closed opens the next burst;
- a fire armed for an earlier deadline (a trigger moved it) finds the record's deadline later:
  it arms the fire again (the broker may have let the later one go with its own) and stops;
- a worker dying after the close and before the run exists leaves the fire to be redelivered,
  which finds the burst closed and creates the run; a trigger opening the next burst first
  creates the closed burst's run too (its fire may have been replaced meanwhile);
- a trigger redelivered after its worker died finds its inbox sequence among those recorded
  (``DebounceRecord.recorded``) and is not recorded again.

A burst of ``inputs="all"`` holds at most ``DEBOUNCE_INPUTS_MAX`` inputs, and no more bytes
than a trigger may have: the trigger that would go beyond closes the burst at once (its run
starts now) and opens the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec

from sojourn.broker import headers as h
from sojourn.broker.delivery import Delivery
from sojourn.broker.eventstore import Decision
from sojourn.broker.flow import BURST, DEADLINE, FlowStore, debounce_consumer_config
from sojourn.broker.names import InboxSubject
from sojourn.broker.wake import publish_wake
from sojourn.schemas.attributes import InvalidAttributes, validate_attributes
from sojourn.schemas.errors import ConcurrencyConflict
from sojourn.schemas.flow import (
    DEBOUNCE_INPUTS_MAX,
    RECORDED_MAX,
    DebounceEntry,
    DebounceRecord,
    debounce_fault,
    key_fault,
    key_token,
)
from sojourn.schemas.wire import BudgetBody, IntakeOk, StartTrigger

from ..agents.agent import Agent
from ..ops import metrics
from .dead_letters import dead_letter, send_dead_letter
from .faults import fault
from .opening import Opening
from .refusals import Rejected
from .singletons import CAS_TRIES, check_input, served
from .starts import Created, Starts

__all__ = ["DebounceFires", "Debounces", "batch_input", "check_debounce", "merged"]

log = logging.getLogger("sojourn.flow")

FIRES_IN_FLIGHT = 64
"""Debounce fires one worker handles at once, per agent."""

_TOKEN = re.compile(r"[0-9a-f]{32}")
_NUMBER = re.compile(r"[0-9]{1,19}")

RunNew = Callable[[str, list[Decision], Delivery], Awaitable[bool]]
"""The worker's ``_run_new``: execute a run just created, holding ``msg`` until it rests."""


def check_debounce(trigger: StartTrigger) -> None:
    """Refuse a debounced start that cannot be one.

    Raises:
        Rejected: ``invalid_key``, ``invalid_debounce`` or ``invalid_trigger`` (it names a run
            id: its burst's run names itself).
    """
    body = trigger.debounce
    assert body is not None
    why = key_fault(body.key)
    if why is not None:
        raise Rejected("invalid_key", f"debounce key: {why}")
    why = debounce_fault(body)
    if why is not None:
        raise Rejected("invalid_debounce", why)
    if trigger.run_id is not None:
        raise Rejected(
            "invalid_trigger", "a debounced start names no run id: its burst's run is named for it"
        )


def batch_input(rec: DebounceRecord) -> msgspec.Raw:
    """The input of a burst's run: its last input, or the JSON array of all of them."""
    if rec.inputs == "last":
        return rec.entries[-1].input if rec.entries else msgspec.Raw(b"null")
    return msgspec.Raw(b"[" + b",".join(bytes(e.input) for e in rec.entries) + b"]")


def merged(
    entries: tuple[DebounceEntry, ...], entry: DebounceEntry, *, last: bool
) -> tuple[DebounceEntry, ...]:
    """``entries`` with ``entry`` in inbox order (``last``: only the newest is kept)."""
    both = sorted((*entries, entry), key=lambda e: e.seq)
    return tuple(both[-1:]) if last else tuple(both)


def _recorded(rec: DebounceRecord, seq: int, delivered: int) -> bool:
    """Whether the trigger at inbox sequence ``seq`` was recorded by an earlier delivery."""
    if seq in rec.recorded:
        return True
    # Older than every sequence kept: recorded long ago, if it was ever delivered before.
    full = len(rec.recorded) >= RECORDED_MAX
    return full and delivered > 1 and seq < rec.recorded[0]


def _size(entries: tuple[DebounceEntry, ...]) -> int:
    return sum(len(e.input) + 1 for e in entries) + 2


class Debounces:
    """Debounced starts, for one worker's intake (and the fires that end their bursts)."""

    def __init__(self, starts: Starts) -> None:
        self.starts = starts
        self.broker = starts.broker
        self.names = starts.names
        self.store = FlowStore(starts.broker, starts.names)

    async def trigger(
        self, msg: Delivery, inbox: InboxSubject, trigger: StartTrigger
    ) -> Created | None:
        """Record a debounced start in its key's burst and (re)arm the burst's fire; the
        answer names the run the burst will start (``None``: handed back)."""
        body = trigger.debounce
        assert body is not None
        agent_name = inbox.target
        agent = await served(self.starts, msg, agent_name)
        if agent is None:
            return None
        last = body.inputs == "last"
        raw = bytes(trigger.input)
        check_input(agent, raw if last else b"[" + raw + b"]")
        attributes = None
        if trigger.attributes:
            try:
                checked = validate_attributes(trigger.attributes)
            except InvalidAttributes as e:
                raise Rejected("invalid_attributes", e.message) from e
            attributes = {k: v for k, v in checked.items() if v is not None}
        token = key_token(body.key)
        seq = msg.stream_seq
        entry = DebounceEntry(seq, trigger.input)
        deadline = msg.timestamp.timestamp() + body.seconds
        for _ in range(CAS_TRIES):
            rec, rseq = await self.store.burst(agent_name, token)
            if rec is not None and (rec.agent, rec.key) != (agent_name, body.key):
                rec = None  # not this key's (a forged record): written over
            if rec is not None and _recorded(rec, seq, msg.num_delivered):
                if not rec.closed:
                    await self.store.arm(token, rec)  # its worker may have died before arming
                run_id = rec.run_id if seq >= rec.burst else ""
                return IntakeOk(run_id=run_id, created=False, debounced=True), None, False
            now = self.starts.clock.now()
            kept = tuple(sorted({*(rec.recorded if rec else ()), seq}))[-RECORDED_MAX:]
            newest = rec is None or rec.closed or seq > rec.entries[-1].seq
            mine: dict[str, Any] = {
                "budget": trigger.budget,
                "attributes": attributes,
                "sent_by": inbox.sender,
            }
            if rec is None or rec.closed:
                if rec is not None and not await self._exists(rec.run_id):
                    await self.create_run(rec, msg)  # the fire that closed it may have died
                new = DebounceRecord(
                    agent=agent_name,
                    key=body.key,
                    burst=seq,
                    inputs=body.inputs,
                    seconds=body.seconds,
                    deadline=deadline,
                    entries=(entry,),
                    count=1,
                    recorded=kept,
                    updated_at=now,
                    **mine,
                )
            else:
                if rec.inputs != body.inputs:
                    raise Rejected(
                        "invalid_debounce",
                        f"the open burst of this key collects inputs={rec.inputs!r}, "
                        f"not {body.inputs!r}",
                    )
                entries = merged(rec.entries, entry, last=last)
                limit = self.starts.settings.max_payload - 1024
                if not last and (len(entries) > DEBOUNCE_INPUTS_MAX or _size(entries) > limit):
                    await self._close_full(rec, rseq, token, msg)
                    continue  # the next burst begins with this trigger
                new = msgspec.structs.replace(
                    rec,
                    deadline=max(rec.deadline, deadline),
                    seconds=body.seconds,
                    entries=entries,
                    count=rec.count + 1,
                    recorded=kept,
                    updated_at=now,
                    **(mine if newest else {}),
                )
            try:
                await self.store.put_burst(token, new, rseq)
            except ConcurrencyConflict:
                continue
            await self.store.arm(token, new)
            metrics.DEBOUNCED_TRIGGERS.labels(metrics.agent_label(agent_name)).inc()
            return IntakeOk(run_id=new.run_id, created=False, debounced=True), None, False
        await msg.nak(delay=0.5)
        return None

    async def _exists(self, run_id: str) -> bool:
        last = await self.broker.direct_get_last(
            self.names.events_stream, self.names.events(run_id)
        )
        return last is not None

    async def _close_full(self, rec: DebounceRecord, rseq: int, token: str, msg: Delivery) -> None:
        """Close a burst that can take no more inputs, and start its run now."""
        closed = msgspec.structs.replace(rec, closed=True, updated_at=self.starts.clock.now())
        try:
            await self.store.put_burst(token, closed, rseq)
        except ConcurrencyConflict:
            return  # someone else changed it: look again
        fault("debounce_closed", closed.run_id)
        metrics.DEBOUNCE_FIRES.labels(metrics.agent_label(rec.agent), "full").inc()
        await self.create_run(closed, msg)

    async def create_run(self, rec: DebounceRecord, msg: Delivery) -> Created | None:
        """Create a closed burst's run (create-only: nothing when it exists) from ``msg`` (its
        fire, or the trigger that found it closed or full), woken unless ``msg`` is a fire
        (whose handler executes it); ``None`` when its input no longer fits the agent (it is
        dead-lettered)."""
        budget = None if rec.budget is None else BudgetBody(**msgspec.structs.asdict(rec.budget))
        trigger = StartTrigger(
            input=batch_input(rec), run_id=rec.run_id, budget=budget, attributes=rec.attributes
        )
        try:
            created = await self.starts.create(
                msg, rec.agent, trigger, sender=rec.sent_by, stored=True
            )
        except Rejected as r:
            log.warning("debounced run %s not started: %s", rec.run_id, r.message)
            letter = dead_letter(
                msg, "start", r.code, f"debounced run {rec.run_id}: {r.message}", limit=1 << 20
            )
            await send_dead_letter(self.broker, self.names, letter)
            return None
        assert not isinstance(created, Opening)
        if created is not None and msg.subject.startswith(self.store.fire_prefix(rec.agent)):
            return created
        if created is not None and created[2]:
            await publish_wake(self.broker, self.names, rec.run_id, "start", agent=rec.agent)
        return created


class DebounceFires:
    """One worker's handling of the fires of its agents' debounce bursts."""

    def __init__(
        self,
        debounces: Debounces,
        agents: Mapping[str, Agent[Any, Any]],
        run_new: RunNew,
        max_deliveries: int,
    ) -> None:
        self.debounces = debounces
        self.store = debounces.store
        self.broker = debounces.broker
        self.names = debounces.names
        self.agents = agents
        self.run_new = run_new
        self.max_deliveries = max_deliveries

    async def loop(self, agent: str, stopping: asyncio.Event) -> None:
        """Create ``agent``'s consumer of debounce fires if missing, then take its fires."""
        settings = self.debounces.starts.settings
        config = debounce_consumer_config(self.names, settings, agent)
        while not stopping.is_set():
            try:
                await self.broker.ensure_consumer(self.names.schedules_stream, config)
                sub = await self.broker.pull(self.names.schedules_stream, config["durable_name"])
                break
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("debounce consumer of %s: %s; retrying", agent, e)
                await asyncio.sleep(1.0)
        else:
            return
        inflight = asyncio.Semaphore(FIRES_IN_FLIGHT)
        tasks: set[asyncio.Task[None]] = set()
        try:
            while not stopping.is_set():
                try:
                    msgs: list[Delivery] = await sub.fetch(batch=FIRES_IN_FLIGHT, timeout=1.0)
                    for m in msgs:
                        await inflight.acquire()
                        task = asyncio.create_task(self._one(m, agent, inflight))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("debounce fires of %s: error; continuing", agent)
                    await asyncio.sleep(0.5)
        finally:
            for t in list(tasks):
                t.cancel()

    async def _one(self, msg: Delivery, agent: str, inflight: asyncio.Semaphore) -> None:
        try:
            await self.on_fire(msg, agent)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await msg.nak()
            raise
        except Exception as e:  # broker trouble, or a bug: the fire comes back
            log.warning(
                "debounce fire %r: %s: %s; will retry", msg.subject[:200], type(e).__name__, e
            )
            with contextlib.suppress(Exception):
                await msg.nak(delay=1.0)
        finally:
            inflight.release()

    async def _refuse(self, msg: Delivery, code: str, why: str) -> None:
        """Keep a record of a message on a fire subject that is not a fire we armed; ack it."""
        record = dead_letter(msg, "other", code, why, limit=self.broker.max_payload or 1 << 20)
        await send_dead_letter(self.broker, self.names, record)
        await msg.ack()

    async def on_fire(self, msg: Delivery, agent_name: str) -> None:
        """Handle one fire: close its burst, create the burst's run, execute it; settle."""
        head = self.store.fire_prefix(agent_name)
        token = msg.subject[len(head) :] if msg.subject.startswith(head) else ""
        if not _TOKEN.fullmatch(token):
            await self._refuse(msg, "invalid_trigger", "not a debounce fire of this agent")
            return
        if msg.header(h.GARBLED):
            await self._refuse(msg, "invalid_headers", "the header block cannot be read")
            return
        burst, armed = msg.header(BURST), msg.header(DEADLINE)
        if not (_NUMBER.fullmatch(burst) and _NUMBER.fullmatch(armed) and msg.header(h.SCHEDULER)):
            await self._refuse(msg, "invalid_trigger", "not a debounce fire armed by sojourn")
            return
        if msg.num_delivered >= self.max_deliveries:
            await self._refuse(msg, "max_deliveries", f"fire delivered {msg.num_delivered} times")
            return
        if agent_name not in self.agents:
            await msg.nak(delay=1.0)  # no longer served here: another worker will
            return
        for _ in range(CAS_TRIES):
            rec, seq = await self.store.burst(agent_name, token)
            if rec is None or rec.agent != agent_name or rec.burst != int(burst):
                await msg.ack()  # a later burst's record (this one's run was created) or none
                return
            if not rec.closed:
                if round(rec.deadline * 1000) > int(armed):
                    await self.store.arm(token, rec)  # moved on: its own fire may be gone
                    await msg.ack()
                    return
                closed = msgspec.structs.replace(
                    rec, closed=True, updated_at=self.debounces.starts.clock.now()
                )
                try:
                    await self.store.put_burst(token, closed, seq)
                except ConcurrencyConflict:
                    continue
                fault("debounce_closed", rec.run_id)
                metrics.DEBOUNCE_FIRES.labels(metrics.agent_label(agent_name), "fired").inc()
                rec = closed
            break
        else:
            await msg.nak(delay=1.0)
            return
        created = await self.debounces.create_run(rec, msg)
        if created is not None:
            _, history, wake = created
            if history is not None and await self.run_new(rec.run_id, history, msg):
                return  # it executes here; msg is settled when it rests
            if wake:
                await publish_wake(self.broker, self.names, rec.run_id, "start", agent=agent_name)
        await msg.ack()
