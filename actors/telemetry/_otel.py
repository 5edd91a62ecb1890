"""The OpenTelemetry side of sojourn's traces: the one module that imports ``opentelemetry``.

One trace per run (decision 0037). A run's span has an id derived from its run id, so every
activation of the run, on any worker, after any restart, parents its spans to the same run
span without asking anyone; the run span itself is emitted once, by the activation that
records the run's end, with the run's recorded start as its start. Every other span is
emitted when the event that ends it is stored, by the activation that stored it, and never
for what a replay walks through: a span exists exactly when history records its end, so a
replay cannot duplicate one and a crash cannot orphan one. A step attempt cut off by a dead
worker has no recorded end: the activation that runs the step again emits it then, marked
``lost``, from its recorded start. Span ids of steps, waits, signals and children derive from
the run id and the position, so the same operation has the same span id everywhere.

Deterministic ids need the SDK's ``TracerProvider`` (its id generator is wrapped once: an id
asked for here is taken from ``_NEXT``, any other is the provider's own). With another
provider, or none, nothing is traced.
"""

from __future__ import annotations

import contextvars
import logging
import os
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, Protocol, TypeVar, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sojourn.broker import headers as h
from sojourn.broker.eventstore import Decision
from sojourn.schemas.events import (
    ChildStarted,
    RunCancelled,
    RunCompleted,
    RunEvent,
    RunFailed,
    StepCompleted,
    StepFailed,
    StepStarted,
    WaitCompleted,
    WaitStarted,
)
from sojourn.schemas.names import RESERVED_SIGNAL_PREFIX
from sojourn.schemas.tracing import derived_id, parse_traceparent, trace_context

from ..core.state import RunState

try:
    from opentelemetry.sdk.trace import TracerProvider as _SdkProvider
    from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
except ImportError:  # the API alone (another package's dependency): nothing is traced
    _SdkProvider = None  # type: ignore[assignment,misc]
    IdGenerator = object  # type: ignore[assignment,misc]

__all__ = [
    "RunTrace",
    "Traced",
    "configure",
    "current_headers",
    "current_ids",
    "http_span",
    "run_trace",
    "tracer",
]

log = logging.getLogger("sojourn.telemetry")
T = TypeVar("T")

_NEXT: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "sojourn_next_span_ids", default=None
)
"""(trace id, span id) the next span started here takes (a derived id), else ``None``."""

_PROPAGATOR = TraceContextTextMapPropagator()


class _Ids(IdGenerator):
    """The provider's id generator, except for the spans sojourn gives an id of its own."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def generate_span_id(self) -> int:
        given = _NEXT.get()
        return given[1] if given is not None else int(self.inner.generate_span_id())

    def generate_trace_id(self) -> int:
        given = _NEXT.get()
        return given[0] if given is not None else int(self.inner.generate_trace_id())


class _Cache:
    provider: object = None
    tracer: trace.Tracer | None = None


_CACHE = _Cache()


def tracer() -> trace.Tracer | None:
    """sojourn's tracer, if an SDK tracer provider is set up (its id generator wrapped)."""
    provider = trace.get_tracer_provider()
    if provider is _CACHE.provider:
        return _CACHE.tracer
    found: trace.Tracer | None = None
    if _SdkProvider is not None and isinstance(provider, _SdkProvider):
        if not isinstance(provider.id_generator, _Ids):
            provider.id_generator = cast(Any, _Ids(provider.id_generator))
        found = provider.get_tracer("sojourn")
    _CACHE.provider, _CACHE.tracer = provider, found
    return found


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _sampled(trace_id: int) -> bool:
    """The provider's sampler's verdict on a root span of ``trace_id``: deterministic for the
    standard samplers, so every activation of a run agrees with the run span's."""
    sampler = getattr(trace.get_tracer_provider(), "sampler", None)
    if sampler is None:
        return True
    try:
        return bool(sampler.should_sample(None, trace_id, "run").decision.is_sampled())
    except Exception:  # a custom sampler that wants more: trace
        return True


class _Log(Protocol):
    writer: str
    on_stored: Callable[[Sequence[RunEvent]], None] | None


class Traced(Protocol):
    """What a ``RunTrace`` reads of the activation it traces."""

    run_id: str

    @property
    def agent_name(self) -> str: ...

    @property
    def state(self) -> RunState: ...

    @property
    def log(self) -> _Log: ...


def run_trace(activation: Traced, history: Sequence[Decision] = ()) -> RunTrace | None:
    t = tracer()
    return None if t is None else RunTrace(t, activation, history)


class RunTrace:
    """One activation's spans of its run (module docstring). Never raises into the run."""

    def __init__(self, tracer: trace.Tracer, act: Traced, history: Sequence[Decision]) -> None:
        self._tracer = tracer
        self._act = act
        s = act.state
        self.run_id = act.run_id
        self.agent = act.agent_name
        caller = parse_traceparent(s.traceparent)
        if caller is not None:
            self.trace_id = caller.trace_id
            sampled = caller.sampled
            state = TraceState.from_header([s.tracestate]) if s.tracestate else None
            remote = SpanContext(
                caller.trace_id,
                caller.span_id,
                is_remote=True,
                trace_flags=TraceFlags(caller.flags),
                trace_state=state,
            )
            self.caller = trace.set_span_in_context(
                NonRecordingSpan(remote), otel_context.Context()
            )
        else:
            self.trace_id = derived_id(128, "trace", self.run_id)
            sampled = _sampled(self.trace_id)
            self.caller = otel_context.Context()
        self.flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
        self.run_span_id = derived_id(64, "run", self.run_id)
        run_span = SpanContext(self.trace_id, self.run_span_id, False, trace_flags=self.flags)
        self.run_parent = trace.set_span_in_context(
            NonRecordingSpan(run_span), otel_context.Context()
        )
        self.parent = self.run_parent
        """The current activation's span, as a parent."""
        self._open: dict[tuple[int, int], tuple[Span, str]] = {}
        """Attempt spans started here: (position, attempt) -> (span, kind)."""
        self._unended: dict[tuple[int, int], StepStarted] = {}
        """Attempts history started and never ended (their worker died): emitted as lost when
        the step runs again."""
        self._waits: dict[int, float] = {}
        for d in history:
            for e in d.events:
                self._remember(e)
        act.log.on_stored = self.stored

    def _remember(self, e: RunEvent) -> None:
        if isinstance(e, StepStarted):
            self._unended[(e.position, e.attempt)] = e
        elif isinstance(e, (StepCompleted, StepFailed)):
            self._unended.pop((e.position, e.attempt), None)
        elif isinstance(e, WaitStarted):
            self._waits[e.position] = e.at
        elif isinstance(e, WaitCompleted):
            self._waits.pop(e.position, None)

    # --- spans ---------------------------------------------------------------------------------

    def _start(
        self,
        name: str,
        parent: otel_context.Context,
        span_id: int | None,
        at: float | None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: dict[str, Any] | None = None,
        links: Sequence[Link] = (),
    ) -> Span:
        token = None if span_id is None else _NEXT.set((self.trace_id, span_id))
        try:
            return self._tracer.start_span(
                name,
                context=parent,
                kind=kind,
                attributes={"sojourn.run.id": self.run_id, **(attributes or {})},
                links=links,
                start_time=None if at is None else _ns(at),
            )
        finally:
            if token is not None:
                _NEXT.reset(token)

    def child_headers(self, child_run_id: str) -> dict[str, str]:
        """A child's start's trace context: this run's span for that child (``_child``)."""
        span_id = derived_id(64, "child", child_run_id)
        return {h.TRACEPARENT: f"00-{self.trace_id:032x}-{span_id:016x}-{int(self.flags):02x}"}

    async def activation(self, drive: Callable[[], Awaitable[T]]) -> T:
        """``drive`` (the activation) in a span of its own, a child of the run's span."""
        span = self._start(
            f"activation {self.agent}",
            self.run_parent,
            None,
            None,
            attributes={"sojourn.agent": self.agent, "sojourn.worker": self._act.log.writer},
        )
        self.parent = trace.set_span_in_context(span, otel_context.Context())
        token = otel_context.attach(self.parent)
        outcome: object = "error"
        try:
            result = await drive()
            outcome = result
            return result
        finally:
            otel_context.detach(token)
            span.set_attribute("sojourn.activation.outcome", str(outcome))
            span.end()

    async def within(self, position: int, attempt: int, step: Awaitable[T]) -> T:
        """Await ``step`` (its task or thread) with the attempt's span as the current
        OpenTelemetry context: what the step code calls continues the trace."""
        opened = self._open.get((position, attempt))
        if opened is None:
            return await step
        token = otel_context.attach(trace.set_span_in_context(opened[0]))
        try:
            return await step
        finally:
            otel_context.detach(token)

    def stored(self, events: Sequence[RunEvent]) -> None:
        """Events this activation stored (live, never replayed): the spans they start or end."""
        try:
            for e in events:
                if isinstance(e, StepStarted):
                    self._step_started(e)
                elif isinstance(e, (StepCompleted, StepFailed)):
                    self._step_ended(e)
                elif isinstance(e, WaitStarted):
                    self._waits[e.position] = e.at
                elif isinstance(e, WaitCompleted):
                    self._wait_ended(e)
                elif isinstance(e, ChildStarted):
                    self._child(e)
                elif isinstance(e, (RunCompleted, RunFailed, RunCancelled)):
                    self._run_ended(e)
        except Exception:  # tracing never fails a run
            log.debug("run %s: a span could not be made", self.run_id, exc_info=True)

    def _step_attributes(self, e: StepStarted) -> tuple[str, SpanKind, dict[str, Any]]:
        attributes: dict[str, Any] = {
            "sojourn.step.name": e.name,
            "sojourn.step.kind": e.kind,
            "sojourn.step.position": e.position,
            "sojourn.step.attempt": e.attempt,
            "sojourn.step.idempotency_key": f"{self.run_id}/{e.position}",
        }
        if e.kind != "llm":
            return e.name, SpanKind.INTERNAL, attributes
        model = e.name.removeprefix("llm:")
        attributes["gen_ai.operation.name"] = "chat"
        attributes["gen_ai.request.model"] = model
        return f"chat {model}", SpanKind.CLIENT, attributes

    def _step_started(self, e: StepStarted) -> None:
        lost = self._unended.pop((e.position, e.attempt - 1), None)
        name, kind, attributes = self._step_attributes(e)
        if lost is not None:
            self._lost(lost, e.at)
            attributes["sojourn.step.retry_of"] = "lost"
        elif e.attempt > 1:
            attributes["sojourn.step.retry_of"] = "failed"
        span_id = derived_id(64, "attempt", self.run_id, e.position, e.attempt)
        span = self._start(name, self.parent, span_id, e.at, kind, attributes)
        self._open[(e.position, e.attempt)] = (span, e.kind)

    def _lost(self, e: StepStarted, now: float) -> None:
        """An attempt whose worker died mid-step, emitted by the activation that runs the step
        again: from its recorded start to now, marked ``lost``."""
        name, kind, attributes = self._step_attributes(e)
        attributes["sojourn.step.outcome"] = "lost"
        span_id = derived_id(64, "attempt", self.run_id, e.position, e.attempt)
        span = self._start(name, self.parent, span_id, e.at, kind, attributes)
        span.set_status(Status(StatusCode.ERROR, "its worker stopped before recording its end"))
        span.end(end_time=_ns(max(now, e.at)))

    def _step_ended(self, e: StepCompleted | StepFailed) -> None:
        opened = self._open.pop((e.position, e.attempt), None)
        if opened is None:
            opened = self._settled(e)
            if opened is None:
                return
        span, kind = opened
        if isinstance(e, StepCompleted):
            span.set_attribute("sojourn.step.outcome", "completed")
            span.set_status(Status(StatusCode.OK))
        else:
            outcome = "retry_scheduled" if e.retry_at is not None else "failed"
            span.set_attribute("sojourn.step.outcome", outcome)
            span.set_attribute("error.type", e.error.type)
            span.set_status(Status(StatusCode.ERROR, e.error.message[:500]))
        usage = e.usage
        if usage is not None:
            if kind == "llm" or usage.requests:
                span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
                span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
                if usage.model:
                    span.set_attribute("gen_ai.response.model", usage.model)
            span.set_attribute("sojourn.usage.usd", usage.usd)
        span.end(end_time=_ns(e.at))

    def _settled(self, e: StepCompleted | StepFailed) -> tuple[Span, str] | None:
        """An in-doubt attempt settled without running again (its reconcile function found
        the work done, an operator decided): its span, from its recorded start, emitted now."""
        started = self._unended.pop((e.position, e.attempt), None)
        if started is None:
            return None
        name, kind, attributes = self._step_attributes(started)
        attributes["sojourn.step.settled"] = "in_doubt"
        span_id = derived_id(64, "attempt", self.run_id, e.position, e.attempt)
        return self._start(name, self.parent, span_id, started.at, kind, attributes), started.kind

    def _wait_ended(self, e: WaitCompleted) -> None:
        started = self._waits.pop(e.position, e.at)
        attributes: dict[str, Any] = {
            "sojourn.wait.key": e.key,
            "sojourn.wait.position": e.position,
            "sojourn.wait.outcome": e.outcome,
        }
        if e.child_status is not None:
            attributes["sojourn.wait.child_status"] = e.child_status
        span_id = derived_id(64, "wait", self.run_id, e.position)
        span = self._start(
            f"wait {e.key}", self.run_parent, span_id, started, attributes=attributes
        )
        if e.outcome == "signal" and e.signal and not e.signal.startswith(RESERVED_SIGNAL_PREFIX):
            self._signal(e, trace.set_span_in_context(span, otel_context.Context()))
        span.end(end_time=_ns(max(e.at, started)))

    def _signal(self, e: WaitCompleted, parent: otel_context.Context) -> None:
        """The delivery of the signal a wait took: from its receipt to the wait taking it, a
        link to the sender's span when the signal carried one."""
        record = next((r for r in self._act.state.signals if r.signal_id == e.signal_id), None)
        received = e.at if record is None else min(record.at, e.at)
        links: list[Link] = []
        sender = parse_traceparent(None if record is None else record.traceparent)
        if sender is not None:
            remote = SpanContext(
                sender.trace_id, sender.span_id, True, trace_flags=TraceFlags(sender.flags)
            )
            links.append(Link(remote))
        attributes: dict[str, Any] = {"sojourn.signal.name": e.signal or ""}
        if e.signal_id is not None:
            attributes["sojourn.signal.id"] = e.signal_id
        if e.sent_by is not None:
            attributes["sojourn.signal.sender"] = e.sent_by
        if e.sender_verified is not None:
            attributes["sojourn.signal.sender_verified"] = e.sender_verified
        span_id = derived_id(64, "signal", self.run_id, e.signal_id or e.position)
        span = self._start(
            f"signal {e.signal}", parent, span_id, received, SpanKind.CONSUMER, attributes, links
        )
        span.end(end_time=_ns(e.at))

    def _child(self, e: ChildStarted) -> None:
        """The start of a child run: the parent of the child's run span (``child_headers``)."""
        span_id = derived_id(64, "child", e.child_run_id)
        attributes = {
            "sojourn.child.run_id": e.child_run_id,
            "sojourn.child.agent": e.agent,
            "sojourn.child.position": e.position,
        }
        span = self._start(
            f"child {e.agent}", self.parent, span_id, e.at, SpanKind.PRODUCER, attributes
        )
        span.end(end_time=_ns(e.at))

    def _run_ended(self, e: RunCompleted | RunFailed | RunCancelled) -> None:
        s = self._act.state
        status = (
            "completed"
            if isinstance(e, RunCompleted)
            else "failed"
            if isinstance(e, RunFailed)
            else "cancelled"
        )
        attributes: dict[str, Any] = {
            "sojourn.agent": self.agent,
            "sojourn.run.status": status,
            "sojourn.run.generation": s.generation,
        }
        if s.parent_run_id:
            attributes["sojourn.run.parent_id"] = s.parent_run_id
        if isinstance(e, RunCompleted) and e.continued_as:
            attributes["sojourn.run.continued_as"] = e.continued_as
        started = s.started_at or e.at
        span = self._start(
            f"run {self.agent}", self.caller, self.run_span_id, started, attributes=attributes
        )
        if isinstance(e, RunFailed):
            span.set_attribute("error.type", e.error.type)
            span.set_status(Status(StatusCode.ERROR, e.error.message[:500]))
        span.end(end_time=_ns(max(e.at, started)))


# --- what a client sends, what a gateway receives ------------------------------------------------


def current_headers() -> dict[str, str]:
    """The caller's current span as trace headers (empty when there is none)."""
    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    parent, state = trace_context(carrier.get("traceparent"), carrier.get("tracestate"))
    if parent is None:
        return {}
    return {h.TRACEPARENT: parent, **({h.TRACESTATE: state} if state else {})}


def current_ids() -> tuple[str, str] | None:
    """The current span's trace and span ids in hex, for log records."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


async def http_span(
    app: Any,
    scope: MutableMapping[str, Any],
    receive: Any,
    send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    traceparent: str | None,
    tracestate: str | None,
) -> None:
    """One gateway request in a server span, a child of the caller's (its headers, if well
    formed). Its name is the route's endpoint, never the path (a callback's path holds its
    token)."""
    t = tracer()
    if t is None:
        await app(scope, receive, send)
        return
    parent, state = trace_context(traceparent, tracestate)
    context = otel_context.Context()
    if parent is not None:
        carrier = {"traceparent": parent, **({"tracestate": state} if state else {})}
        context = _PROPAGATOR.extract(carrier, context=context)
    method = str(scope.get("method", "GET"))[:16]
    span = t.start_span(
        f"{method}",
        context=context,
        kind=SpanKind.SERVER,
        attributes={"http.request.method": method},
    )

    async def sending(message: MutableMapping[str, Any]) -> None:
        if message.get("type") == "http.response.start":
            code = int(message.get("status", 0))
            span.set_attribute("http.response.status_code", code)
            if code >= 500:
                span.set_status(Status(StatusCode.ERROR))
        await send(message)

    token = otel_context.attach(trace.set_span_in_context(span, context))
    try:
        await app(scope, receive, sending)
    except BaseException:
        span.set_status(Status(StatusCode.ERROR))
        raise
    finally:
        otel_context.detach(token)
        endpoint = getattr(scope.get("endpoint"), "__name__", None)
        if isinstance(endpoint, str):
            span.update_name(f"{method} {endpoint}")
            span.set_attribute("sojourn.gateway.route", endpoint)
        span.end()


# --- the SDK, set up from the standard environment ----------------------------------------------


def configure(service: str) -> bool:
    """``telemetry.configure``: an SDK tracer provider with an OTLP/HTTP exporter (or the
    console's, ``OTEL_TRACES_EXPORTER=console``), when the environment asks for one."""
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter_name = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if exporter_name == "none" or (not endpoint and exporter_name not in ("otlp", "console")):
        return False
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        log.warning("OTEL_* asks for traces, but the otel extra is not installed: none exported")
        return False
    exporter: SpanExporter
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("the OTLP/HTTP exporter is not installed (pip install 'sojourn[otel]')")
            return False
        protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
        )
        if protocol.strip() != "http/protobuf":
            log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s: sojourn exports OTLP/HTTP", protocol[:40])
        exporter = OTLPSpanExporter()
    attributes = {} if env.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service}
    provider = TracerProvider(
        resource=Resource.create(attributes), id_generator=_Ids(RandomIdGenerator())
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return True
