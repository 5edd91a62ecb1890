"""sojourn.schemas: the wire and event types, one codec, the exception tree. No I/O.

Example:
    >>> from sojourn.schemas import RunStarted, decode_events, encode_events, to_raw
    >>> ev = RunStarted(run_id="r1", agent="greeter", input=to_raw({"name": "Ada"}))
    >>> decode_events(encode_events([ev]))[0].agent
    'greeter'
"""

from .codec import (
    decode_dead_letter,
    decode_events,
    decode_intake_reply,
    decode_start,
    encode,
    encode_events,
    from_raw,
    to_raw,
)
from .errors import (
    BrokerUnavailable,
    BrokerVersionError,
    ConcurrencyConflict,
    Fenced,
    InvalidName,
    NondeterminismError,
    PayloadTooLarge,
    RunNotFound,
    ServerStartError,
    SojournError,
    StepError,
    UnknownAgent,
)
from .events import (
    CancelRequested,
    ErrorInfo,
    Event,
    RunCancelled,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunResumed,
    RunStarted,
    RunSuspended,
    StepCompleted,
    StepFailed,
    StepStarted,
    TriggerInfo,
    ValueRecorded,
)
from .export import WIRE_SCHEMAS, export_schemas
from .wire import REJECT_CODES, DeadLetter, ErrorBody, IntakeError, IntakeOk, StartTrigger

__all__ = [
    "REJECT_CODES",
    "WIRE_SCHEMAS",
    "BrokerUnavailable",
    "BrokerVersionError",
    "CancelRequested",
    "ConcurrencyConflict",
    "DeadLetter",
    "ErrorBody",
    "ErrorInfo",
    "Event",
    "Fenced",
    "IntakeError",
    "IntakeOk",
    "InvalidName",
    "NondeterminismError",
    "PayloadTooLarge",
    "RunCancelled",
    "RunCompleted",
    "RunEvent",
    "RunFailed",
    "RunNotFound",
    "RunResumed",
    "RunStarted",
    "RunSuspended",
    "ServerStartError",
    "SojournError",
    "StartTrigger",
    "StepCompleted",
    "StepError",
    "StepFailed",
    "StepStarted",
    "TriggerInfo",
    "UnknownAgent",
    "ValueRecorded",
    "decode_dead_letter",
    "decode_events",
    "decode_intake_reply",
    "decode_start",
    "encode",
    "encode_events",
    "export_schemas",
    "from_raw",
    "to_raw",
]
