"""Agent holds: an operator's pause of every run of an agent (decision 0039).

``sojourn pause --agent A`` reaches a worker's intake as a ``HoldRequest``; ``AgentHolds``
records it as the agent's ``AgentHold`` on ``<prefix>.hold.<agent>`` (in the agents stream,
one message per subject: the last is the agent's state). Every worker follows those records
(read at start, then a core subscription, and read again every ``REFRESH_EVERY`` seconds in
case a notice was missed: ``worker/follower.py``) and tells its run machines: a run of a held
agent suspends itself (``RunSuspended``, reason ``manual``) before its next step, live runs and
new ones alike. A run so held is listed on ``<prefix>.held.<agent>.<run_id>``.

An unpause records the agent's hold lifted, then resumes every run listed (a ``RunResumed`` by
the operator who unpaused, appended under a message id of the request, so a redelivered request
resumes nothing twice), wakes it and replaces its listing with a released record that expires. A
worker that learns of the unpause resumes what is listed too, which closes the race of a run
held by a worker that had not heard of the unpause yet: it lists the run, then looks at its
table again (``mark``)."""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec

from sojourn.broker import headers as h
from sojourn.broker.connection import Broker
from sojourn.broker.delivery import Delivery, StoredMessage
from sojourn.broker.eventstore import EventStore
from sojourn.broker.follow import read_all
from sojourn.broker.names import InboxSubject, Names
from sojourn.broker.wake import publish_wake
from sojourn.schemas.codec import decode_held_run, decode_hold, decode_hold_request, encode
from sojourn.schemas.errors import ConcurrencyConflict
from sojourn.schemas.events import RunResumed
from sojourn.schemas.holds import HOLD_REASON_MAX, AgentHold, HeldRun, HoldAnswer

from ..history.snapshots import current as current_snapshot
from .clock import Clock
from .follower import RecordFollower
from .refusals import Rejected, reply

__all__ = ["RELEASE_AFTER", "AgentHolds"]

log = logging.getLogger("sojourn.actors.worker.holds")

RELEASED_TTL = "1h"
"""How long the record of a resumed held run is kept (it replaces the listing, then expires)."""

RELEASE_AFTER = 1.0
"""Seconds after hearing of an unpause before a worker resumes what is still listed held."""


class AgentHolds:
    """The holds of every agent, as this worker knows them, and the requests that change them."""

    def __init__(
        self, broker: Broker, names: Names, store: EventStore, writer: str, clock: Clock
    ) -> None:
        self.broker = broker
        self.names = names
        self.store = store
        self.writer = writer
        self.clock = clock
        self.table: dict[str, AgentHold] = {}
        """The held agents (an agent whose hold was lifted is not in it)."""
        self._records = RecordFollower(
            broker,
            names.agents_stream,
            names.holds_all,
            on_stored=lambda stored: self._apply(stored.data),
            on_notice=self._on_notice,
            what="agent holds",
        )

    def of(self, agent: str) -> AgentHold | None:
        """The hold of ``agent`` now, if it is held."""
        return self.table.get(agent)

    # --- following the records ---------------------------------------------------------------

    async def start(self) -> None:
        """Read every agent's hold, then follow them."""
        await self._records.start()

    async def stop(self) -> None:
        await self._records.stop()

    def kill(self) -> None:
        """Stop at once (``Worker.kill``)."""
        self._records.kill()

    async def _on_notice(self, msg: Delivery) -> None:
        self._apply(msg.data)

    def _apply(self, data: bytes) -> None:
        try:
            hold = decode_hold(data)
        except msgspec.MsgspecError:
            log.warning("an agent hold record that is not an AgentHold: ignored")
            return
        was = self.table.get(hold.agent)
        if hold.paused:
            self.table[hold.agent] = hold
        elif was is not None:
            del self.table[hold.agent]
            self._records.later(self._release_later(hold))

    async def _release_later(self, hold: AgentHold) -> None:
        """A backstop for runs held by a worker that heard of the unpause late: the worker
        that took the request resumes the runs listed first (and counts them)."""
        await asyncio.sleep(RELEASE_AFTER)
        try:
            await self.release(hold.agent, hold.by, f"notice:{hold.at}")
        except Exception as e:  # the next notice, or the operator's next unpause, goes on
            log.warning("resuming the runs of agent %s: %s", hold.agent, e)

    # --- held runs ---------------------------------------------------------------------------

    async def mark(self, agent: str, run_id: str) -> None:
        """``run_id`` suspended itself for its agent's hold: list it for the unpause. If the
        hold was lifted meanwhile (this worker heard of it late), resume it now."""
        body = encode(HeldRun(run_id=run_id, at=self.clock.now()))
        await self.broker.publish(self.names.held(agent, run_id), body)
        hold = self.table.get(agent)
        if hold is None:
            await self._resume(agent, run_id, "", f"late:{time.time_ns()}")

    async def release(self, agent: str, by: str, key: str) -> int:
        """Resume every run listed as held for ``agent``; how many were resumed."""
        listed = await read_all(self.broker, self.names.agents_stream, self.names.held(agent, "*"))
        resumed = 0
        for stored in listed:
            run_id = _held_run(stored)
            if run_id is not None and await self._resume(agent, run_id, by, key):
                resumed += 1
        return resumed

    async def _resume(self, agent: str, run_id: str, by: str, key: str) -> bool:
        """Append a ``RunResumed`` to ``run_id`` if its agent's hold still holds it, wake it
        and remove its listing; ``False`` when there was nothing to resume."""
        if agent in self.table:
            return False  # held again meanwhile: it stays listed
        msg_id = f"{run_id}:unhold:{key}"
        resumed = False
        for _ in range(20):
            snap = await current_snapshot(self.store, run_id)
            if snap is None or msg_id in snap.intake_ids:
                break
            state = snap.state
            if state.status != "suspended" or state.suspended_reason != "manual":
                break  # resumed already, or ended
            if state.pause is not None:
                break  # paused on its own (``sojourn pause RUN``): that pause holds it
            note = f"agent {agent} unpaused"
            event = RunResumed(by=by or None, note=note, at=self.clock.now())
            try:
                await self.store.append(
                    run_id, [event], expected_seq=snap.seq, writer=self.writer, msg_id=msg_id
                )
            except ConcurrencyConflict:
                continue
            resumed = True
            await publish_wake(self.broker, self.names, run_id, "signal", agent=agent)
            break
        released = HeldRun(run_id=run_id, at=self.clock.now(), released=True)
        await self.broker.publish(
            self.names.held(agent, run_id), encode(released), {h.TTL: RELEASED_TTL}
        )
        return resumed

    # --- requests ----------------------------------------------------------------------------

    async def handle_request(self, msg: Delivery, inbox: InboxSubject) -> None:
        """Record a ``HoldRequest`` as the agent's hold, answer it and settle ``msg``.

        Raises:
            Rejected: not a hold request, or a reason too long.
        """
        try:
            req = decode_hold_request(msg.data)
        except msgspec.ValidationError as e:
            raise Rejected("invalid_trigger", f"not a hold request: {e}") from e
        except msgspec.DecodeError as e:
            raise Rejected("invalid_json", f"request is not valid JSON: {e}") from e
        if len(req.reason) > HOLD_REASON_MAX:
            raise Rejected(
                "invalid_trigger", f"a hold's reason is at most {HOLD_REASON_MAX} characters"
            )
        agent, by = inbox.target, inbox.sender or ""
        paused = req.action == "pause"
        hold = AgentHold(agent=agent, paused=paused, by=by, reason=req.reason, at=time.time())
        key = f"hold:{msg.stream_seq}"
        resumed = 0
        if paused:
            self.table[agent] = hold
        else:
            self.table.pop(agent, None)  # before the notice: this worker releases them now
        await self.broker.publish(self.names.hold(agent), encode(hold), {h.MSG_ID: key})
        if not paused:
            resumed = await self.release(agent, by, key)
        answer = HoldAnswer(agent=agent, paused=paused, resumed=resumed)
        await reply(self.broker, msg, encode(answer))
        await msg.ack()


def _held_run(stored: StoredMessage) -> str | None:
    """The run a listing names, ``None`` for one released already (or not a ``HeldRun``)."""
    try:
        held = decode_held_run(stored.data)
    except msgspec.MsgspecError:
        return None
    return None if held.released else held.run_id
