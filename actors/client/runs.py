"""Sending to runs: starting them (``start``, ``trigger``), signalling them, cancelling and
terminating them.

``start`` publishes a trigger on ``<prefix>[.as.<user>].start.<agent>.<run_id>``, which the
inbox stream captures: until a worker takes it the run is ``pending``, found by its id in the
inbox. Signals and cancels are stored the same way, to be taken by the intake in order.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, TypedDict, Unpack

import msgspec

from sojourn.broker import headers as h
from sojourn.schemas.attributes import validate_attributes
from sojourn.schemas.codec import encode, to_raw
from sojourn.schemas.concurrency import ConcurrencyBody
from sojourn.schemas.errors import InvalidName, PayloadTooLarge
from sojourn.schemas.events import Budget
from sojourn.schemas.fairness import Fairness, fairness_headers, validate_fairness
from sojourn.schemas.flow import DebounceBody, DebounceInputs, debounce_fault, key_fault
from sojourn.schemas.names import (
    RESERVED_SIGNAL_PREFIX,
    reserved_run_id,
    validate_signal_name,
    validate_token,
)
from sojourn.schemas.priority import PRIORITY_DEFAULT, validate_priority
from sojourn.schemas.wire import CancelBody, IntakeError, StartTrigger

from ..history.snapshots import current as current_snapshot
from ..telemetry import outgoing
from .base import ClientBase, TriggerRejected, budget_body, refuse_unknown, rejected
from .concurrency import concurrency_body

__all__ = ["RunControl", "StartOptions", "StartReceipt"]


class StartOptions(TypedDict, total=False):
    """How ``Client.start`` and ``Client.trigger`` start a run, besides the agent, its input
    and ``wait`` (keyword arguments, each optional).

    Attributes:
        run_id: the run's id (a name token); default: a fresh one, generated here.
        timeout: how long ``wait=True`` waits for the intake's answer, in seconds (default 5).
        budget: limits for this run, each replacing the agent's own.
        sender: who starts it (a name token), recorded as ``RunStarted.trigger.sent_by``.
        traceparent: the W3C trace context the run's span is a child of (default: the
            caller's current OpenTelemetry span, if it traces); a malformed one is ignored.
        tracestate: the W3C ``tracestate`` that goes with ``traceparent``.
        attributes: the run's search attributes (``sojourn.schemas.attributes``: str, int,
            float, bool or an aware datetime; at most 32), which listings filter by.
        singleton_key: attach to the live run started with this key (for this agent) instead
            of starting another (decision 0047); the answer says ``attached``.
        debounce: start one run this long (seconds, or a ``timedelta``: 0.1 s to 7 days)
            after the last of a burst of starts with the same ``debounce_key``; the run id is
            the burst's (``run_id`` must not be given).
        debounce_key: the key of a debounced start (required with ``debounce``).
        debounce_inputs: ``"last"`` (default: the run gets the last start's input) or
            ``"all"`` (the list of every input of the burst, in order).
        concurrency: ``{"key": K, "limit": N}`` (or a ``ConcurrencyBody``): at most N live
            runs of the agent started with key K; beyond, the run is queued (``pending``)
            until a slot frees, in arrival order (decision 0048). Not for an agent that
            declares its own (``Agent(concurrency=...)``), nor with a singleton key or a
            debounce.
        priority: 1 (most urgent) to 5 (bulk), default 3 (decision 0049): the start goes on
            that priority's lane, and the run's wakes and children follow it there; workers
            take from the more urgent lanes first.
        fairness_key: the key workers share their slots fairly between (a tenant, a user:
            ``[A-Za-z0-9_.:@/-]``, at most 128 characters; decision 0049): a burst of one
            key's starts does not starve another key's. Default: one shared key.
        fairness_weight: the key's share against a weight-1 key's (1 to 1000, default 1).
    """

    run_id: str | None
    timeout: float
    budget: Budget | None
    sender: str | None
    traceparent: str | None
    tracestate: str | None
    attributes: Mapping[str, Any] | None
    singleton_key: str | None
    debounce: float | timedelta | None
    debounce_key: str | None
    debounce_inputs: DebounceInputs
    concurrency: ConcurrencyBody | dict[str, Any] | None
    priority: int
    fairness_key: str | None
    fairness_weight: int


class StartReceipt(msgspec.Struct, frozen=True, kw_only=True):
    """What ``Client.trigger`` learned: the run id and, if the intake answered in time,
    whether this call created the run (``queued`` means no worker answered yet)."""

    run_id: str
    created: bool | None
    queued: bool
    attached: bool = False
    """A singleton start found its key's run live: ``run_id`` is that run."""
    debounced: bool = False
    """A debounced start: ``run_id`` is the run its burst will start when it ends (``""``
    when no worker answered yet)."""


class RunControl(ClientBase):
    """``Client``'s messages to runs: ``start``, ``trigger``, ``signal``, ``cancel``,
    ``terminate``."""

    async def start(
        self, agent: str, input: Any = None, *, wait: bool = False, **options: Unpack[StartOptions]
    ) -> str:
        """Start a run of ``agent`` and return its run id.

        Idempotent: the same ``run_id`` started twice is one run, forever. Without ``run_id``
        a fresh one is generated here. With ``wait=True`` this waits up to ``timeout`` for the
        intake's answer and raises ``TriggerRejected`` if the trigger was refused. ``budget``:
        limits for this run, each replacing the agent's own (``Budget``). ``sender`` (a name
        token) is recorded as who started it (``RunStarted.trigger.sent_by``); on an
        authenticated connection it is the connection's user unless it is one of
        ``speaks_for``. (``run_id``, ``timeout``, ``budget`` and ``sender`` are the keyword
        arguments of ``StartOptions``.) A ``singleton_key`` or a ``debounce`` makes the start
        keyed (decision 0047): the intake's answer is always awaited, and the id returned is
        the run it names (the key's live run, or the burst's; ``""`` for a debounced start no
        worker answered in time).

        Raises:
            InvalidName: ``agent``, ``run_id``, ``sender`` or a key is not a valid name, or
                ``priority`` is not 1-5.
            ValueError: ``sender`` is not this connection's user or one it speaks for; a
                debounce out of range or without its key.
            PayloadTooLarge: the encoded trigger exceeds ``settings.max_payload``.
            TriggerRejected: (``wait=True``) the intake refused it.
            BrokerUnavailable: the broker did not take the trigger.
        """
        keyed = options.get("singleton_key") is not None or options.get("debounce") is not None
        # A keyed start's run is the intake's to name: its answer is always awaited.
        receipt = await self.trigger(agent, input, wait=wait or keyed, **options)
        return receipt.run_id

    async def trigger(
        self, agent: str, input: Any = None, *, wait: bool = True, **options: Unpack[StartOptions]
    ) -> StartReceipt:
        """Like ``start`` but returns the intake's full answer (see ``StartReceipt``)."""
        refuse_unknown(options, StartOptions, "trigger")
        run_id, timeout = options.get("run_id"), options.get("timeout", 5.0)
        validate_token(agent, "agent name")
        priority = validate_priority(options.get("priority", PRIORITY_DEFAULT))
        fairness = _fairness(options)
        who = self._sender(options.get("sender"))
        singleton_key, debounce = _keyed(options)
        concurrency = concurrency_body(options.get("concurrency"))
        if concurrency is not None and (singleton_key is not None or debounce is not None):
            raise ValueError("a singleton or debounced start takes no concurrency")
        if debounce is not None and run_id is not None:
            raise ValueError("a debounced start names no run_id: its burst's run is named for it")
        run_id = validate_token(run_id, "run_id") if run_id is not None else _new_run_id()
        why = reserved_run_id(run_id)
        if why is not None:
            # The intake would refuse it (invalid_run_id): only sojourn makes ids of this
            # form. Said here, before anything is published.
            raise InvalidName(f"run id {run_id!r} {why}")
        limits = budget_body(options.get("budget"))
        given = options.get("attributes")
        attributes = None
        if given:  # refused here, before anything is published, as the intake would
            attributes = {k: v for k, v in validate_attributes(given).items() if v is not None}
        body = encode(
            StartTrigger(
                input=to_raw(input),
                run_id=None if debounce is not None else run_id,
                budget=limits,
                attributes=attributes,
                singleton_key=singleton_key,
                debounce=debounce,
                concurrency=concurrency,
            )
        )
        if len(body) > self.settings.max_payload:
            raise PayloadTooLarge(
                f"trigger is {len(body)} bytes; the limit is {self.settings.max_payload} "
                "(Settings.max_payload): store large inputs elsewhere and pass a reference",
                run_id=run_id,
            )
        await self._ensure()
        headers = {h.MSG_ID: f"start:{agent}:{run_id}"}
        headers.update(outgoing(options.get("traceparent"), options.get("tracestate")))
        headers.update(fairness_headers(fairness))
        # The run id in the subject makes the stored trigger findable: the run is pending.
        # Not for a keyed start, whose run may be another (attached, or its burst's).
        keyed = singleton_key is not None or debounce is not None
        subject = self.names.start(agent, who, None if keyed else run_id, priority)
        if debounce is not None:
            run_id = ""  # the burst's run, named by the intake's answer
        if not wait:
            if not await self._publish(subject, body, headers) and not keyed:
                self._started(run_id)
            return StartReceipt(
                run_id=run_id, created=None, queued=True, debounced=debounce is not None
            )
        reply = await self._publish_answered(subject, body, headers, timeout, who)
        if reply == "duplicate" and keyed:  # answered once, before: what it said is not kept
            return StartReceipt(run_id=run_id, created=None, queued=True)
        if reply == "duplicate":
            # The inbox already holds this exact trigger (a retry inside the dedup window):
            # the intake answers only once, so answer from the run's history instead.
            exists = await self.store.last_seq(run_id) > 0
            return StartReceipt(run_id=run_id, created=False if exists else None, queued=not exists)
        if reply is None:
            return StartReceipt(
                run_id=run_id, created=None, queued=True, debounced=debounce is not None
            )
        if isinstance(reply, IntakeError):
            raise rejected(reply, run_id)
        if reply.created and not keyed:
            self._started(run_id)
        return StartReceipt(
            run_id=reply.run_id,
            created=reply.created,
            queued=False,
            attached=reply.attached,
            debounced=reply.debounced,
        )

    async def signal(
        self,
        run_id: str,
        name: str,
        payload: Any = None,
        *,
        signal_id: str | None = None,
        sender: str | None = None,
        wait: bool = False,
        timeout: float = 5.0,
    ) -> str:
        """Send the signal ``name`` to a run (durable: buffered until the run waits for it).

        ``signal_id`` makes a retried send count once, forever (default: a fresh id per call,
        returned). The JetStream ack is the receipt, even while no worker is up. ``sender``
        (a name token) is recorded as who sent it; on an authenticated connection the sender
        is always the connection's user. With ``wait=True`` this waits up to ``timeout`` for
        the intake to record it, and raises ``TriggerRejected`` if it refused it (``run_ended``,
        ``unknown_run``...); a signal id recorded before counts as recorded.

        Raises:
            InvalidName: bad run id, signal name or sender, or a reserved (``sojourn-``) name.
            PayloadTooLarge: the encoded payload exceeds ``settings.max_payload``.
            TriggerRejected: (``wait=True``) the intake refused it.
        """
        validate_token(run_id, "run_id")
        validate_signal_name(name)
        if name.startswith(RESERVED_SIGNAL_PREFIX):
            raise InvalidName(f"signal names starting with {RESERVED_SIGNAL_PREFIX!r} are reserved")
        if signal_id is not None and not _SIGNAL_ID.fullmatch(signal_id):
            raise InvalidName(
                f"signal id {signal_id[:64]!r}: 1 to 200 characters of A-Z a-z 0-9 . _ : -"
            )
        who = self._sender(sender)
        body = encode(payload)
        if len(body) > self.settings.max_payload:
            raise PayloadTooLarge(
                f"signal payload is {len(body)} bytes; the limit is {self.settings.max_payload}",
                run_id=run_id,
            )
        await self._ensure()
        sid = signal_id or uuid.uuid4().hex
        # The broker's Msg-Id dedup spans the whole inbox: scope it to the run, so the same
        # signal id used for two runs is two signals. The intake dedups by Sojourn-Signal-Id.
        headers = {h.MSG_ID: f"signal:{run_id}:{sid}", h.SIGNAL_ID: sid, **outgoing()}
        subject = self.names.signal(run_id, name, who)
        if not wait:
            await self._publish(subject, body, headers)
            return sid
        reply = await self._publish_answered(subject, body, headers, timeout, who)
        if reply == "duplicate":
            # Sent before within the dedup window, and answered then: what happened to it is in
            # the run's history (recorded under its id, or refused because the run ended).
            snap = await current_snapshot(self.store, run_id)
            if snap is None or sid in snap.signal_ids or not snap.state.terminal:
                return sid
            raise TriggerRejected(
                "run_ended", f"run '{run_id}' has ended ({snap.state.status})", run_id=run_id
            )
        if isinstance(reply, IntakeError):
            raise TriggerRejected(reply.error.code, reply.error.message, run_id=run_id)
        return sid

    async def cancel(
        self,
        run_id: str,
        reason: str = "",
        *,
        by: str | None = None,
        terminate: bool = False,
        wait: bool = False,
        timeout: float = 5.0,
    ) -> None:
        """Ask for a run to be cancelled (durable: takes effect even if no worker is up).
        ``by`` (a name token, default the connection's user) is recorded as who asked.

        A running step is interrupted within about a second (an async one cancelled, a sync
        one abandoned in its thread); the agent's compensation (``on_cancel``) runs, then the
        run ends ``cancelled`` and its live children are cancelled. ``terminate=True`` is
        ``terminate``. With ``wait=True`` this waits up to ``timeout`` for the intake to
        record it, and raises ``TriggerRejected`` if it refused it (``unknown_run``...)."""
        validate_token(run_id, "run_id")
        who = self._sender(by)
        await self._ensure()
        body = encode(CancelBody(reason=reason, terminate=terminate))
        subject = self.names.cancel(run_id, who)
        headers = {h.MSG_ID: f"cancel:{run_id}:{uuid.uuid4().hex}"}
        if not wait:
            await self._publish(subject, body, headers)
            return
        reply = await self._publish_answered(subject, body, headers, timeout, who)
        if isinstance(reply, IntakeError):
            raise TriggerRejected(reply.error.code, reply.error.message, run_id=run_id)

    async def terminate(self, run_id: str, reason: str = "", *, by: str | None = None) -> None:
        """End a run at once without its compensation: a running step is interrupted as by
        ``cancel``, ``on_cancel`` does not run (nor the rest of a compensation under way), and
        the run ends ``cancelled``, its reason saying it was terminated. Its live children
        are terminated too."""
        await self.cancel(run_id, reason, by=by, terminate=True)


_SIGNAL_ID = re.compile(r"[A-Za-z0-9._:-]{1,200}")
"""A caller's signal id: it travels in a header and is recorded in the history."""


def _keyed(options: StartOptions) -> tuple[str | None, DebounceBody | None]:
    """The singleton key and the debounce of a start, checked as the intake would (decision
    0047), before anything is published.

    Raises:
        InvalidName: a key is empty, longer than 256 bytes or holds control characters.
        ValueError: a debounce out of range, without a key, or with a singleton key.
    """
    singleton_key = options.get("singleton_key")
    seconds, key = options.get("debounce"), options.get("debounce_key")
    inputs = options.get("debounce_inputs", "last")
    if singleton_key is not None:
        why = key_fault(singleton_key)
        if why is not None:
            raise InvalidName(f"singleton_key: {why}")
    if seconds is None:
        if key is not None or "debounce_inputs" in options:
            raise ValueError("debounce_key and debounce_inputs go with debounce")
        return singleton_key, None
    if singleton_key is not None:
        raise ValueError("a start has a singleton_key or a debounce, not both")
    if key is None:
        raise ValueError("a debounced start names its debounce_key")
    why = key_fault(key)
    if why is not None:
        raise InvalidName(f"debounce_key: {why}")
    if inputs not in ("last", "all"):
        raise ValueError(f'debounce_inputs is "last" or "all", not {inputs!r}')
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(f"debounce is seconds or a timedelta, not {type(seconds).__name__}")
    body = DebounceBody(seconds=float(seconds), key=key, inputs=inputs)
    why = debounce_fault(body)
    if why is not None:
        raise ValueError(why)
    return singleton_key, body


def _new_run_id() -> str:
    return uuid.uuid4().hex


def _fairness(options: StartOptions) -> Fairness:
    """The start's fairness key and weight, checked here as the intake would.

    Raises:
        InvalidName: a key that is not a fairness key, a weight out of range or without a key.
    """
    key, weight = options.get("fairness_key"), options.get("fairness_weight")
    if key is None:
        if weight is not None:
            raise InvalidName("fairness_weight needs a fairness_key")
        return Fairness()
    return validate_fairness(key, 1 if weight is None else weight)
