"""The events a run's history is made of.

Rules (see docs/decisions/0001-events.md): tags are explicit, stable and versioned; a new field
gets a default; a field never changes type; an event that ships is decodable forever (the golden
file in tests/schemas/golden_events.jsonl holds one sample of every tag). Events are open-world:
unknown fields are ignored, so an older worker can read a newer worker's history.

Payloads chosen by users (run input and output, step results, recorded values) are kept as raw
JSON (``msgspec.Raw``) so that history is decoded without knowing user types; the actor layer
converts them with the agent's annotations.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = [
    "CancelRequested",
    "ErrorInfo",
    "Event",
    "RunCancelled",
    "RunCompleted",
    "RunEvent",
    "RunFailed",
    "RunResumed",
    "RunStarted",
    "RunSuspended",
    "StepCompleted",
    "StepFailed",
    "StepStarted",
    "TriggerInfo",
    "ValueRecorded",
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

    reason: Literal["nondeterminism", "poison", "cap", "in_doubt", "manual"]
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
    position: int
    name: str
    attempt: int = 1
    error: ErrorInfo
    duration: float = 0.0


class ValueRecorded(Event, tag="value.recorded.v1", frozen=True, kw_only=True):
    """A non-deterministic value (``ctx.now()``, ``ctx.uuid()``, ``ctx.random()``) journaled."""

    position: int
    kind: Literal["now", "uuid", "random"]
    value: msgspec.Raw


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
)
"""Every event that may appear in a run's history (a tagged union)."""
