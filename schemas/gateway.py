"""The HTTP gateway's bodies and error vocabulary (docs/gateway.md).

The gateway speaks the wire contract over HTTP: its error codes are the intake's reject codes
(``RejectCode``) plus the few only HTTP has (no credentials, a route that does not exist);
each one has one HTTP status, defined here once, and every error is an RFC 9457 problem
document (``Problem``).
"""

from __future__ import annotations

import typing
from typing import Final, Literal

import msgspec

from .events import RunEvent
from .wire import RejectCode

__all__ = [
    "ADMIN_ACTIONS",
    "GATEWAY_ACTIONS",
    "GATEWAY_CODES",
    "GATEWAY_ROLES",
    "HTTP_STATUS",
    "PROBLEM_TYPE",
    "CallbackAnswer",
    "CancelAnswer",
    "GatewayAction",
    "GatewayCode",
    "GatewayRole",
    "HistoryEntry",
    "Problem",
    "ProblemCode",
    "SignalAnswer",
    "StartAnswer",
    "problem_title",
]

GatewayCode = Literal[
    "unauthorized",
    "not_found",
    "method_not_allowed",
    "unsupported_media_type",
    "invalid_header",
    "unavailable",
    "invalid_token",
    "token_expired",
    "unknown_webhook",
    "missing_signature",
    "invalid_signature",
    "stale_webhook",
    "invalid_csrf",
    "missing_field",
    "update_rejected",
    "update_failed",
    "unknown_update",
    "update_timeout",
    "invalid_priority",
]
"""What only HTTP can go wrong with: no or an unknown bearer token (``unauthorized``), a path
or run that does not exist, a body that is not JSON, a malformed header, no broker behind
the gateway (``unavailable``), the callback and webhook checks, and a request made with a
console session cookie without its CSRF token or from another site (``invalid_csrf``), and a
verified routed webhook whose body lacks the field that names its run (``missing_field``); an
update the run refused (``update_rejected``: its validator; ``unknown_update``: no handler of
that name), whose handler raised (``update_failed``) or not answered in time
(``update_timeout``: send it again with the same ``Idempotency-Key``); a
``Sojourn-Priority`` that is not 1 to 5 (``invalid_priority``: the broker has no lane for it,
so only the gateway can refuse it)."""

GATEWAY_CODES: tuple[GatewayCode, ...] = typing.get_args(GatewayCode)

ProblemCode = RejectCode | GatewayCode
"""Every ``code`` a gateway problem document may carry."""

PROBLEM_TYPE: Final = "https://sojourn.dev/problems/"
"""A problem's ``type`` is this followed by its code (documented in docs/gateway.md)."""

HTTP_STATUS: Final[dict[str, int]] = {
    # the intake's reject codes
    "invalid_json": 400,
    "invalid_encoding": 400,
    "too_deep": 400,
    "duplicate_key": 400,
    "out_of_range": 400,
    "invalid_headers": 400,
    "invalid_trigger": 400,
    "invalid_input": 422,
    "invalid_run_id": 400,
    "invalid_reply_to": 400,
    "unknown_agent": 404,
    "payload_too_large": 413,
    "unknown_run": 404,
    "run_ended": 409,
    "forbidden": 403,
    "too_many_signals": 429,
    "max_deliveries": 500,
    "internal": 500,
    "invalid_query": 400,
    "invalid_schedule": 400,
    "unknown_schedule": 404,
    "schedule_exists": 409,
    "invalid_attributes": 400,
    "invalid_limit": 400,
    "unknown_limit": 404,
    "invalid_fork": 422,
    "invalid_key": 400,
    "invalid_debounce": 400,
    "invalid_concurrency": 400,
    "invalid_fairness": 400,
    # HTTP's own
    "unauthorized": 401,
    "not_found": 404,
    "method_not_allowed": 405,
    "unsupported_media_type": 415,
    "invalid_header": 400,
    "unavailable": 503,
    "invalid_token": 401,
    "token_expired": 410,
    "unknown_webhook": 404,
    "missing_signature": 401,
    "invalid_signature": 401,
    "stale_webhook": 401,
    "invalid_csrf": 403,
    "missing_field": 422,
    "update_rejected": 409,
    "update_failed": 409,
    "unknown_update": 404,
    "update_timeout": 504,
    "invalid_priority": 400,
}
"""The HTTP status of every problem code (a test checks each code has one)."""


def problem_title(code: str) -> str:
    """``unknown_run`` -> ``Unknown run``: the short, stable summary of a problem type."""
    return code.replace("_", " ").capitalize()


GatewayRole = Literal["client", "admin"]
"""The roles a bearer token may have: the NATS users' roles that make sense over HTTP."""

GATEWAY_ROLES: tuple[GatewayRole, ...] = typing.get_args(GatewayRole)

GatewayAction = Literal["start", "read", "signal", "cancel", "operate"]
"""What an authenticated request does; ``--admin-only`` names the actions a client token may
not take. ``operate`` (resume, raise a budget, terminate, pause or resume a schedule: what
only the admin role may do over NATS) always needs the admin role."""

ADMIN_ACTIONS: frozenset[GatewayAction] = frozenset({"operate"})
"""The actions only admin tokens take, whatever ``--admin-only`` says."""

GATEWAY_ACTIONS: tuple[GatewayAction, ...] = typing.get_args(GatewayAction)


class Problem(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An error, as RFC 9457 ``application/problem+json``: ``type`` is ``PROBLEM_TYPE`` +
    ``code``, ``code`` one of ``ProblemCode``; ``run_id`` when the problem is about a run."""

    type: str
    title: str
    status: int
    detail: str
    code: str
    run_id: str | None = None


class StartAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /v1/agents/{agent}/runs``: the run id, and whether this request created the run
    (``False``: it existed; ``None`` with ``queued``: stored, not yet taken by a worker)."""

    run_id: str
    created: bool | None
    queued: bool = False


class KeyedStartAnswer(StartAnswer, frozen=True, kw_only=True):
    """``POST /v1/agents/{agent}/runs`` of a keyed start (decision 0047): a ``StartAnswer``
    that also says whether it attached or was debounced."""

    attached: bool
    """A singleton start (``Sojourn-Singleton-Key``) found its key's run live: ``run_id``."""
    debounced: bool
    """A debounced start (``Sojourn-Debounce``): ``run_id`` is the run its burst starts when
    it ends."""


class SignalAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /v1/runs/{id}/signals/{name}``: the signal is stored for the run under
    ``signal_id`` (the same id sent again is the same signal, forever)."""

    run_id: str
    signal: str
    signal_id: str


class CallbackAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /v1/callbacks/{token}``: the one signal the token stands for was delivered to its
    run. The same answer comes back for every repeat of the POST (one signal, never two)."""

    delivered: bool
    signal: str
    signal_id: str


class HistoryEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One decision of ``GET /v1/runs/{id}/history`` (and ``sojourn history RUN --json``): its
    events-stream sequence, the worker that wrote it, its events."""

    seq: int
    writer: str
    events: list[RunEvent]


class CancelAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /v1/runs/{id}/cancel``: the cancel is stored; the run ends ``cancelled`` at its
    next step boundary (or at once while it waits)."""

    run_id: str
    cancel_requested: bool = True
