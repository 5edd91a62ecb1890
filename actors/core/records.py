"""The records a run's state keeps of its operations, signals and updates (``RunState.ops``,
``signals``, ``updates``): pure data, built by the fold in ``state.py``."""

from __future__ import annotations

import msgspec

from sojourn.schemas import events as ev
from sojourn.schemas.vocabulary import OpKind, OpStatus, WaitOutcome

__all__ = ["OpRecord", "SignalRecord", "UpdateRecord"]


class OpRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What history says happened at one position of the agent's code.

    ``kind`` is ``step``, a value kind (``now``, ``uuid``, ``random``...), ``wait`` or
    ``child`` (an ``OpKind``); ``name`` is the step's name, the value's kind as recorded, the
    wait's key or the child's agent. For steps, ``status`` is ``started`` (in doubt: it may have
    run), ``completed`` or ``failed``; a wait is ``waiting`` until it is ``completed``.
    """

    position: int
    kind: OpKind
    name: str
    status: OpStatus
    attempts: int = 0
    result: msgspec.Raw | None = None
    error: ev.ErrorInfo | None = None
    signals: tuple[str, ...] = ()
    deadline: float | None = None
    children: tuple[str, ...] = ()
    outcome: WaitOutcome | None = None
    detail: str | None = None
    sent_by: str | None = None
    """For a wait a signal ended: who sent it, and whether the broker authenticated that
    (``WaitCompleted.sent_by``, ``sender_verified``)."""
    sender_verified: bool | None = None
    interrupted: int = 0
    """Attempts in a row at this step that started and never ended before the one recorded
    last (their worker died mid-step): how a step that kills its worker is recognised."""
    limit: str | None = None
    """A step ``throttled``: the shared rate limit it waits for (its slot is ``deadline``, the
    limit's block epoch at the grant ``epoch``)."""
    epoch: int = 0


class SignalRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A received signal that no wait has consumed yet."""

    name: str
    payload: msgspec.Raw
    signal_id: str
    at: float = 0.0
    sent_by: str | None = None
    sender_verified: bool | None = None
    traceparent: str | None = None
    """The trace context the signal carried (``SignalReceived.traceparent``)."""


class UpdateRecord(msgspec.Struct, frozen=True, kw_only=True):
    """An update the run received (``UpdateRequested``) and, once decided, how: ``outcome``
    ``completed`` (applied at the wait at ``position``: a replay applies it there again) or
    ``rejected``; ``pending`` until then (decision 0042)."""

    update_id: str
    name: str
    payload: msgspec.Raw
    sent_by: str | None = None
    sender_verified: bool = False
    outcome: str = "pending"
    position: int | None = None
    answer: msgspec.Raw | None = None
    """The handler's answer (``completed`` without ``error``)."""
    error: ev.ErrorInfo | None = None
    """What the handler raised (``completed``: its changes stand)."""
    code: str | None = None
    """Why it was ``rejected`` (an ``UpdateRejectCode``), with ``message``."""
    message: str = ""
