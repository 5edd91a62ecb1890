"""The intake: turns inbound messages (starts, cancels, signals) into run events, or rejects them.

Every inbound message ends in exactly one of two places: an event in a run's history (plus a
wake), or a dead-letter record on ``<prefix>.dlq.<kind>`` with the reason and the original
bytes. It is acknowledged only after that write, so a crash in between redelivers it, and the
writes are idempotent (deterministic Msg-Ids, sequence fences), so a redelivery lands once.

A ``Sojourn-Reply-To`` header names a subject to answer on: ``{"run_id", "created"}`` or
``{"error": {"code", "message"}}`` (docs/wire.md).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Literal

import msgspec

from sojourn.broker.connection import Broker, Msg, header
from sojourn.broker.eventstore import Decision, EventStore
from sojourn.broker.names import Names, validate_signal_name, validate_token
from sojourn.broker.registry import AgentRegistry
from sojourn.broker.wake import publish_wake
from sojourn.schemas.codec import decode_events, decode_json, decode_start, encode, to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import ConcurrencyConflict, HistoryError, InvalidName
from sojourn.schemas.events import (
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
from sojourn.schemas.wire import (
    ChildOutcome,
    DeadLetter,
    ErrorBody,
    IntakeError,
    IntakeOk,
    StartTrigger,
)

from .agent import Agent
from .context import CHILD_SIGNAL
from .state import fold

__all__ = ["REPLY_HEADER", "Intake", "Rejected"]

log = logging.getLogger("sojourn.intake")

REPLY_HEADER = "Sojourn-Reply-To"

RESUME_SIGNAL = "sojourn-resume"
"""The signal that lifts a suspension (a poll cap, non-determinism after a fix, ...)."""

UNKNOWN_RUN_RETRIES = 5
"""Deliveries of a cancel for a run that does not exist yet before it is dead-lettered."""

OnCreated = Callable[[str, Decision, Msg], Awaitable[bool]]
"""Called with a freshly created run: return True to run it at once (then the callee settles
the inbox message), False to have the intake wake it through the wake stream."""


class Rejected(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _CancelBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    reason: str = ""
    by: str | None = None


_cancel_decoder = msgspec.json.Decoder(_CancelBody)

_DLQ_KINDS: dict[str, Literal["start", "signal", "cancel", "other"]] = {
    "start": "start",
    "signal": "signal",
    "cancel": "cancel",
}


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

    async def handle(self, msg: Msg) -> None:
        """Process one inbox message and settle it (ack, or nak to retry later)."""
        kind = self.names.subject_token(msg.subject, 0)
        try:
            if len(msg.data) > self.settings.max_payload:
                raise Rejected(
                    "payload_too_large",
                    f"payload is {len(msg.data)} bytes; the limit is "
                    f"{self.settings.max_payload} bytes (Settings.max_payload)",
                )
            if kind == "start":
                started = await self._start(msg)
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
                    await publish_wake(self.broker, self.names, answer.run_id, "start")
                await msg.ack()
                return
            if kind == "cancel":
                handled = await self._cancel(msg)
            elif kind == "signal":
                handled = await self._signal(msg)
            else:
                raise Rejected(
                    "invalid_trigger", f"{kind} messages are not supported by this worker version"
                )
            if handled is None:
                return
            await self._reply(msg, encode(handled))
            await msg.ack()
        except Rejected as r:
            await self._reject(msg, kind, r.code, r.message)
        except HistoryError as e:  # the run's history cannot be read: retrying cannot help
            await self._reject(msg, kind, "internal", e.message)

    # --- start -------------------------------------------------------------------------------

    async def _start(self, msg: Msg) -> tuple[IntakeOk, Decision | None, bool] | None:
        """Create the run. Returns the answer, the run's whole history when this call created
        it (so it can run at once), and whether the run needs a wake.

        ``None`` means the message was handed back (nak) for another worker.
        """
        agent_name = self.names.subject_token(msg.subject, 1)
        try:
            trigger = decode_start(msg.data)
        except msgspec.ValidationError as e:
            raise Rejected(
                "invalid_trigger", f'trigger must be {{"input": ..., "run_id": optional}}: {e}'
            ) from e
        except msgspec.DecodeError as e:
            raise Rejected("invalid_json", f"trigger is not valid JSON: {e}") from e
        try:
            return await self._create(msg, agent_name, trigger)
        except Rejected as r:
            if trigger.parent_run_id and trigger.run_id:
                # A parent awaits this child: tell it the child will never run.
                outcome = ChildOutcome(
                    child_run_id=trigger.run_id,
                    status="rejected",
                    output=to_raw(None),
                    error=ErrorBody(code=r.code, message=r.message),
                )
                await self.broker.publish(
                    self.names.signal(trigger.parent_run_id, f"{CHILD_SIGNAL}.{trigger.run_id}"),
                    encode(outcome),
                    {"Nats-Msg-Id": f"child-end:{trigger.run_id}"},
                )
            raise

    async def _create(
        self, msg: Msg, agent_name: str, trigger: StartTrigger
    ) -> tuple[IntakeOk, Decision | None, bool] | None:
        if trigger.parent_run_id:
            await self._check_parent(trigger.parent_run_id)
        agent = self.agents.get(agent_name)
        if agent is None:
            if await self.registry.is_known(agent_name):
                await msg.nak(delay=1.0)  # another worker serves it
                return None
            raise Rejected("unknown_agent", f"no worker serves an agent named '{agent_name}'")
        meta = msg.metadata
        inbox_seq = meta.sequence.stream
        run_id = trigger.run_id or _derived_run_id(
            agent_name, inbox_seq, meta.timestamp.isoformat()
        )
        try:
            validate_token(run_id, "run_id")
        except InvalidName as e:
            raise Rejected("invalid_run_id", e.message) from e
        try:
            agent.decode_input(bytes(trigger.input))
        except msgspec.ValidationError as e:
            raise Rejected(
                "invalid_input", f"input does not match agent '{agent_name}': {e}"
            ) from e
        started = RunStarted(
            run_id=run_id,
            agent=agent_name,
            input=trigger.input,
            code_version=agent.version,
            parent_run_id=trigger.parent_run_id,
            trigger=TriggerInfo(
                inbox_seq=inbox_seq,
                msg_id=header(msg, "Nats-Msg-Id") or None,
                received_at=time.time(),
            ),
            at=time.time(),
        )
        msg_id = f"{run_id}:start:{inbox_seq}"
        try:
            seq, earlier = await self.store.append_once(
                run_id, [started], expected_seq=0, writer=self.writer, msg_id=msg_id
            )
        except ConcurrencyConflict:
            first = await self.store.first(run_id)
            ours = bool(
                first
                and first.events
                and isinstance(first.events[0], RunStarted)
                and first.events[0].trigger.inbox_seq == inbox_seq
            )
            # ours: a redelivery of the trigger that created this run. The worker that took it
            # may have died before the run rested, so wake it (a wake is only a hint).
            return IntakeOk(run_id=run_id, created=ours), None, ours
        if earlier:  # we created it before and crashed or lost the ack: history may have grown
            return IntakeOk(run_id=run_id, created=True), None, True
        created = Decision(seq=seq, events=(started,), writer=self.writer, msg_id=msg_id)
        return IntakeOk(run_id=run_id, created=True), created, True

    async def _check_parent(self, parent_run_id: str) -> None:
        """A child whose parent was cancelled (or ended) while its start was queued must not
        run: the parent's cancel cascade could not reach a run that did not exist yet."""
        history = await self.store.history(parent_run_id)
        parent = fold(e for d in history for e in d.events)
        if parent.terminal or parent.cancel_requested is not None:
            raise Rejected(
                "run_ended",
                f"parent run '{parent_run_id}' is {parent.status}"
                + (" (cancel requested)" if parent.cancel_requested else ""),
            )

    # --- signals -----------------------------------------------------------------------------

    async def _signal(self, msg: Msg) -> IntakeOk | None:
        """Append ``SignalReceived`` to the run (once per signal id, ever) and wake it."""
        run_id = self.names.subject_token(msg.subject, 1)
        name = self.names.signal_name(msg.subject)
        try:
            validate_signal_name(name)
        except InvalidName as e:
            raise Rejected("invalid_trigger", e.message) from e
        try:
            payload = to_raw(decode_json(msg.data)) if msg.data.strip() else to_raw(None)
        except msgspec.DecodeError as e:
            raise Rejected("invalid_json", f"signal payload is not valid JSON: {e}") from e
        inbox_seq = msg.metadata.sequence.stream
        signal_id = (
            header(msg, "Sojourn-Signal-Id") or header(msg, "Nats-Msg-Id") or f"inbox-{inbox_seq}"
        )
        for _ in range(20):
            history = await self.store.history(run_id)
            if not history:
                if msg.metadata.num_delivered < UNKNOWN_RUN_RETRIES:
                    await msg.nak(delay=1.0)  # its start may still be on its way
                    return None
                raise Rejected("unknown_run", f"no run with id '{run_id}'")
            events = [e for d in history for e in d.events]
            if any(isinstance(e, SignalReceived) and e.signal_id == signal_id for e in events):
                return IntakeOk(run_id=run_id, created=False)  # delivered before: count once
            if any(isinstance(e, (RunCompleted, RunFailed, RunCancelled)) for e in events):
                if name.startswith(CHILD_SIGNAL + "."):
                    return IntakeOk(run_id=run_id, created=False)  # parent already over
                raise Rejected("run_ended", f"run '{run_id}' has ended; signal '{name}' unused")
            event: RunEvent = SignalReceived(
                name=name,
                payload=payload,
                signal_id=signal_id,
                sent_by=header(msg, "Sojourn-Sender") or None,
                at=time.time(),
            )
            if name == RESUME_SIGNAL:
                state = fold(events)
                if state.status != "suspended":
                    return IntakeOk(run_id=run_id, created=False)  # resumed already: no-op
                body = decode_json(msg.data) if msg.data.strip() else {}
                by = body.get("by") if isinstance(body, dict) else None
                note = body.get("note", "") if isinstance(body, dict) else ""
                event = RunResumed(
                    by=by if isinstance(by, str) else None,
                    note=note if isinstance(note, str) else "",
                    at=time.time(),
                )
            try:
                await self.store.append(
                    run_id,
                    [event],
                    expected_seq=history[-1].seq,
                    writer=self.writer,
                    msg_id=f"{run_id}:signal:{inbox_seq}",
                )
                break
            except ConcurrencyConflict:
                continue
        else:
            await msg.nak(delay=0.2)
            return None
        await publish_wake(self.broker, self.names, run_id, "signal")
        return IntakeOk(run_id=run_id, created=False)

    # --- cancel ------------------------------------------------------------------------------

    async def _cancel(self, msg: Msg) -> IntakeOk | None:
        run_id = self.names.subject_token(msg.subject, 1)
        body = _CancelBody()
        if msg.data.strip():
            try:
                body = _cancel_decoder.decode(msg.data)
            except msgspec.ValidationError as e:
                raise Rejected(
                    "invalid_trigger", f'cancel body must be {{"reason": ...}}: {e}'
                ) from e
            except msgspec.DecodeError as e:
                raise Rejected("invalid_json", f"cancel body is not valid JSON: {e}") from e
        inbox_seq = msg.metadata.sequence.stream
        for _ in range(20):
            last = await self.broker.direct_get_last(
                self.names.events_stream, self.names.events(run_id)
            )
            if last is None:
                if msg.metadata.num_delivered < UNKNOWN_RUN_RETRIES:
                    # Its start may still be on its way (queued for a worker of its agent):
                    # look again before calling the run unknown.
                    await msg.nak(delay=1.0)
                    return None
                raise Rejected("unknown_run", f"no run with id '{run_id}'")
            if any(
                isinstance(e, (RunCompleted, RunFailed, RunCancelled))
                for e in decode_events(last.data)
            ):
                return IntakeOk(run_id=run_id, created=False)  # already over: nothing to do
            try:
                await self.store.append(
                    run_id,
                    [CancelRequested(reason=body.reason, by=body.by, at=time.time())],
                    expected_seq=int(header(last, "Nats-Sequence")),
                    writer=self.writer,
                    msg_id=f"{run_id}:cancel:{inbox_seq}",
                )
                break
            except ConcurrencyConflict:
                continue
        else:
            await msg.nak(delay=0.5)
            return None
        await publish_wake(self.broker, self.names, run_id, "cancel")
        return IntakeOk(run_id=run_id, created=False)

    # --- replies and rejections --------------------------------------------------------------

    async def _reply(self, msg: Msg, body: bytes) -> None:
        reply_to = header(msg, REPLY_HEADER)
        if not reply_to:
            return
        try:
            await self.broker.nc.publish(reply_to, body)
        except Exception as e:  # a bad reply subject must not block the trigger
            log.warning("cannot answer on %r: %s", reply_to, e)

    async def _reject(self, msg: Msg, kind: str, code: str, message: str) -> None:
        dl = DeadLetter(
            code=code,
            message=message,
            subject=msg.subject,
            data=msg.data,
            headers={k: v for k, v in (msg.headers or {}).items()},
            inbox_seq=msg.metadata.sequence.stream,
            rejected_at=time.time(),
            kind=_DLQ_KINDS.get(kind, "other"),
        )
        await self.broker.publish(self.names.dlq(dl.kind), encode(dl))
        log.info("rejected %s: %s: %s", msg.subject, code, message)
        await self._reply(msg, encode(IntakeError(error=ErrorBody(code=code, message=message))))
        await msg.ack()


def _derived_run_id(agent: str, inbox_seq: int, stored_at: str) -> str:
    """A run id that is the same on every redelivery of the same inbox message."""
    digest = hashlib.blake2b(f"{agent}:{inbox_seq}:{stored_at}".encode(), digest_size=10)
    return f"r{digest.hexdigest()}"
