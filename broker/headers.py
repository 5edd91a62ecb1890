"""Message header names, in one place: JetStream's own and sojourn's.

JetStream reads the ``Nats-`` headers a publisher sets (deduplication, the sequence fence, per
message TTLs, message schedules) and sets others on what it stores or delivers (a direct get's
``Nats-Sequence``, ``Nats-Subject``, ``Nats-Time-Stamp``; a fired schedule's
``Nats-Scheduler``). The ``Sojourn-`` headers are sojourn's own (docs/wire.md).
"""

from __future__ import annotations

from typing import Final

from sojourn.schemas import fairness as _fairness

__all__ = [
    "DESCRIPTION",
    "DLQ_NOTE",
    "EXPECTED_LAST_SUBJECT_SEQUENCE",
    "FAIRNESS_KEY",
    "FAIRNESS_WEIGHT",
    "MSG_ID",
    "NUM_PENDING",
    "REPLY_TO",
    "SCHEDULE",
    "SCHEDULER",
    "SCHEDULE_TARGET",
    "SEQUENCE",
    "SIGNAL_ID",
    "STATUS",
    "SUBJECT",
    "TIME_STAMP",
    "TRACEPARENT",
    "TRACESTATE",
    "TTL",
    "WAKE_REASON",
    "WRITER",
]

# --- set by a publisher, read by JetStream ------------------------------------------------------

MSG_ID: Final = "Nats-Msg-Id"
"""Deduplication id: a second publish with the same id within the stream's duplicate window is
acknowledged as a duplicate and not stored again."""

EXPECTED_LAST_SUBJECT_SEQUENCE: Final = "Nats-Expected-Last-Subject-Sequence"
"""The fence: the publish is stored only if the subject's last message has this stream sequence
(``0``: the subject has no message yet)."""

TTL: Final = "Nats-TTL"
"""How long the stream keeps this message (``24h``); the stream must allow message TTLs."""

SCHEDULE: Final = "Nats-Schedule"
"""A message schedule (``@at <RFC 3339>``): the stream publishes a message when it is due."""

SCHEDULE_TARGET: Final = "Nats-Schedule-Target"
"""The subject a due schedule publishes to."""

# --- set by JetStream on what it stores, delivers or answers ------------------------------------

BATCH_ID: Final = "Nats-Batch-Id"
"""An atomic batch publish: the batch every message of it names (``Broker.try_publish_batch``)."""

BATCH_SEQUENCE: Final = "Nats-Batch-Sequence"
"""An atomic batch publish: the message's place in its batch, from 1, without gaps."""

BATCH_COMMIT: Final = "Nats-Batch-Commit"
"""An atomic batch publish: ``1`` on the last message, which commits the batch."""

KV_OPERATION: Final = "KV-Operation"
"""On a NATS KV entry: ``DEL`` or ``PURGE`` marks the key deleted (the runs bucket deletes the
pending view of a refused start)."""

SEQUENCE: Final = "Nats-Sequence"
"""A direct get's answer: the stream sequence of the message."""

SUBJECT: Final = "Nats-Subject"
"""A direct get's answer: the subject the message was stored on."""

TIME_STAMP: Final = "Nats-Time-Stamp"
"""A direct get's answer: when the message was stored (RFC 3339, nanoseconds)."""

NUM_PENDING: Final = "Nats-Num-Pending"
"""A batched direct get's end marker: how many more messages match."""

SCHEDULER: Final = "Nats-Scheduler"
"""On a message a schedule published (a fired timer): the schedule's subject."""

STATUS: Final = "Status"
"""A status answer's code (``404``, ``503``, ``204``...)."""

DESCRIPTION: Final = "Description"
"""A status answer's text."""

# --- sojourn's own ------------------------------------------------------------------------------

REPLY_TO: Final = "Sojourn-Reply-To"
"""On an inbox message: where the intake answers (only a request/reply inbox, ``_INBOX.<...>``,
is ever answered)."""

SIGNAL_ID: Final = "Sojourn-Signal-Id"
"""On a signal: its id, which makes a retried send count once."""

WRITER: Final = "Sojourn-Writer"
"""On an event message: the activation (or intake) that appended it."""

WAKE_REASON: Final = "Sojourn-Wake-Reason"
"""On a wake or a timer: why the run was woken (``start``, ``signal``, ``timer``...)."""

FAIRNESS_KEY: Final = _fairness.FAIRNESS_KEY
"""On a start and on its run's wakes: the run's fairness key (``sojourn.schemas.fairness``)."""

FAIRNESS_WEIGHT: Final = _fairness.FAIRNESS_WEIGHT
"""Next to ``FAIRNESS_KEY``: the key's weight, 1 to 1000 (absent: 1)."""

DLQ_NOTE: Final = "Sojourn-Dlq-Note"
"""In a dead-letter record's headers: that the original headers were cut to fit."""

GARBLED: Final = "Sojourn-Headers-Garbled"
"""Set by this process, never by a sender that means well: the message's header block could
not be parsed (its value says why). Any sojourn reader refuses such a message
(``invalid_headers``) rather than guess at what it says."""


# --- W3C Trace Context (docs/operations.md, "Tracing") ------------------------------------------

TRACEPARENT: Final = "traceparent"
"""The W3C trace context of a start or a signal: the run's span becomes its child (a start), or
the delivery's span links to it (a signal). Read through ``sojourn.schemas.tracing``: a value
that is not well formed is ignored."""

TRACESTATE: Final = "tracestate"
"""The W3C vendor trace state that goes with ``TRACEPARENT``."""
