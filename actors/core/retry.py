"""Retry policies and per-step options.

A ``RetryPolicy`` is a frozen value: set one on an agent (``@agent(..., retry=...)``) and
override it per step with ``@step(retry=...)``. The exception types to retry on are required:
there is no "retry everything" default. Every failed attempt is recorded (``StepFailed`` with
``retry_at``) and every backoff is a broker timer, so a retry schedule survives crashes,
restarts and deploys.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypeVar

import msgspec

from sojourn.schemas.limits import validate_limit_name
from sojourn.schemas.vocabulary import STEP_KINDS, StepKind

__all__ = ["NOT_DONE", "InDoubt", "RetryPolicy", "StepOptions", "step", "step_options"]

F = TypeVar("F", bound=Callable[..., Any])


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How a failing step is retried.

    Attributes:
        retry_on: exception types that warrant another attempt (required). ``RetryableError``
            is always retried; ``TerminalError`` never is.
        attempts: total attempts, the first included.
        initial_interval: seconds before the second attempt.
        backoff: factor applied to the interval after each attempt.
        max_interval: the interval never grows beyond this.
        jitter: fraction of the interval added or removed at random (0.1 = ±10 %).
    """

    retry_on: tuple[type[BaseException], ...]
    attempts: int = 3
    initial_interval: float = 1.0
    backoff: float = 2.0
    max_interval: float = 300.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if not self.retry_on:
            raise ValueError("RetryPolicy needs retry_on: the exception types worth retrying")
        if self.attempts < 1 or self.initial_interval < 0 or self.backoff < 1:
            raise ValueError("RetryPolicy: attempts >= 1, initial_interval >= 0, backoff >= 1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed ``attempt`` (1-based) before the next one."""
        base = min(self.initial_interval * self.backoff ** (attempt - 1), self.max_interval)
        return max(0.0, base * (1 + self.jitter * (2 * random.random() - 1)))


DEFAULT_RETRYABLE = RetryPolicy(retry_on=(BaseException,), attempts=3)
"""Used for ``RetryableError`` raised by a step that has no policy at all."""


class _NotDone:
    def __repr__(self) -> str:
        return "NOT_DONE"


NOT_DONE: Any = _NotDone()
"""What a ``reconcile`` function returns when the effect did not happen."""

InDoubt = Literal["retry", "ask"] | Callable[[str], Awaitable[Any] | Any]
"""What to do with a step that started but whose end was never recorded (its worker died):

- ``"retry"`` (default): run it again with the same idempotency key;
- ``"ask"``: suspend the run until a human decides (``sojourn decide``);
- a function ``reconcile(idempotency_key)``: ask the external system; return the step's result
  if the effect happened, or ``NOT_DONE`` to run the step again.
"""


@dataclass(frozen=True, slots=True)
class StepOptions:
    name: str | None = None
    retry: RetryPolicy | None = None
    in_doubt: InDoubt = "retry"
    kind: StepKind = "step"
    """What the step is, for budgets and read models (``StepStarted.kind``): ``llm`` for a
    model request (``ctx.llm``), ``tool`` for a tool an LLM asked for, ``step`` otherwise."""
    timeout: float | None = None
    """Seconds one attempt may run: past it the attempt fails with ``StepTimeout`` (an async
    one is cancelled, a sync one abandoned) and is retried as the step's policy says."""
    limit: str | None = None
    """The shared rate limit every attempt takes a slot of (decision 0046)."""


def step_timeout(timeout: float | int | timedelta | None) -> float | None:
    """``@step(timeout=...)`` as seconds, checked: a positive number or ``timedelta``."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"a step's timeout must be a positive duration, not {timeout!r}")
    return seconds


def step(
    *,
    name: str | None = None,
    retry: RetryPolicy | None = None,
    in_doubt: InDoubt = "retry",
    kind: StepKind = "step",
    timeout: float | int | timedelta | None = None,
    limit: str | None = None,
) -> Callable[[F], F]:
    """Attach options to a step function (it stays a plain function). ``limit`` names a
    shared rate limit (``Agent(limits=...)``): each attempt waits for a slot of it, across
    every worker of the deployment.

    Example:
        >>> from sojourn.actors import RetryPolicy, step
        >>> @step(retry=RetryPolicy(retry_on=(TimeoutError,), attempts=5), in_doubt="ask")
        ... def charge(card: str, cents: int) -> str:
        ...     return "ch_1"
    """

    if kind not in STEP_KINDS:
        raise ValueError(f"a step's kind is one of {', '.join(STEP_KINDS)}, not {kind!r}")
    seconds = step_timeout(timeout)
    if limit is not None:
        validate_limit_name(limit)

    def attach(fn: F) -> F:
        opts = StepOptions(
            name=name, retry=retry, in_doubt=in_doubt, kind=kind, timeout=seconds, limit=limit
        )
        fn.__sojourn_step__ = opts  # type: ignore[attr-defined]
        if name is not None:
            fn.__sojourn_step_name__ = name  # type: ignore[attr-defined]
        return fn

    return attach


_DEFAULT = StepOptions()


def step_options(fn: Callable[..., Any]) -> StepOptions:
    opts = getattr(fn, "__sojourn_step__", None)
    return opts if isinstance(opts, StepOptions) else _DEFAULT
