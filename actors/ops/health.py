"""Liveness and readiness of a serving process, and the HTTP app that answers its probes.

One ``Health`` per process (``PROCESS_HEALTH``, like the metrics registry): the serving
commands register what they run (a worker, a watchdog, a projector) and the metrics port
answers ``GET /healthz`` and ``GET /readyz`` next to ``/metrics``.

The HTTP server runs in threads, the components in the event loop. The probes never look at
the components from a server thread: a tick the loop schedules every ``TICK`` seconds records
the time and each component's readiness, and the probes judge that record. A wedged loop
stops ticking, so its record goes stale: ``/healthz`` fails once it is ``LIVE_WITHIN``
seconds old, ``/readyz`` once it is ``READY_WITHIN`` seconds old.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any, Protocol
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer

__all__ = [
    "LIVE_WITHIN",
    "PROCESS_HEALTH",
    "READY_WITHIN",
    "TICK",
    "Check",
    "Health",
    "Phase",
    "ProbeApp",
    "ProbeRequestHandler",
    "ProbeServer",
    "gateway_check",
    "projector_check",
    "watchdog_check",
    "worker_check",
]

TICK = 1.0
"""Seconds between two ticks of the event loop's health record."""

LIVE_WITHIN = 10.0
"""``/healthz`` fails (503) when the loop has not ticked for this long: ten missed ticks, long
enough that a busy loop (a burst of work, a slow fold) is not taken for a wedged one, short
enough that a liveness probe restarts a wedged process well within a run's lease."""

READY_WITHIN = 3.0
"""``/readyz`` fails (503) when its record is this old: it stops traffic sooner than
``/healthz`` restarts, and a stale record says nothing about the connection."""

REQUEST_LINE_MAX = 4096
"""Longest request line accepted (longer: 414), instead of wsgiref's 64 KiB."""

REQUEST_TIMEOUT = 10.0
"""Seconds a client may take to send its request before its connection is closed."""

CONNECTIONS_MAX = 32
"""Requests served at once (a thread each); connections past that are closed unanswered."""

Check = Callable[[], str | None]
"""Whether a component is ready: ``None``, or why not (a short sentence). Called on the event
loop, so it may look at the component's state freely (and must not block)."""

_PROBE_PATHS = re.compile(r"/(healthz|readyz)")
_JSON = [("Content-Type", "application/json"), ("Cache-Control", "no-store")]


class Health:
    """What the probes answer, from a record the event loop keeps fresh.

    ``start()`` (on the loop) begins ticking; ``add``/``remove`` register components by name.
    The process is ready while it ticks, has at least one component and every component's
    check passes; it is live while it ticks.
    """

    def __init__(
        self,
        *,
        tick: float = TICK,
        live_within: float = LIVE_WITHIN,
        ready_within: float = READY_WITHIN,
    ) -> None:
        self.tick = tick
        self.live_within = live_within
        self.ready_within = ready_within
        self._checks: dict[str, Check] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._lock = threading.Lock()
        # (monotonic time of the last tick, reasons for not being ready): replaced whole on
        # each tick, read whole by the probes, so a server thread never sees half of one.
        self._record: tuple[float, tuple[str, ...]] | None = None

    # --- the event loop's side ---------------------------------------------------------------

    def start(self) -> None:
        """Tick on the running loop from now on (again after ``stop``); a no-op when already
        ticking or called outside a loop."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._timer is not None and self._loop is loop and not loop.is_closed():
            return
        self._loop = loop
        self._beat()

    def stop(self) -> None:
        """Stop ticking and forget the record: the probes fail from now on."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._loop = None
        self._record = None

    def add(self, name: str, check: Check) -> None:
        """Register a component (a worker, a watchdog, a projector); replaces one of the same
        name. Judged at the next tick, which is scheduled now."""
        self._checks[name] = check
        self.refresh()

    def remove(self, name: str) -> None:
        self._checks.pop(name, None)
        self.refresh()

    def _beat(self) -> None:
        self.refresh()
        assert self._loop is not None
        self._timer = self._loop.call_later(self.tick, self._beat)

    def refresh(self) -> None:
        """Judge every component now (each tick does; call after a change that should show at
        once)."""
        if self._loop is None:
            return
        reasons: list[str] = []
        for name, check in list(self._checks.items()):
            try:
                why = check()
            except Exception as e:  # a check that breaks says so instead of killing the tick
                why = f"readiness check failed: {type(e).__name__}"
            if why is not None:
                reasons.append(f"{name}: {why}")
        if not self._checks:
            reasons.append("starting")
        self._record = (time.monotonic(), tuple(reasons))

    # --- the probes' side (any thread) -------------------------------------------------------

    def liveness(self) -> tuple[int, dict[str, Any]]:
        """``(200, {"status": "ok"})`` while the loop ticks, else 503 and why."""
        record = self._record
        if record is None:
            return 503, {"status": "unhealthy", "reason": "event loop not monitored"}
        age = time.monotonic() - record[0]
        if age > self.live_within:
            return 503, {
                "status": "unhealthy",
                "reason": f"event loop unresponsive for {age:.1f}s (limit {self.live_within:g}s)",
            }
        return 200, {"status": "ok"}

    def readiness(self) -> tuple[int, dict[str, Any]]:
        """``(200, {"status": "ready"})`` when every component is ready, else 503 with the
        reasons (the first as ``reason``, all as ``reasons``)."""
        record = self._record
        if record is None:
            return 503, {"status": "not_ready", "reason": "event loop not monitored"}
        age = time.monotonic() - record[0]
        if age > self.ready_within:
            why = f"event loop unresponsive for {age:.1f}s (limit {self.ready_within:g}s)"
            return 503, {"status": "not_ready", "reason": why}
        reasons = list(record[1])
        if reasons:
            return 503, {"status": "not_ready", "reason": reasons[0], "reasons": reasons}
        return 200, {"status": "ready"}


class Phase:
    """A serving command's own check: ``"starting"`` until it says it serves (``serving``),
    ``"stopping"`` once it begins to stop (``stopping``), so the process is not ready in
    between two of its components being started or stopped."""

    def __init__(self) -> None:
        self.reason: str | None = "starting"

    def serving(self) -> None:
        self.reason = None

    def stopping(self) -> None:
        self.reason = "stopping"

    def __call__(self) -> str | None:
        return self.reason


PROCESS_HEALTH = Health()
"""This process's health, which ``serve_metrics`` answers for and the serving commands
update."""


# --- the checks of sojourn's components ----------------------------------------------------
# They read the components' private state (as the metrics collectors do), never change it.


class _Connected(Protocol):
    @property
    def connected(self) -> bool: ...


def _connection(broker: _Connected | None) -> str | None:
    if broker is None:
        return "not connected yet"
    return None if broker.connected else "nats disconnected"


def _loops(tasks: Iterable[asyncio.Task[Any] | None], what: str) -> str | None:
    for task in tasks:
        if task is None:
            return f"{what} not started"
        if task.done():
            return f"{what} {task.get_name()} ended"
    return None


def worker_check(worker: Any) -> Check:
    """A ``Worker``: started (topology ensured, consumers bound), not stopping, connected,
    and its intake, wake and heartbeat loops running."""

    def check() -> str | None:
        if worker._stopping.is_set():
            return "stopping"
        if not worker._tasks:
            return "starting"
        return _connection(worker._broker) or _loops(worker._tasks, "loop")

    return check


def gateway_check(app: Any) -> Check:
    """A gateway's app (``create_app``): its client connected (it answers 503 without)."""

    def check() -> str | None:
        client = getattr(app.state, "client", None)
        return _connection(None if client is None else client.broker)

    return check


def watchdog_check(watchdog: Any) -> Check:
    """A ``Watchdog``: connected and its scan loop running."""

    def check() -> str | None:
        if watchdog._stopping:
            return "stopping"
        return _connection(watchdog._broker) or _loops([watchdog._task], "loop")

    return check


def projector_check(projector: Any) -> Check:
    """A ``Projector``: connected and folding (its loop running), as leader or follower."""

    def check() -> str | None:
        if projector._stopping:
            return "stopping"
        return _connection(projector._broker) or _loops([projector._task], "loop")

    return check


# --- HTTP ------------------------------------------------------------------------------------

_Start = Callable[..., Any]
_App = Callable[[dict[str, Any], _Start], Iterable[bytes]]


class ProbeApp:
    """The WSGI app of the metrics port: ``/metrics`` (handed to ``metrics``), ``/healthz``
    and ``/readyz``; other paths 404, other methods than GET and HEAD 405. Request bodies are
    never read."""

    def __init__(self, metrics: _App, health: Health) -> None:
        self.metrics = metrics
        self.health = health

    def __call__(self, environ: dict[str, Any], start_response: _Start) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "")
        path = environ.get("PATH_INFO", "")
        known = path == "/metrics" or _PROBE_PATHS.fullmatch(path) is not None
        if not known:
            return _answer(start_response, 404, {"status": "not_found"}, method)
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [*_JSON, ("Allow", "GET, HEAD")])
            return [b'{"status":"method_not_allowed"}']
        if path == "/metrics":
            return self.metrics(environ, start_response)
        code, body = self.health.liveness() if path == "/healthz" else self.health.readiness()
        return _answer(start_response, code, body, method)


_REASONS = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}


def _answer(start: _Start, code: int, body: dict[str, Any], method: str) -> list[bytes]:
    data = json.dumps(body, separators=(",", ":")).encode()
    start(f"{code} {_REASONS[code]}", [*_JSON, ("Content-Length", str(len(data)))])
    return [] if method == "HEAD" else [data]


class ProbeRequestHandler(WSGIRequestHandler):
    """wsgiref's handler with a shorter request line, a read timeout (a client that sends
    nothing does not hold a thread forever) and no request log."""

    timeout = REQUEST_TIMEOUT

    def handle(self) -> None:
        self.raw_requestline = self.rfile.readline(REQUEST_LINE_MAX + 1)
        if len(self.raw_requestline) > REQUEST_LINE_MAX:
            self.requestline = ""
            self.request_version = ""
            self.command = ""
            self.send_error(414)
            return
        if not self.parse_request():
            return
        # The rest as wsgiref does it (its ``handle`` reads the request line itself, so it is
        # replaced whole rather than extended).
        handler = ServerHandler(
            self.rfile,
            self.wfile,  # type: ignore[arg-type]  # a socket's buffered writer: IO[bytes] enough
            self.get_stderr(),
            self.get_environ(),
            multithread=False,
        )
        handler.request_handler = self  # type: ignore[attr-defined]
        handler.run(self.server.get_app())  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing: probes come every few seconds."""


class ProbeServer(ThreadingMixIn, WSGIServer):
    """A thread per request, at most ``CONNECTIONS_MAX`` at once, none of which keeps the
    process alive (daemon threads, not joined at close)."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(CONNECTIONS_MAX)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()
