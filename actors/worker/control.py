"""The events the intake records for a message about an existing run.

A signal, a resume, a budget change, an in-doubt step's decision and a child's end notice each
become a ``SignalReceived``, ``RunResumed`` or ``BudgetChanged`` (``events_for``), a cancel a
``CancelRequested`` (``cancel_body``, ``cancel_requested``). Each body is decoded and checked
here; what does not fit is ``Rejected``. Nothing here reads or writes the broker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import msgspec

from sojourn.broker import headers as h
from sojourn.broker.delivery import Delivery
from sojourn.broker.names import InboxSubject
from sojourn.schemas.codec import (
    decode_budget,
    decode_cancel,
    decode_child_outcome,
    decode_decision,
    decode_json,
    decode_pause,
    decode_resume,
    to_raw,
)
from sojourn.schemas.config import Settings
from sojourn.schemas.events import (
    Budget,
    BudgetChanged,
    CancelRequested,
    PauseLifted,
    PauseRequested,
    RunEvent,
    RunResumed,
    SignalReceived,
)
from sojourn.schemas.tracing import valid_traceparent
from sojourn.schemas.wire import CHILD_SIGNAL, DECIDE_SIGNAL, CancelBody, InDoubtDecision

from ..core.state import RunState
from .refusals import Rejected

__all__ = ["cancel_body", "cancel_requested", "events_for", "signal_id"]

T = TypeVar("T")


def events_for(
    msg: Delivery,
    inbox: InboxSubject,
    state: RunState,
    *,
    settings: Settings,
    authenticated: bool,
    now: float,
) -> list[RunEvent]:
    """The events a signal-like message records (none when it changes nothing), stamped
    ``now`` (the runs' clock). ``authenticated``: this worker's connection has a user (every
    sender is the broker's word).

    A decision on a suspended run also resumes it, in the same append: sent as two
    messages, the resume could be handled first (by another worker's intake), and the run
    would replay, find no decision and suspend again with the decision left unread.
    """
    events: list[RunEvent] = []
    event = _event_for(msg, inbox, state, settings, authenticated, now)
    if event is not None:
        events.append(event)
        if inbox.kind == "decide" and state.status == "suspended":
            position = inbox.name.split(".")[0]
            note = f"decided for the step at position {position}"
            events.append(RunResumed(by=inbox.sender, note=note, at=now))
        elif inbox.kind == "budget" and state.suspended_reason == "budget":
            # Resumed by the change, not granted the old budget again: the run checks its
            # new limits at its next step (and suspends again if one is still used up).
            note = "budget changed"
            events.append(RunResumed(by=inbox.sender, note=note, grant=False, at=now))
    return events


def _event_for(
    msg: Delivery,
    inbox: InboxSubject,
    state: RunState,
    settings: Settings,
    authenticated: bool,
    now: float,
) -> RunEvent | None:
    """The event a signal-like message records, or ``None`` when it changes nothing."""
    sender = inbox.sender
    if inbox.kind == "budget":
        shape = 'budget body must be limits like {"usd": 5, "steps": 100}'
        body = _decoded(decode_budget, msg.data, shape)
        if body.empty:
            raise Rejected("invalid_trigger", "a budget change names at least one limit")
        return BudgetChanged(budget=Budget(**msgspec.structs.asdict(body)), by=sender, at=now)
    if inbox.kind == "pause":
        reason = ""
        if msg.data.strip():
            reason = _decoded(decode_pause, msg.data, 'pause body must be {"reason": ...}').reason
        if state.pause is not None or state.status == "suspended":
            return None  # paused already (or held by a suspension): a no-op
        return PauseRequested(by=sender, reason=reason, at=now)
    if inbox.kind == "resume":
        note = ""
        if msg.data.strip():
            note = _decoded(decode_resume, msg.data, 'resume body must be {"note": ...}').note
        if state.pause is not None and state.status != "suspended":
            return PauseLifted(by=sender, at=now)  # paused, not held yet: it goes on
        if state.status != "suspended":
            return None  # resumed already: a no-op
        return RunResumed(by=sender, note=note, at=now)
    name = inbox.name
    if inbox.kind == "decide":
        shape = 'decision must be {"action": "retry"|"skip"|"fail", "result": ...}'
        decision = _decoded(decode_decision, msg.data, shape)
        name = f"{DECIDE_SIGNAL}.{inbox.name}"
        payload = to_raw(InDoubtDecision(action=decision.action, result=decision.result, by=sender))
    elif inbox.kind == "child":
        outcome = _decoded(decode_child_outcome, msg.data, "child notice is not a ChildOutcome")
        if outcome.child_run_id != inbox.name:
            raise Rejected("invalid_trigger", "child notice names another child run")
        name = f"{CHILD_SIGNAL}.{inbox.name}"
        payload = to_raw(outcome)
    else:
        try:
            payload = to_raw(decode_json(msg.data)) if msg.data.strip() else to_raw(None)
        except msgspec.DecodeError as e:
            raise Rejected("invalid_json", f"signal payload is not valid JSON: {e}") from e
    if len(state.signals) >= settings.max_buffered_signals:
        raise Rejected(
            "too_many_signals",
            f"run holds {len(state.signals)} unconsumed signals (the limit is "
            f"{settings.max_buffered_signals}, Settings.max_buffered_signals)",
        )
    return SignalReceived(
        name=name,
        payload=payload,
        signal_id=signal_id(msg, inbox),
        sent_by=sender,
        # Under authentication (our own connection has a user) the broker let only that
        # user, or a gateway speaking for it, publish as ``sender``.
        sender_verified=sender is not None and authenticated,
        traceparent=valid_traceparent(msg.header(h.TRACEPARENT)),
        at=now,
    )


def signal_id(msg: Delivery, inbox: InboxSubject) -> str:
    """The id a signal-like message is recorded under (a signal counts once per id)."""
    if inbox.kind == "child":
        return f"child-end:{inbox.name}"
    if inbox.kind == "decide":
        return f"decide:{inbox.name}:{msg.stream_seq}"
    sid = msg.header(h.SIGNAL_ID) or msg.header(h.MSG_ID)
    if sid and len(sid) <= 256:
        return sid
    return f"inbox-{msg.stream_seq}"


def cancel_body(data: bytes) -> CancelBody:
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


def cancel_requested(body: CancelBody, sender: str | None, now: float) -> CancelRequested:
    """The event a cancel message with ``body``, sent as ``sender``, records at ``now``."""
    return CancelRequested(reason=body.reason, by=sender, terminate=body.terminate, at=now)


def _decoded(decode: Callable[[bytes], T], data: bytes, shape: str) -> T:
    """``decode(data)``; a body that does not decode is refused, saying what ``shape`` it
    must have.

    Raises:
        Rejected: ``invalid_trigger``.
    """
    try:
        return decode(data)
    except msgspec.MsgspecError as e:
        raise Rejected("invalid_trigger", f"{shape}: {e}") from e
