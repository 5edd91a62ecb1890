"""OpenTelemetry traces of runs (docs/operations.md, "Tracing"; decision 0037).

This package is the one place sojourn meets OpenTelemetry, and only ``_otel.py`` imports it.
Everything here is a no-op, at the cost of a dictionary look-up, unless the process has set up
an OpenTelemetry SDK ``TracerProvider`` (``sojourn worker|gateway|projector`` do when the
``otel`` extra is installed and the standard ``OTEL_*`` variables ask for an exporter:
``configure``): without it, ``opentelemetry`` is never imported by sojourn.

What the other rooms call, one call per place:

- ``run_trace``: an activation's ``RunTrace`` (the run's spans), or ``None``;
- ``child_headers``: the trace context a child's start carries (its parent's child span);
- ``outgoing``: the trace context a client's start or signal carries (given, passed through
  by the gateway, or the caller's current span);
- ``TraceMiddleware``: the gateway's span per request, and the caller's context passed on.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from sojourn.broker import headers as h
from sojourn.schemas.tracing import trace_context

if TYPE_CHECKING:
    from sojourn.broker.eventstore import Decision

    from ._otel import RunTrace, Traced

__all__ = [
    "TraceMiddleware",
    "Traced",
    "child_headers",
    "configure",
    "outgoing",
    "run_trace",
    "tracing_on",
]

_API = "opentelemetry.trace"

_INCOMING: contextvars.ContextVar[tuple[str, str | None] | None] = contextvars.ContextVar(
    "sojourn_incoming_trace", default=None
)
"""A caller's trace context received over HTTP, passed on to what the request sends when this
process does not trace itself."""


def tracing_on() -> bool:
    """Whether this process traces: an OpenTelemetry SDK tracer provider is set up. Imports
    nothing when no one imported OpenTelemetry."""
    if _API not in sys.modules:
        return False
    from . import _otel

    return _otel.tracer() is not None


def run_trace(activation: Traced, history: Sequence[Decision] = ()) -> RunTrace | None:
    """The spans of one activation of a run (``history``: the decisions it loaded), or
    ``None`` when this process does not trace. Never raises: tracing never fails a run."""
    if _API not in sys.modules:
        return None
    from . import _otel

    try:
        return _otel.run_trace(activation, history)
    except Exception:
        logging.getLogger("sojourn.telemetry").debug("no trace for a run", exc_info=True)
        return None


def child_headers(trace: RunTrace | None, child_run_id: str) -> dict[str, str]:
    """The headers of a child's start: its parent's span for it (none without tracing)."""
    return {} if trace is None else trace.child_headers(child_run_id)


def outgoing(traceparent: str | None = None, tracestate: str | None = None) -> dict[str, str]:
    """The trace headers of a start or a signal a client sends: ``traceparent`` (with
    ``tracestate``) when given and well formed; else the context a gateway request passed on;
    else the caller's current OpenTelemetry span, if this process traces. Never raises: a
    malformed value is dropped."""
    parent, state = trace_context(traceparent, tracestate)
    if parent is None:
        if _API in sys.modules:
            from . import _otel

            return _otel.current_headers() or _passed_on()
        return _passed_on()
    return _headers(parent, state)


def _passed_on() -> dict[str, str]:
    incoming = _INCOMING.get()
    return {} if incoming is None else _headers(*incoming)


def _headers(parent: str, state: str | None) -> dict[str, str]:
    out = {h.TRACEPARENT: parent}
    if state:
        out[h.TRACESTATE] = state
    return out


def configure(service: str) -> bool:
    """Set up the OpenTelemetry SDK from the standard environment (``OTEL_SERVICE_NAME``,
    defaulting to ``service``; ``OTEL_EXPORTER_OTLP_ENDPOINT``; ``OTEL_TRACES_SAMPLER``...)
    when the ``otel`` extra is installed and the environment asks for an exporter. Returns
    whether traces are exported."""
    try:
        from . import _otel
    except ImportError:
        return False
    return _otel.configure(service)


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
_App = Callable[[Any, Receive, Send], Awaitable[None]]


class TraceMiddleware:
    """ASGI middleware of the gateway: a server span per HTTP request (when this process
    traces) in the caller's trace (its ``traceparent`` header, ignored when malformed), which
    the starts and signals the request sends carry on; without tracing, the caller's
    context is passed on as it came."""

    def __init__(self, app: _App) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        found = _header(scope, b"traceparent")
        if tracing_on():
            from . import _otel

            await _otel.http_span(
                self.app, scope, receive, send, found, _header(scope, b"tracestate")
            )
            return
        parent, state = trace_context(found, _header(scope, b"tracestate"))
        if parent is None:
            await self.app(scope, receive, send)
            return
        token = _INCOMING.set((parent, state))
        try:
            await self.app(scope, receive, send)
        finally:
            _INCOMING.reset(token)


def _header(scope: Scope, name: bytes) -> str | None:
    """The first ``name`` header of a request, if it is short ASCII."""
    for key, value in scope.get("headers") or ():
        if key == name:
            if len(value) > 1024:
                return None
            try:
                return bytes(value).decode("ascii")
            except UnicodeDecodeError:
                return None
    return None
