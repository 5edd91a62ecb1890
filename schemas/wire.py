"""Messages that cross the wire between clients, the intake and dead-letter readers.

Commands (what the outside world publishes) are closed: an unknown field is an error, so a
typo such as ``{"inptu": ...}`` is rejected loudly instead of starting a run with no input.
The contract is written down in docs/wire.md; JSON Schemas are exported with
``sojourn schemas --out DIR``.
"""

from __future__ import annotations

import typing
from typing import Literal

import msgspec

from .concurrency import ConcurrencyBody
from .events import Budget
from .flow import DebounceBody
from .vocabulary import ChildStatus

__all__ = [
    "ARCHIVE_FORMAT",
    "CHILD_SIGNAL",
    "DECIDE_SIGNAL",
    "NO_DETAILS",
    "REJECT_CODES",
    "RESERVED_SIGNAL_PREFIX",
    "ArchivedDecision",
    "ArchivedRun",
    "BudgetBody",
    "CancelBody",
    "ChildOutcome",
    "DeadLetter",
    "DeadLetterCode",
    "ErrorBody",
    "ForkBody",
    "ForkSignal",
    "InDoubtDecision",
    "InboxKind",
    "IntakeError",
    "IntakeOk",
    "LeaseHolder",
    "PauseBody",
    "RejectCode",
    "ResumeBody",
    "StartTrigger",
    "child_signal",
    "decide_signal",
]


RESERVED_SIGNAL_PREFIX = "sojourn-"
"""Signal names sojourn records itself start with this (child notices, decisions). They arrive
only on control subjects; a signal subject naming one is refused ``forbidden``."""

CHILD_SIGNAL = f"{RESERVED_SIGNAL_PREFIX}child"
"""Prefix of the reserved signal a child run sends its parent when it ends
(``sojourn-child.<child_run_id>``, ``child_signal``)."""


def child_signal(child_run_id: str) -> str:
    """The name of the signal recording ``child_run_id``'s end notice in its parent."""
    return f"{CHILD_SIGNAL}.{child_run_id}"


InboxKind = Literal[
    "start",
    "signal",
    "cancel",
    "spawn",
    "resume",
    "pause",
    "budget",
    "decide",
    "child",
    "schedule",
    "hold",
    "update",
    "limit",
]
"""What an inbox message asks for, from its subject (docs/wire.md "Subjects")."""


class BudgetBody(Budget, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """A budget as a client sends it (in a start, or on ``<prefix>.as.<sender>.budget.<run>``
    to change a live run's limits): a ``Budget`` whose unknown fields are refused, so that a
    misspelt limit is an error and never silently no limit."""


class ForkSignal(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A signal a fork starts with (``ForkBody.signal``), after the copied history: the fork
    finds it buffered, as if it had arrived before the position it re-executes from."""

    name: str
    payload: msgspec.Raw


class ForkBody(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """What makes a start a fork (``StartTrigger.fork``, decision 0041): a new run of the same
    agent whose history is ``run_id``'s up to position ``from_step`` (or, ``from_failure``,
    the position it failed at), re-executed from there with the code deployed now.

    ``new_input`` false: the fork keeps the old run's input and the trigger's ``input`` must
    be ``null``; true: the trigger's ``input`` is the fork's."""

    run_id: str
    from_step: int | None = None
    from_failure: bool = False
    new_input: bool = False
    signal: ForkSignal | None = None


class StartTrigger(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """Body of a message on ``sojourn.start.<agent>``.

    ``run_id`` makes starting idempotent forever: the same id started twice is one run.
    Omit it and the intake derives one from the inbox message (stable across redelivery).
    """

    input: msgspec.Raw
    run_id: str | None = None
    parent_run_id: str | None = None
    budget: BudgetBody | None = None
    """Limits for this run: each one given replaces the agent's (``Budget``)."""
    attributes: dict[str, str | int | float | bool] | None = None
    """The run's search attributes (``sojourn.schemas.attributes``: at most 32 keys, checked
    by the intake, refused ``invalid_attributes``)."""
    fork: ForkBody | None = None
    """Start the run as a fork of another run of the agent (``ForkBody``)."""
    singleton_key: str | None = None
    """Attach to the live run started with this key (for this agent) instead of starting
    another (``sojourn.schemas.flow``, decision 0047)."""
    debounce: DebounceBody | None = None
    """Start one run after the last of a burst of starts with the same key (``DebounceBody``,
    decision 0047); the run id is the burst's, so the trigger names none."""
    concurrency: ConcurrencyBody | None = None
    """At most ``limit`` live runs of the agent started with ``key``; beyond, the run is
    queued until a slot frees (``sojourn.schemas.concurrency``, decision 0048)."""


RejectCode = Literal[
    "invalid_json",
    "invalid_encoding",
    "too_deep",
    "duplicate_key",
    "out_of_range",
    "invalid_headers",
    "invalid_trigger",
    "invalid_input",
    "invalid_run_id",
    "invalid_reply_to",
    "unknown_agent",
    "payload_too_large",
    "unknown_run",
    "run_ended",
    "forbidden",
    "too_many_signals",
    "max_deliveries",
    "internal",
    "invalid_query",
    "invalid_schedule",
    "unknown_schedule",
    "schedule_exists",
    "invalid_attributes",
    "invalid_fork",
    "invalid_limit",
    "unknown_limit",
    "invalid_key",
    "invalid_debounce",
    "invalid_concurrency",
    "invalid_fairness",
]
REJECT_CODES: tuple[RejectCode, ...] = typing.get_args(RejectCode)
"""Every code the intake answers with (and keeps in a dead-letter record), and
``invalid_query``, the listing service's answer to a malformed ``RunsQuery``."""

DeadLetterCode = RejectCode | Literal["poison"]
"""``poison`` (a history a worker cannot decode) is written by workers and answers nobody."""


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    code: str
    message: str


class ChildOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How a child run ended, as its parent receives it (signal ``sojourn-child.<child_id>``).

    ``status`` is ``completed``, ``failed``, ``cancelled`` or ``rejected`` (its trigger was
    refused by the intake, e.g. invalid input).
    """

    child_run_id: str
    status: ChildStatus
    """Every writer (the executor, the intake) writes one of these four; a notice with another
    status is refused ``invalid_trigger`` by the intake rather than recorded."""
    output: msgspec.Raw
    error: ErrorBody | None = None


class IntakeOk(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The intake's answer on ``Sojourn-Reply-To`` when a trigger was accepted (``attached``
    and ``debounced`` only when true: a plain start's answer is what it always was)."""

    run_id: str
    created: bool
    attached: bool = False
    """A singleton start that found its key's run live: ``run_id`` is that run."""
    debounced: bool = False
    """A debounced start, recorded in its burst: ``run_id`` is the run the burst will start
    when it ends (not created yet)."""


class IntakeError(msgspec.Struct, frozen=True, kw_only=True):
    """The intake's answer on ``Sojourn-Reply-To`` when a trigger was rejected."""

    error: ErrorBody


class DeadLetter(msgspec.Struct, frozen=True, kw_only=True):
    """What the intake keeps on ``sojourn.dlq.<kind>`` for every inbound message it rejected.

    The original bytes are kept verbatim (base64 in JSON) so nothing is lost: an operator can
    fix and republish. A body too large to fit in a record is cut (``truncated``) and
    identified by ``size`` and ``sha256`` of the whole original.
    """

    code: str
    message: str
    subject: str
    data: bytes
    headers: dict[str, str] = {}
    inbox_seq: int = 0
    rejected_at: float = 0.0
    kind: Literal["start", "signal", "cancel", "http", "other"] = "other"
    """``http``: a callback or webhook request the HTTP gateway refused (``subject`` is its
    method and path, the token in it cut short)."""
    size: int = 0
    sha256: str = ""
    truncated: bool = False


NO_DETAILS = msgspec.Raw(b"null")
"""A lease's ``details`` when the step reported none."""


class LeaseHolder(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The body of a run's progress message (``<prefix>.lease.<run_id>``): what the activation
    executing the run reported with a step's ``ctx.heartbeat``. It is written only then: who
    holds a run is its worker's heartbeat (``WorkerBeat.runs``), and a record counts only while
    that worker's beats list the run (or were written before ``acquired_at``, by the worker's
    own clock). ``owner`` ``None`` is a release, ``expires_at`` the expiry of a lease that
    names no worker: both written by older versions."""

    owner: str | None
    worker: str = ""
    """The worker whose activation ``owner`` is (``WorkerBeat.worker_id``)."""
    expires_at: float = 0.0
    acquired_at: float = 0.0
    heartbeat_at: float = 0.0
    """When this message was written: taken, or renewed with a step's ``ctx.heartbeat``."""
    step: str | None = None
    """The step the owner is running, if any."""
    step_started_at: float | None = None
    details: msgspec.Raw = NO_DETAILS
    """The last ``ctx.heartbeat(details)`` of that step (JSON ``null`` when none)."""


class CancelBody(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """Body of a cancel (``<prefix>[.as.<sender>].cancel.<run_id>``); closed. Who cancelled is
    the subject's sender: ``by`` is accepted from older clients and ignored."""

    reason: str = ""
    by: str | None = None
    terminate: bool = False
    """End the run without its compensation (``sojourn terminate``); an in-flight step is
    interrupted the same way."""


class InDoubtDecision(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An operator's decision on an in-doubt step (``<prefix>.as.<sender>.decide...``), as
    recorded in the run's history: ``by`` is filled in by the intake from the subject's
    sender, never taken from the body."""

    action: Literal["retry", "skip", "fail"]
    result: msgspec.Raw = msgspec.Raw(b"null")
    by: str | None = None


DECIDE_SIGNAL = f"{RESERVED_SIGNAL_PREFIX}decide"
"""Prefix of the reserved signal an operator's decision is recorded as
(``sojourn-decide.<position>.<attempt>``, ``decide_signal``)."""


def decide_signal(position: int | str, attempt: int | str) -> str:
    """The name of the signal recording a decision on the step at ``position`` whose attempt
    ``attempt`` is in doubt."""
    return f"{DECIDE_SIGNAL}.{position}.{attempt}"


class PauseBody(msgspec.Struct, frozen=True, kw_only=True):
    """Body of a pause (``<prefix>.as.<sender>.pause.<run_id>``): optional, open-world. Who
    paused is the subject's sender, never a field of the body."""

    reason: str = ""


class ResumeBody(msgspec.Struct, frozen=True, kw_only=True):
    """Body of a resume (``<prefix>.as.<sender>.resume.<run_id>``): optional, open-world.

    Who resumed is the subject's sender, never a field of the body.
    """

    note: str = ""


ARCHIVE_FORMAT = 1
"""The version of ``ArchivedRun`` this code writes and the newest it reads."""


class ArchivedDecision(msgspec.Struct, frozen=True, kw_only=True):
    """One stored message of a run's history, as the events stream held it."""

    seq: int
    writer: str
    msg_id: str
    data: bytes
    """The message body: the decision's events, encoded as stored (a JSON array)."""


class ArchivedRun(msgspec.Struct, frozen=True, kw_only=True):
    """An archived run (retention): its whole history, in order. The body of the object named
    by its run id in the bucket ``<PREFIX>_ARCHIVE``, MessagePack; readers refuse a ``format``
    newer than ``ARCHIVE_FORMAT``."""

    format: int
    run_id: str
    archived_at: float
    decisions: tuple[ArchivedDecision, ...]
