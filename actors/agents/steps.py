"""What a step function may know while it runs, and how a step function is described.

``current_step()``, ``heartbeat()`` and ``idempotency_headers()`` are called from inside a
function run by ``ctx.step`` (also from a sync one, in its thread): a context variable carries
the ``StepInfo`` of the attempt being run. ``step_name`` and the cached type facts tell the
façade how to journal and decode a step function.
"""

from __future__ import annotations

import functools
import inspect
import threading
import typing
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from sojourn.schemas.events import Usage

if TYPE_CHECKING:
    from ..client.output import StepOutput

__all__ = [
    "StepInfo",
    "UsageMeter",
    "current_step",
    "heartbeat",
    "idempotency_headers",
    "is_async",
    "return_type",
    "step_name",
]

T = TypeVar("T")


class UsageMeter:
    """What one step attempt charged so far, summed. Thread-safe: a sync step charges from
    its own thread."""

    __slots__ = ("_lock", "total")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total: Usage | None = None

    def add(self, usage: Usage) -> None:
        with self._lock:
            self.total = usage if self.total is None else self.total + usage


@dataclass(frozen=True, slots=True)
class StepInfo:
    """What a running step may know about itself.

    ``idempotency_key`` is ``<run_id>/<position>``: the same on every attempt, on every worker,
    after every restart. Pass it to external APIs (``Idempotency-Key`` header, a unique column)
    so that a step re-run after a crash does not act twice.

    ``output`` is where this execution's ``ctx.stream`` / ``ctx.progress`` chunks go (``None``
    where nothing may be streamed: a reconcile function, a replay).
    """

    run_id: str
    position: int
    name: str
    attempt: int
    idempotency_key: str
    in_doubt: bool
    report: Callable[[Any], None] | None = None
    output: StepOutput | None = None
    meter: UsageMeter | None = None

    def heartbeat(self, details: Any = None) -> None:
        """Report this step's progress (see ``heartbeat``)."""
        if self.report is not None:
            self.report(details)

    def charge(
        self,
        usage: Usage | None = None,
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        usd: float = 0.0,
        requests: int = 0,
        model: str | None = None,
    ) -> None:
        """Charge what this attempt used (a model request's tokens and cost) to the run.

        Recorded with the attempt's end (``StepCompleted.usage``, or ``StepFailed.usage``: a
        failed request may have cost money too), counted against the run's budget and in
        ``sojourn_spend_total``. Call it as often as you like; the amounts add up. ``ctx.llm``
        charges each model request itself.

        Raises:
            ValueError: a negative or non-finite amount.
            RuntimeError: the step has no meter (a reconcile function: it is not an attempt).
        """
        if usage is None:
            usage = Usage(
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                usd=usd,
                requests=requests,
                model=model,
            )
        if self.meter is None:
            raise RuntimeError("only a step's attempt can charge usage")
        self.meter.add(usage)


current_info: ContextVar[StepInfo | None] = ContextVar("sojourn_current_step", default=None)


def current_step() -> StepInfo:
    """The step being executed by the calling code (inside a step function only).

    Raises:
        RuntimeError: called outside a step.
    """
    info = current_info.get()
    if info is None:
        raise RuntimeError("current_step() is only available inside a function run by ctx.step")
    return info


def heartbeat(details: Any = None) -> None:
    """Report the progress of the step being executed (from inside a step function, also from
    a sync one running in a thread): ``details`` (JSON, at most 8 KiB) is shown by
    ``sojourn status`` and rides on the run's next heartbeat, sent within a second.

    A step's heartbeat needs no call: its worker heartbeats for it while it runs. Call this to
    say how far a long step has got.

    Raises:
        RuntimeError: called outside a step.
        PayloadTooLarge: ``details`` encodes to more than 8 KiB.
    """
    current_step().heartbeat(details)


def idempotency_headers(header: str = "Idempotency-Key") -> dict[str, str]:
    """HTTP headers carrying the current step's idempotency key, for APIs that deduplicate on
    it (Stripe, most payment and email providers): a step re-run after a crash sends the same
    key, so the provider acts once.

    Example:
        >>> async def charge(card: str, cents: int) -> str:          # doctest: +SKIP
        ...     r = await http.post("https://api.example.com/charges",
        ...                         json={"card": card, "amount": cents},
        ...                         headers=idempotency_headers())
        ...     return r.json()["id"]

    Raises:
        RuntimeError: called outside a step.
    """
    return {header: current_step().idempotency_key}


def _memo(compute: Callable[[Callable[..., Any]], T]) -> Callable[[Callable[..., Any]], T]:
    """Cache a per-function fact; unhashable callables are computed each time."""
    cached = functools.lru_cache(maxsize=4096)(compute)

    def lookup(fn: Callable[..., Any]) -> T:
        try:
            return cached(fn)
        except TypeError:  # unhashable callable
            return compute(fn)

    return lookup


def _hinted_return(fn: Callable[..., Any]) -> Any:
    try:
        return typing.get_type_hints(fn).get("return", Any)
    except Exception:
        return Any


def _coroutine_function(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004
    )


return_type = _memo(_hinted_return)
is_async = _memo(_coroutine_function)


def step_name(fn: Callable[..., Any]) -> str:
    """The journaled name of a step function (its ``__name__``, or ``@step(name=...)``)."""
    explicit = getattr(fn, "__sojourn_step_name__", None)
    if isinstance(explicit, str):
        return explicit
    inner = getattr(fn, "func", None)  # functools.partial
    if inner is not None and not hasattr(fn, "__name__"):
        return step_name(inner)
    return str(getattr(fn, "__name__", type(fn).__name__))
