"""The events a run's history is made of.

Rules (docs/decisions/0001-events-and-schema-evolution.md): tags are explicit, stable and
versioned; a new field gets a default; a field never changes type; an event that ships is
decodable forever (tests/schemas/golden_events.jsonl holds samples of every tag). Events are
open-world: unknown fields are ignored, so an older worker can read a newer worker's history.

Payloads chosen by users (run input and output, step results, recorded values) are kept as raw
JSON (``msgspec.Raw``) so that history is decoded without knowing user types; the actor layer
converts them with the agent's annotations.
"""

from __future__ import annotations

import msgspec

from .vocabulary import WaitOutcome

__all__ = [
    "CancelRequested",
    "ChildStarted",
    "ErrorInfo",
    "Event",
    "HistoryEntry",
    "RunCancelled",
    "RunCompleted",
    "RunEvent",
    "RunFailed",
    "RunResumed",
    "RunStarted",
    "RunSuspended",
    "SignalReceived",
    "SpendValue",
    "StepCompleted",
    "StepFailed",
    "StepStarted",
    "TriggerInfo",
    "ValueRecorded",
    "WaitCompleted",
    "WaitStarted",
]


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True):
    """An exception recorded as data: never pickled, identical on replay."""

    type: str
    message: str
    traceback: str | None = None


class TriggerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Where a run came from: the inbox message that started it (for idempotent intake)."""

    inbox_seq: int = 0
    msg_id: str | None = None
    received_at: float = 0.0


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of every run event. ``at`` is the writer's wall clock (unix seconds)."""

    at: float = 0.0


class RunStarted(Event, tag="run.started.v1", frozen=True, kw_only=True):
    run_id: str
    agent: str
    input: msgspec.Raw
    code_version: str | None = None
    trigger: TriggerInfo = TriggerInfo()
    parent_run_id: str | None = None
    budget_usd: float | None = None
    """The agent's budget when the run started (``Agent(budget_usd=...)``), for read models:
    the code in effect decides, this records what it said."""
    budget_tokens: int | None = None


class RunCompleted(Event, tag="run.completed.v1", frozen=True, kw_only=True):
    output: msgspec.Raw


class RunFailed(Event, tag="run.failed.v1", frozen=True, kw_only=True):
    error: ErrorInfo


class CancelRequested(Event, tag="run.cancel_requested.v1", frozen=True, kw_only=True):
    """Written by the intake; the run's owner turns it into ``RunCancelled``."""

    reason: str = ""
    by: str | None = None


class RunCancelled(Event, tag="run.cancelled.v1", frozen=True, kw_only=True):
    reason: str = ""


class RunSuspended(Event, tag="run.suspended.v1", frozen=True, kw_only=True):
    """The run is parked for a human: replay diverged, a cap was hit, a step is in doubt."""

    reason: str
    """A ``SuspendReason`` (``sojourn.schemas.vocabulary``): ``nondeterminism``, ``cap``,
    ``budget``, ``in_doubt``, ``crash_loop``; ``poison`` and ``manual`` are reserved. A plain
    string on purpose, not the Literal: a newer reason must never make an older reader fail
    (decision 0001 allows widening a set of strings, never narrowing one)."""
    detail: str


class RunResumed(Event, tag="run.resumed.v1", frozen=True, kw_only=True):
    """A human (or a deploy) lifted a suspension; the run replays again."""

    by: str | None = None
    note: str = ""


class StepStarted(Event, tag="step.started.v1", frozen=True, kw_only=True):
    """Written before a step's function runs: the effect ledger's "may have happened" mark."""

    position: int
    name: str
    attempt: int = 1


class StepCompleted(Event, tag="step.completed.v1", frozen=True, kw_only=True):
    position: int
    name: str
    attempt: int = 1
    result: msgspec.Raw
    duration: float = 0.0


class StepFailed(Event, tag="step.failed.v1", frozen=True, kw_only=True):
    """One failed attempt. ``retry_at`` set: another attempt is due then (a broker timer wakes
    the run); ``None``: the failure is final and the agent sees ``StepError``."""

    position: int
    name: str
    attempt: int = 1
    error: ErrorInfo
    duration: float = 0.0
    retry_at: float | None = None


class SpendValue(msgspec.Struct, frozen=True):
    """The value a ``ctx.spend`` call records: a ``ValueRecorded`` of kind ``spend``."""

    usd: float = 0.0
    tokens: int = 0


class ValueRecorded(Event, tag="value.recorded.v1", frozen=True, kw_only=True):
    """A non-deterministic value (``ctx.now()``, ``ctx.uuid()``, ``ctx.random()``) journaled."""

    position: int
    kind: str
    """A ``ValueKind`` (``now``, ``uuid``, ``random``, ``spend``); a plain string like
    ``RunSuspended.reason``, so a new kind never breaks an older reader."""
    value: msgspec.Raw


class WaitStarted(Event, tag="wait.started.v1", frozen=True, kw_only=True):
    """The run parks at ``position`` until one of ``signals`` arrives or ``deadline`` passes.

    ``key`` names the wait for replay checks (``sleep``, ``poll``, ``signal:docs.signed``,
    ``select:a|b``, ``child:<run>``): ``WaitKey(...).format()``, read with ``WaitKey.parse``
    (``sojourn.schemas.vocabulary``); stored as text, compared as text. A deadline is kept by
    the broker as a message schedule on ``<prefix>.timer.<run_id>.<position>`` that targets the
    run's wake subject.
    """

    position: int
    key: str
    signals: tuple[str, ...] = ()
    deadline: float | None = None
    children: tuple[str, ...] = ()


class WaitCompleted(Event, tag="wait.completed.v1", frozen=True, kw_only=True):
    """The wait at ``position`` ended: by a signal (which one: ``signal_id``), a timeout, or a
    child run ending. ``payload`` is what the code receives (JSON ``null`` on timeout)."""

    position: int
    key: str
    outcome: WaitOutcome
    payload: msgspec.Raw
    signal: str | None = None
    signal_id: str | None = None
    child_status: str | None = None
    """For ``outcome == "child"``: the child's ``ChildStatus`` (``completed``, ``failed`` or
    ``cancelled`` so far). A plain string, not the Literal: it was shipped as one, and a narrower
    type would make a newer status a poison history for older readers (decision 0001)."""


class SignalReceived(Event, tag="signal.received.v1", frozen=True, kw_only=True):
    """Written by the intake: a signal for this run, buffered until a wait consumes it."""

    name: str
    payload: msgspec.Raw
    signal_id: str
    sent_by: str | None = None


class ChildStarted(Event, tag="child.started.v1", frozen=True, kw_only=True):
    """The run started a child run (deterministic id ``<run_id>-c<position>``)."""

    position: int
    child_run_id: str
    agent: str


RunEvent = (
    RunStarted
    | RunCompleted
    | RunFailed
    | CancelRequested
    | RunCancelled
    | RunSuspended
    | RunResumed
    | StepStarted
    | StepCompleted
    | StepFailed
    | ValueRecorded
    | WaitStarted
    | WaitCompleted
    | SignalReceived
    | ChildStarted
)
"""Every event that may appear in a run's history (a tagged union)."""


class HistoryEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One stored decision as ``sojourn history RUN --json`` prints it (a JSON array of
    these): what ``sojourn replay --from-file`` reads, so a team can keep golden histories."""

    seq: int
    writer: str
    events: list[RunEvent]
