"""The exception tree every sojourn package raises from.

It lives in ``schemas`` because ``schemas`` imports nothing of ours, so the broker, the actors
and the projections can all share one root without import cycles. Errors carry the run id,
step and sequence where they apply so a log line alone says which run broke.
"""

from __future__ import annotations

from typing import ClassVar, Literal

__all__ = [
    "BrokerUnavailable",
    "BrokerVersionError",
    "CallbackKeysMissing",
    "CallbackTokenExpired",
    "CallbackTokenInvalid",
    "ChildRunError",
    "ConcurrencyConflict",
    "Fenced",
    "HistoryError",
    "InvalidName",
    "JetStreamError",
    "NondeterminismError",
    "ObjectUnreadable",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "PermissionDenied",
    "RateLimited",
    "RetryableError",
    "RunNotFound",
    "ServerStartError",
    "SnapshotUnreadable",
    "SojournError",
    "StepError",
    "StepTimeout",
    "TerminalError",
    "UnknownAgent",
    "UnknownLimit",
    "ValueUnreadable",
    "WebhookRejectCode",
    "WebhookRejected",
]


class SojournError(Exception):
    """Root of every error sojourn raises on purpose."""

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        step: str | None = None,
        seq: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.run_id = run_id
        self.step = step
        self.seq = seq


class ServerStartError(SojournError):
    """The embedded ``nats-server`` could not be found or did not become ready."""


class BrokerUnavailable(SojournError):
    """No NATS server answered at the configured URL (or it went away mid-call)."""


class BrokerVersionError(SojournError):
    """The NATS server is too old: sojourn needs message schedules (nats-server >= 2.12)."""


class PermissionDenied(SojournError):
    """The NATS server refused a publish: this connection's user may not use the subject
    (docs/operations.md, "Security", lists what each role may do).

    The server does not answer a refused request; it reports the violation on the side, and
    the request that would otherwise time out raises this instead.

    Attributes:
        subject: the subject that was refused.
    """

    def __init__(self, message: str, *, subject: str, run_id: str | None = None) -> None:
        super().__init__(message, run_id=run_id)
        self.subject = subject


class JetStreamError(SojournError):
    """A JetStream API request was answered with an error.

    Attributes:
        code: the HTTP-like status (``400``, ``404``, ``503``...).
        err_code: JetStream's own error code (``10071``: wrong last sequence, a broken fence).
        description: the server's text (without what the request was).
    """

    def __init__(self, message: str, *, code: int, err_code: int, description: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.err_code = err_code
        self.description = description


class ConcurrencyConflict(SojournError):
    """An append lost the sequence fence: someone else wrote to the run since we last read it.

    Attributes:
        expected: the last subject sequence the writer believed in.
    """

    def __init__(self, message: str, *, run_id: str, expected: int) -> None:
        super().__init__(message, run_id=run_id, seq=expected)
        self.expected = expected


class InvalidName(SojournError, ValueError):
    """A run id, agent name or signal name is not a valid NATS subject token."""


class PayloadTooLarge(SojournError, ValueError):
    """A trigger or signal payload exceeds the configured limit."""


class CallbackTokenInvalid(SojournError, ValueError):
    """A callback token (``ctx.callback``) is malformed, oversized, signed by a key the
    keyring does not hold, or altered. Deliberately says no more than that: whoever presents a
    token learns nothing about why it failed (an HTTP gateway answers it 401)."""

    code: ClassVar[Literal["invalid_token"]] = "invalid_token"


class CallbackTokenExpired(SojournError, ValueError):
    """A callback token is genuine but its time is up (an HTTP gateway answers it 410). Only
    said of a token whose signature checked out, so it reveals nothing to a forger."""

    code: ClassVar[Literal["token_expired"]] = "token_expired"


class CallbackKeysMissing(SojournError, RuntimeError):
    """``ctx.callback`` was called on a worker that has no callback keys: set
    ``SOJOURN_CALLBACK_KEYS`` to a key file, or pass ``Worker(callback_keys=...)``."""


class UnknownAgent(SojournError, LookupError):
    """No worker serves (or ever served) an agent by this name."""


class RunNotFound(SojournError, LookupError):
    """The run id has no history."""


class StepError(SojournError):
    """A step raised; the agent sees this (the same on first execution and on replay).

    The original exception is recorded as data (type name and message), never pickled, so
    the error a replay raises is identical to the one the first execution raised.
    """

    def __init__(self, message: str, *, error_type: str, run_id: str, step: str) -> None:
        super().__init__(message, run_id=run_id, step=step)
        self.error_type = error_type


class ChildRunError(SojournError):
    """A child run the agent awaited did not complete (failed, cancelled or rejected)."""

    def __init__(self, message: str, *, run_id: str, child_run_id: str, status: str) -> None:
        super().__init__(message, run_id=run_id)
        self.child_run_id = child_run_id
        self.status = status


class RetryableError(Exception):
    """Raise from a step to ask for another attempt, optionally not before ``retry_after``
    seconds (an HTTP 429's Retry-After, say). Retried even if the step's ``RetryPolicy`` does
    not list it, within the policy's attempts (3 when the step has no policy)."""

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RateLimited(RetryableError):
    """Raise from a step when what it called answered "too many requests" (an HTTP 429),
    with the ``retry_after`` it asked for. A step with a shared limit (``@step(limit=...)``)
    then blocks that limit for everyone until then, not only its own next attempt."""


class UnknownLimit(SojournError):
    """A step names a shared rate limit no worker declared and no operator set."""


class OutcomeUnknown(RetryableError):
    """Raise from a step when its attempt may or may not have done its work: what it called
    went away mid-call (an MCP server's process died before it answered). The attempt is then
    in doubt, as if its worker had died: the step's ``in_doubt`` policy settles it (``ask``
    suspends the run, a reconcile function is asked); under ``"retry"`` it is retried like any
    ``RetryableError``, within the step's retry policy."""


class TerminalError(Exception):
    """Raise from a step to fail it at once, whatever its retry policy says."""


class StepTimeout(TimeoutError):
    """A step attempt ran past its ``@step(timeout=...)``: the attempt fails with this error
    (an async one is cancelled, a sync one, in a thread that cannot be stopped, abandoned) and
    is retried as its retry policy says. A ``TimeoutError``, so ``RetryPolicy(retry_on=
    (TimeoutError,))`` retries it."""

    def __init__(self, message: str, *, timeout: float) -> None:
        super().__init__(message)
        self.timeout = timeout


class NondeterminismError(SojournError):
    """Replaying a run's history against the agent code diverged from what was recorded.

    The run is parked (suspended) with this message; its history is left untouched.
    """


class Fenced(BaseException):
    """Raised inside agent code when this worker lost the run to another writer.

    A ``BaseException`` on purpose: an agent's ``except Exception`` must not swallow it, or a
    worker that lost its lease could keep executing steps.
    """

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id}: another worker owns this run now")
        self.run_id = run_id


class HistoryError(SojournError):
    """A run's history cannot be decoded (a poison message); the run needs a human."""


class ValueUnreadable(HistoryError):
    """A large value a history refers to cannot be read back as written: a reference that is
    malformed or out of bounds, a piece that is missing, oversized or does not match its
    digest. Like any unreadable history, the run needs a human (its worker wedges it)."""


class ObjectUnreadable(SojournError):
    """A stored object (an archived run, a snapshot) cannot be read back as written: its
    description is malformed or names another object, it is larger than the reader accepts,
    or its chunks do not match."""


class SnapshotUnreadable(SojournError, ValueError):
    """The bytes are not a snapshot this code reads (undecodable, or a newer format)."""


WebhookRejectCode = Literal["missing_signature", "invalid_signature", "stale_webhook"]
"""Why the gateway refused a webhook: a signature header is absent, a header is malformed or
no signature matches, or the signed timestamp is malformed or outside the route's tolerance."""


class WebhookRejected(SojournError):
    """A webhook failed its signature check, so nothing of it reaches a run.

    The message says what was wrong with the request and never repeats a secret or an
    expected signature: it goes back to whoever sent the request.

    Attributes:
        code: one of ``WebhookRejectCode``; the gateway answers with it.
    """

    def __init__(self, code: WebhookRejectCode, message: str) -> None:
        super().__init__(message)
        self.code: WebhookRejectCode = code
