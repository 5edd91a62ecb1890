"""The one place that turns sojourn messages into bytes and back.

Encoders and decoders are built once and reused (msgspec's fast path). Nobody else in the code
base calls ``msgspec.json.decode`` on wire data: a schema change then touches one module.

A run-event *message* holds one decision: a JSON array of one or more events, appended
atomically with a single sequence number (see docs/decisions/0002-one-message-per-decision.md).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec

from .concurrency import QueueEntry, SlotsRecord
from .events import HistoryEntry, RunEvent, SpendValue
from .flow import DebounceRecord, SingletonRecord
from .guard import check_depth
from .health import WatchClaim, WedgeRecord, WorkerBeat
from .holds import AgentHold, HeldRun, HoldAnswer, HoldRequest
from .limits import LimitAnswer, LimitRecord, LimitRequest
from .schedules import ScheduleAnswer, ScheduleRecord, ScheduleRequest
from .steps import STEPS_KEPT, STEPS_RECORD_MAX, RunSteps
from .updates import UpdateBody
from .views import RunsQuery, RunView
from .wire import (
    BudgetBody,
    CancelBody,
    ChildOutcome,
    DeadLetter,
    InDoubtDecision,
    IntakeError,
    IntakeOk,
    LeaseHolder,
    PauseBody,
    ResumeBody,
    StartTrigger,
)

__all__ = [
    "decode_budget",
    "decode_cancel",
    "decode_child_outcome",
    "decode_dead_letter",
    "decode_debounce_record",
    "decode_decision",
    "decode_events",
    "decode_held_run",
    "decode_hold",
    "decode_hold_answer",
    "decode_hold_request",
    "decode_intake_reply",
    "decode_json",
    "decode_lease_holder",
    "decode_limit_answer",
    "decode_limit_record",
    "decode_limit_request",
    "decode_pause",
    "decode_queue_entry",
    "decode_resume",
    "decode_run_steps",
    "decode_schedule_answer",
    "decode_schedule_record",
    "decode_schedule_request",
    "decode_singleton_record",
    "decode_slots_record",
    "decode_spend",
    "decode_start",
    "decode_update",
    "decode_watch_claim",
    "decode_wedge_record",
    "decode_worker_beat",
    "encode",
    "encode_events",
    "from_raw",
    "peek_run_id",
    "to_raw",
]

T = TypeVar("T")

_encoder = msgspec.json.Encoder()


class _Decoder(Generic[T]):
    """msgspec's decoder for one type, behind the depth gate: whatever the bytes, it returns a
    value or raises ``msgspec.DecodeError`` / ``msgspec.ValidationError``, never
    ``RecursionError`` (``guard.check_depth``, ``RECORD_DEPTH``)."""

    __slots__ = ("_decoder",)

    def __init__(self, type: type[T]) -> None:
        self._decoder: msgspec.json.Decoder[T] = msgspec.json.Decoder(type)

    def decode(self, data: bytes | memoryview) -> T:
        check_depth(data)
        return self._decoder.decode(data)


_events_decoder = _Decoder(list[RunEvent])
_history_decoder = _Decoder(list[HistoryEntry])
_start_decoder = _Decoder(StartTrigger)
_dlq_decoder = _Decoder(DeadLetter)
_beat_decoder = _Decoder(WorkerBeat)
_wedge_decoder = _Decoder(WedgeRecord)
_claim_decoder = _Decoder(WatchClaim)
_cancel_decoder = _Decoder(CancelBody)
_resume_decoder = _Decoder(ResumeBody)
_pause_decoder = _Decoder(PauseBody)
_hold_request_decoder = _Decoder(HoldRequest)
_hold_decoder = _Decoder(AgentHold)
_held_decoder = _Decoder(HeldRun)
_hold_answer_decoder = _Decoder(HoldAnswer)
_limit_record_decoder = _Decoder(LimitRecord)
_limit_request_decoder = _Decoder(LimitRequest)
_limit_answer_decoder = _Decoder(LimitAnswer)
_budget_decoder = _Decoder(BudgetBody)
_decision_decoder = _Decoder(InDoubtDecision)
_steps_decoder = _Decoder(RunSteps)
_outcome_decoder = _Decoder(ChildOutcome)
_schedule_request_decoder = _Decoder(ScheduleRequest)
_schedule_record_decoder = _Decoder(ScheduleRecord)
_singleton_record_decoder = _Decoder(SingletonRecord)
_debounce_record_decoder = _Decoder(DebounceRecord)
_slots_record_decoder = _Decoder(SlotsRecord)
_queue_entry_decoder = _Decoder(QueueEntry)
_schedule_answer_decoder = _Decoder(ScheduleAnswer)
_update_decoder = _Decoder(UpdateBody)


def encode(obj: Any) -> bytes:
    """Encode any msgspec-supported value as JSON."""
    return _encoder.encode(obj)


def encode_events(events: list[RunEvent] | tuple[RunEvent, ...]) -> bytes:
    """Encode one decision (a list of events) as the body of one stream message."""
    return _encoder.encode(events)


def decode_events(data: bytes) -> list[RunEvent]:
    """Decode one stream message into its events. Raises ``msgspec.DecodeError``."""
    return _events_decoder.decode(data)


def decode_history(data: bytes) -> list[HistoryEntry]:
    """Decode a history as ``sojourn history RUN --json`` prints it. Raises
    ``msgspec.DecodeError`` or ``msgspec.ValidationError``."""
    return _history_decoder.decode(data)


def decode_start(data: bytes) -> StartTrigger:
    """Decode a start trigger. Raises ``msgspec.DecodeError`` (bad JSON) or
    ``msgspec.ValidationError`` (wrong shape, unknown field)."""
    return _start_decoder.decode(data)


class _RunIdHint(msgspec.Struct):
    run_id: str | None = None


_hint_decoder = _Decoder(_RunIdHint)


def decode_json(data: bytes) -> Any:
    """Plain JSON (for signal payloads, whose type only the waiting code knows). Raises
    ``msgspec.DecodeError`` (``guard.BodyRefused`` for a body nested too deep)."""
    check_depth(data)
    return msgspec.json.decode(data)


def peek_run_id(data: bytes) -> str | None:
    """The ``run_id`` of a trigger if it has a usable one, without validating the rest."""
    try:
        return _hint_decoder.decode(data).run_id
    except msgspec.MsgspecError:
        return None


def decode_intake_reply(data: bytes) -> IntakeOk | IntakeError:
    """Decode the intake's answer; the two shapes are told apart by the ``error`` key."""
    raw = decode_json(data)
    if isinstance(raw, dict) and "error" in raw:
        return msgspec.convert(raw, IntakeError)
    return msgspec.convert(raw, IntakeOk)


def decode_schedule_request(data: bytes) -> ScheduleRequest:
    """Decode a schedule request (closed). Raises ``msgspec.DecodeError`` or
    ``msgspec.ValidationError``."""
    return _schedule_request_decoder.decode(data)


def decode_schedule_record(data: bytes) -> ScheduleRecord:
    """Decode a schedule's record as the broker keeps it."""
    return _schedule_record_decoder.decode(data)


def decode_singleton_record(data: bytes) -> SingletonRecord:
    """Decode a singleton key's record as the broker keeps it (decision 0047)."""
    return _singleton_record_decoder.decode(data)


def decode_debounce_record(data: bytes) -> DebounceRecord:
    """Decode a debounce key's burst record as the broker keeps it (decision 0047)."""
    return _debounce_record_decoder.decode(data)


def decode_slots_record(data: bytes) -> SlotsRecord:
    """Decode a concurrency key's slots record as the broker keeps it (decision 0048)."""
    return _slots_record_decoder.decode(data)


def decode_queue_entry(data: bytes) -> QueueEntry:
    """Decode a concurrency key's queue entry as the broker keeps it (decision 0048)."""
    return _queue_entry_decoder.decode(data)


def decode_schedule_answer(data: bytes) -> ScheduleAnswer | IntakeError:
    """Decode the intake's answer to a schedule request (told apart by the ``error`` key)."""
    raw = decode_json(data)
    if isinstance(raw, dict) and "error" in raw:
        return msgspec.convert(raw, IntakeError)
    return _schedule_answer_decoder.decode(data)


def decode_cancel(data: bytes) -> CancelBody:
    return _cancel_decoder.decode(data)


def decode_update(data: bytes) -> UpdateBody:
    """An update message's body (``client.update``)."""
    return _update_decoder.decode(data)


def decode_resume(data: bytes) -> ResumeBody:
    return _resume_decoder.decode(data)


def decode_pause(data: bytes) -> PauseBody:
    return _pause_decoder.decode(data)


def decode_hold_request(data: bytes) -> HoldRequest:
    return _hold_request_decoder.decode(data)


def decode_hold(data: bytes) -> AgentHold:
    return _hold_decoder.decode(data)


def decode_held_run(data: bytes) -> HeldRun:
    return _held_decoder.decode(data)


def decode_hold_answer(data: bytes) -> HoldAnswer | IntakeError:
    """Decode the intake's answer to a hold request (told apart by the ``error`` key)."""
    raw = decode_json(data)
    if isinstance(raw, dict) and "error" in raw:
        return msgspec.convert(raw, IntakeError)
    return _hold_answer_decoder.decode(data)


def decode_limit_record(data: bytes) -> LimitRecord:
    return _limit_record_decoder.decode(data)


def decode_limit_request(data: bytes) -> LimitRequest:
    return _limit_request_decoder.decode(data)


def decode_limit_answer(data: bytes) -> LimitAnswer | IntakeError:
    """Decode the intake's answer to a limit request (told apart by the ``error`` key)."""
    raw = decode_json(data)
    if isinstance(raw, dict) and "error" in raw:
        return msgspec.convert(raw, IntakeError)
    return _limit_answer_decoder.decode(data)


def decode_budget(data: bytes) -> BudgetBody:
    return _budget_decoder.decode(data)


def decode_decision(data: bytes) -> InDoubtDecision:
    return _decision_decoder.decode(data)


def decode_child_outcome(data: bytes) -> ChildOutcome:
    return _outcome_decoder.decode(data)


def decode_dead_letter(data: bytes) -> DeadLetter:
    return _dlq_decoder.decode(data)


def decode_worker_beat(data: bytes) -> WorkerBeat:
    return _beat_decoder.decode(data)


def decode_wedge_record(data: bytes) -> WedgeRecord:
    return _wedge_decoder.decode(data)


def decode_watch_claim(data: bytes) -> WatchClaim:
    return _claim_decoder.decode(data)


_lease_decoder = _Decoder(LeaseHolder)


def decode_lease_holder(data: bytes) -> LeaseHolder:
    """A lease message body (``<prefix>.lease.<run_id>``)."""
    return _lease_decoder.decode(data)


def to_raw(value: Any) -> msgspec.Raw:
    """Encode a user value (struct, dataclass, dict, ...) to raw JSON for an event field."""
    return msgspec.Raw(_encoder.encode(value))


def from_raw(raw: msgspec.Raw | bytes, type: type[T] | Any = Any) -> T:
    """Decode raw JSON from an event field into ``type`` (``Any`` gives plain JSON values)."""
    data = bytes(raw)
    check_depth(data)
    return msgspec.json.decode(data, type=type)


def decode_spend(raw: msgspec.Raw | bytes) -> SpendValue | None:
    """A recorded ``spend`` value, ``None`` if it is not one: the folds are total, so a value
    they cannot read counts nothing rather than failing."""
    try:
        return from_raw(raw, SpendValue)
    except msgspec.MsgspecError:
        return None


def decode_run_steps(data: bytes) -> RunSteps:
    """A run's step record (``RunSteps``, decision 0040) from bytes anyone may have written:
    refused (``msgspec.DecodeError`` / ``msgspec.ValidationError``) when larger than
    ``STEPS_RECORD_MAX``, nested deeper than a record, not one, or holding more than
    ``STEPS_KEPT`` steps; never another error."""
    if len(data) > STEPS_RECORD_MAX:
        raise msgspec.DecodeError(f"a steps record of {len(data)} bytes (most: {STEPS_RECORD_MAX})")
    record = _steps_decoder.decode(data)
    if len(record.steps) > STEPS_KEPT:
        raise msgspec.ValidationError(f"a steps record of {len(record.steps)} steps")
    return record


def decode_run_view(data: bytes | str) -> RunView:
    """A run's view: a runs-bucket value, a change message's body, a read-model row.

    Raises:
        msgspec.DecodeError / msgspec.ValidationError: not a ``RunView``.
    """
    return from_raw(data.encode() if isinstance(data, str) else data, RunView)


def decode_runs_query(data: bytes) -> RunsQuery:
    """A run listing request (closed: an unknown field is an error); empty means the defaults.

    Raises:
        msgspec.DecodeError / msgspec.ValidationError: not a ``RunsQuery``.
    """
    return from_raw(data, RunsQuery) if data.strip() else RunsQuery()
