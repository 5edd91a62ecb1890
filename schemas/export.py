"""JSON Schemas of the wire messages, for clients written in other languages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from .events import RunEvent
from .gateway import (
    CallbackAnswer,
    CancelAnswer,
    HistoryEntry,
    KeyedStartAnswer,
    Problem,
    SignalAnswer,
    StartAnswer,
)
from .schedules import ScheduleAnswer, ScheduleRecord, ScheduleRequest
from .steps import RunSteps
from .updates import UpdateAnswer, UpdateBody
from .views import Chunk, RunsPage, RunsQuery, RunView
from .wire import (
    CancelBody,
    ChildOutcome,
    DeadLetter,
    IntakeError,
    IntakeOk,
    ResumeBody,
    StartTrigger,
)

__all__ = ["WIRE_SCHEMAS", "export_schemas", "schema_of"]

WIRE_SCHEMAS: dict[str, Any] = {
    "start-trigger": StartTrigger,
    "intake-reply-ok": IntakeOk,
    "intake-reply-error": IntakeError,
    "dead-letter": DeadLetter,
    "child-outcome": ChildOutcome,
    "cancel-body": CancelBody,
    "resume-body": ResumeBody,
    "run-event": RunEvent,
    "run-event-message": list[RunEvent],
    "run-view": RunView,
    "run-steps": RunSteps,
    "runs-query": RunsQuery,
    "runs-page": RunsPage,
    "output-chunk": Chunk,
    "schedule-request": ScheduleRequest,
    "schedule-answer": ScheduleAnswer,
    "schedule-record": ScheduleRecord,
    "http-problem": Problem,
    "http-start-answer": StartAnswer,
    "http-keyed-start-answer": KeyedStartAnswer,
    "http-signal-answer": SignalAnswer,
    "http-callback-answer": CallbackAnswer,
    "http-cancel-answer": CancelAnswer,
    "http-history-entry": HistoryEntry,
    "update-body": UpdateBody,
    "http-update-answer": UpdateAnswer,
}
"""Schema file stem -> type. ``run-event-message`` is the body of one run-event message;
``http-*`` are the HTTP gateway's bodies (its OpenAPI document uses these same schemas)."""


def schema_of(tp: Any) -> dict[str, Any]:
    return msgspec.json.schema(tp)


def export_schemas(out_dir: str | Path) -> list[Path]:
    """Write ``<name>.schema.json`` for every wire type into ``out_dir``; return the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, tp in WIRE_SCHEMAS.items():
        path = out / f"{name}.schema.json"
        schema = schema_of(tp)
        schema.setdefault("$schema", "https://json-schema.org/draft/2020-12/schema")
        schema.setdefault("title", name)
        path.write_bytes(msgspec.json.format(msgspec.json.encode(schema), indent=2) + b"\n")
        written.append(path)
    return written
