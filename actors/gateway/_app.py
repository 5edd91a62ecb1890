"""The gateway's ASGI application: sojourn's client API over HTTP (docs/gateway.md).

Stateless: every answer comes from the broker (or the read side's listing service) through
one ``Client``, so any number of gateways may run behind a load balancer. The routes:

- ``POST /v1/agents/{agent}/runs`` start (``Idempotency-Key`` is the run id);
- ``GET /v1/runs`` list (the read side), ``GET /v1/runs/{id}`` status, ``.../history``;
- ``POST /v1/runs/{id}/signals/{name}``, ``.../updates/{name}`` (``_updates.py``),
  ``.../cancel``, ``.../fork``; the operator's ``terminate``, ``resume``, ``budget``,
  ``pause``, ``unpause``, ``POST /v1/agents/{agent}/{pause,unpause}`` and
  ``POST /v1/schedules/{name}/{pause,resume}`` (``_controls.py``, admin only);
- the shared rate limits: ``GET /v1/limits``, ``/v1/limits/{name}...`` (``_limits.py``);
- ``GET /v1/runs/{id}/events`` (views) and ``GET /v1/runs/{id}/stream`` (output chunks) as
  server-sent events, resumable with ``Last-Event-ID``;
- ``POST /v1/callbacks/{token}`` and ``POST /v1/webhooks/{route}/{token}``: the only routes
  without a bearer token; a signed callback token delivers one signal to one run, once;
- ``GET /v1/openapi.json``, ``GET /healthz``;
- ``/ui/...``: the web console (``sojourn.actors.console``), when the CLI passes its routes.

A request is authenticated by its bearer token or, without an ``Authorization`` header, by a
console session cookie (``_sessions.py``), which needs its CSRF token on anything but a read;
CORS headers are sent only to the origins ``--cors-origin`` names.

What a caller starts, signals and cancels is sent as the name its bearer token has in the
tokens file (``<prefix>.as.<name>...``), so the history records the caller; callbacks and
webhooks, and tokens without a name, are sent as the gateway's own NATS user.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sojourn.schemas.codec import decode_events, encode, from_raw
from sojourn.schemas.errors import (
    BrokerUnavailable,
    CallbackTokenExpired,
    CallbackTokenInvalid,
    InvalidName,
    PayloadTooLarge,
    PermissionDenied,
    RunNotFound,
    SojournError,
    UnknownAgent,
    WebhookRejected,
)
from sojourn.schemas.events import RunEvent
from sojourn.schemas.gateway import (
    GATEWAY_ACTIONS,
    CallbackAnswer,
    CancelAnswer,
    GatewayAction,
    SignalAnswer,
)
from sojourn.schemas.health import LIVENESS_STATES
from sojourn.schemas.lifecycle import end_status
from sojourn.schemas.names import reserved_run_id, validate_signal_name, validate_token
from sojourn.schemas.views import QUERY_LIMIT_MAX
from sojourn.schemas.vocabulary import RUN_STATUSES
from sojourn.schemas.wire import RESERVED_SIGNAL_PREFIX

from ..agents.callbacks import CallbackClaims, CallbackKeys
from ..client.base import TriggerRejected
from ..client.client import Client
from ..client.listing import list_runs
from ..client.reports import history_report, status_report
from ..client.watching import presence
from ..history.chain import continued_as
from ..ops import metrics as _metrics
from ..telemetry import TraceMiddleware
from ._auth import BearerTokens, Caller, Policy
from ._concurrency import concurrency_options
from ._controls import Controls
from ._deadletters import DeadLetters
from ._flow import REQUEST_HEADERS, START_HEADERS, flow_options
from ._forks import Forking
from ._http import (
    HttpProblem,
    json_response,
    payload_of,
    problem_response,
    read_body,
    require_json,
    unix_seconds,
)
from ._keyed import start_answer, start_options
from ._limits import limits_routes
from ._openapi import openapi_document
from ._routed import RoutedWebhooks, query_attributes
from ._sessions import COOKIE, CSRF_HEADER, SessionKey, Sessions, same_origin
from ._sse import EventStreams
from ._steps import steps_route
from ._updates import updates_route
from ._webhooks import WebhookRoute
from ._webhooks import verify as verify_webhook

__all__ = ["GatewayConfig", "create_app"]

log = logging.getLogger("sojourn.gateway")

_SAFE_METHODS: Final = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class GatewayConfig:
    """What a gateway process is configured with (``sojourn gateway --help``).

    Attributes:
        tokens: the bearer tokens and their roles.
        policy: which actions need the admin role.
        callback_keys: the keys callback tokens are verified with (``None``: 404 for all).
        webhooks: the webhook routes by name.
        max_body: the largest request body read, in bytes.
        start_wait: how long a start or signal waits for the intake's answer before it is
            answered "stored, not yet taken" (202).
        keepalive: seconds between comments on an idle event stream (for proxies).
        max_streams: event streams open at once; one more is answered 503 (each holds
            subscriptions on the broker and a task here).
        sessions: how console session cookies are signed and how long they last.
        cors_origins: the origins (``https://app.example.com``) answered with CORS headers.
        console: serve the web console under ``/ui/``.
    """

    tokens: BearerTokens
    policy: Policy = field(default_factory=Policy)
    callback_keys: CallbackKeys | None = None
    webhooks: Mapping[str, WebhookRoute] = field(default_factory=dict)
    max_body: int = 1 << 20
    start_wait: float = 5.0
    keepalive: float = 15.0
    max_streams: int = 10_000
    sessions: Sessions | None = None
    """Console sessions (``None``: signed with a key of this process only)."""
    cors_origins: tuple[str, ...] = ()
    """Origins whose pages may call the API with a bearer token (none: CORS stays closed)."""
    console: bool = True


def create_app(
    connect: Callable[[], Awaitable[Client]],
    config: GatewayConfig,
    console: Callable[[Any], list[BaseRoute]] | None = None,
) -> Starlette:
    """The gateway's ASGI app; ``connect`` makes its ``Client`` when the server starts (and
    the client is closed when it stops). ``console``: the web console's routes for this
    gateway (``sojourn.actors.console.console_routes``), served unless ``config.console`` is
    off; the console depends on the gateway, never the other way round."""
    gw = _Gateway(config)
    gw.sessions = config.sessions or Sessions(SessionKey.random(), config.tokens)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        gw.client = await connect()
        # The callers' names: what the client may send as besides its own user (the broker's
        # permissions decide; AuthUser.speaks_for, docs/decisions/0029).
        gw.client.speaks_for = gw.client.speaks_for | config.tokens.names
        gw.dead_letters = DeadLetters(gw.client)
        app.state.client = gw.client
        try:
            yield
        finally:
            app.state.client = None
            await gw.client.close()

    routes: list[BaseRoute] = [
        Route("/healthz", gw.healthz, methods=["GET"]),
        Route("/v1/openapi.json", gw.openapi, methods=["GET"]),
        Route("/v1/agents/{agent}/runs", gw.start, methods=["POST"]),
        Route("/v1/runs", gw.runs, methods=["GET"]),
        Route("/v1/runs/{run_id}", gw.status, methods=["GET"]),
        Route("/v1/runs/{run_id}/history", gw.history, methods=["GET"]),
        steps_route(gw),
        Route("/v1/runs/{run_id}/signals/{name}", gw.signal, methods=["POST"]),
        updates_route(gw),
        Route("/v1/runs/{run_id}/cancel", gw.cancel, methods=["POST"]),
        Route("/v1/runs/{run_id}/fork", gw.fork, methods=["POST"]),
        Route("/v1/runs/{run_id}/terminate", gw.terminate, methods=["POST"]),
        Route("/v1/runs/{run_id}/resume", gw.resume, methods=["POST"]),
        Route("/v1/runs/{run_id}/budget", gw.budget, methods=["POST"]),
        Route("/v1/schedules/{name}/{verb}", gw.schedule, methods=["POST"]),
        *limits_routes(gw),
        Route("/v1/agents/{agent}/{verb}", gw.pause, methods=["POST"]),
        Route("/v1/runs/{run_id}/events", gw.events, methods=["GET"]),
        Route("/v1/runs/{run_id}/stream", gw.stream, methods=["GET"]),
        Route("/v1/callbacks/{token}", gw.callback, methods=["POST"]),
        Route("/v1/webhooks/{route}/{token}", gw.webhook, methods=["POST"]),
        Route("/v1/webhooks/{route}", gw.routed, methods=["POST"]),
        Route("/v1/runs/{run_id}/{verb}", gw.pause, methods=["POST"]),  # pause, unpause
    ]

    async def http_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "internal")
        return problem_response(HttpProblem(code, str(exc.detail)))

    if console is not None and config.console:
        routes += console(gw)
    middleware = [Middleware(TraceMiddleware)]  # a span per request, the caller's trace on
    if config.cors_origins:
        # Named origins only, never credentials: a page elsewhere calls the API with a bearer
        # token it holds; the console's cookie is SameSite=Strict and stays on this origin.
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(config.cors_origins),
                allow_methods=["GET", "POST"],
                allow_headers=[*REQUEST_HEADERS, *START_HEADERS],
                expose_headers=["Location", "Retry-After"],
                allow_credentials=False,
                max_age=600,
            )
        )
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=middleware,
        exception_handlers={HTTPException: http_error},
    )
    app.state.client = None
    app.state.closing = gw.closing  # set by ``GatewayServer.stop``: event streams end cleanly
    return app


Handler = Callable[[Request], Awaitable[Response]]


def _answers(handler: Callable[[Any, Request], Awaitable[Response]]) -> Any:
    """Turn every failure of a handler into its problem document; the broker's trouble is
    ``unavailable`` (503), anything unforeseen ``internal`` (500, logged, no details out)."""

    route = handler.__name__

    async def wrapped(self: _Gateway, request: Request) -> Response:
        try:
            response = await handler(self, request)
        except HttpProblem as p:
            response = problem_response(p)
        except BrokerUnavailable as e:
            response = problem_response(HttpProblem("unavailable", str(e)))
        except PermissionDenied as e:
            # The deployment's configuration, not the caller: most likely the gateway's NATS
            # user was not given the caller's name to speak for.
            log.error(
                "%s %s: %s (is the gateway's NATS user allowed to speak for every NAME of its "
                "tokens file? python -m sojourn.broker.auth --speaks-for USER=NAME,...; "
                "docs/gateway.md)",
                *(request.method, request.url.path, e.message),
            )
            response = problem_response(HttpProblem("internal", "the gateway failed; see its log"))
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            response = problem_response(HttpProblem("internal", "the gateway failed; see its log"))
        _metrics.GATEWAY_REQUESTS.labels(route, str(response.status_code)).inc()
        return response

    wrapped.__name__ = handler.__name__
    wrapped.__doc__ = handler.__doc__
    return wrapped


class _Gateway(Controls, RoutedWebhooks, Forking, EventStreams):
    def __init__(self, config: GatewayConfig) -> None:
        self.config: GatewayConfig = config
        self.max_body = config.max_body
        self.client: Client
        self.sessions: Sessions
        self.dead_letters: DeadLetters
        self._openapi: bytes | None = None
        self.streams_open = 0
        self.closing = asyncio.Event()

    # --- who is asking --------------------------------------------------------------------

    def _authorize(self, request: Request, action: GatewayAction) -> Caller:
        """Who is asking (its bearer token's role and name, or those of the token a console
        session was made from), allowed to take ``action``. A bearer token wins over a
        cookie; a request made with the cookie alone that changes anything needs the
        session's CSRF token and must come from this origin."""
        header = request.headers.get("authorization")
        caller: Caller | None
        if header is None and COOKIE in request.cookies:
            caller = self._session_caller(request)
        else:
            caller = self.config.tokens.caller_of(header)
        if caller is None:
            raise HttpProblem(
                "unauthorized",
                "a bearer token is required (Authorization: Bearer TOKEN)",
                headers={"WWW-Authenticate": 'Bearer realm="sojourn"'},
            )
        if not self.config.policy.allows(caller.role, action):
            raise HttpProblem("forbidden", f"{action} needs a token with the admin role")
        return caller

    authorize = _authorize

    def allowed(self, caller: Caller) -> list[GatewayAction]:
        """The actions ``caller`` may take (what the console offers)."""
        return [a for a in GATEWAY_ACTIONS if self.config.policy.allows(caller.role, a)]

    def _session_caller(self, request: Request) -> Caller:
        session = self.sessions.session_of(request.cookies.get(COOKIE), time.time())
        if session is None:
            raise HttpProblem(
                "unauthorized",
                "the console session has ended or is not valid: sign in again",
                headers={"WWW-Authenticate": 'Bearer realm="sojourn"'},
            )
        if request.method not in _SAFE_METHODS:
            origin = request.headers.get("origin")
            if origin is not None and not same_origin(request, origin):
                raise HttpProblem("invalid_csrf", "a request with the session from another site")
            if not Sessions.csrf_ok(session, request.headers.get(CSRF_HEADER)):
                raise HttpProblem(
                    "invalid_csrf", "a request with the session cookie needs its X-CSRF-Token"
                )
        return session.caller

    # --- helpers --------------------------------------------------------------------------

    @staticmethod
    def _run_id(request: Request) -> str:
        run_id = str(request.path_params["run_id"])
        try:
            return validate_token(run_id, "run_id")
        except InvalidName as e:
            raise HttpProblem("invalid_run_id", e.message) from None

    @staticmethod
    def _rejected(e: TriggerRejected, run_id: str | None) -> HttpProblem:
        return HttpProblem(e.code, e.message, run_id=run_id)

    # --- routes ---------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def openapi(self, request: Request) -> Response:
        if self._openapi is None:
            self._openapi = encode(openapi_document())
        return Response(self._openapi, media_type="application/json")

    @_answers
    async def start(self, request: Request) -> Response:
        caller = self._authorize(request, "start")
        agent = str(request.path_params["agent"])
        try:
            validate_token(agent, "agent name")
        except InvalidName as e:
            raise HttpProblem("unknown_agent", e.message) from None
        run_id = request.headers.get("idempotency-key")
        if run_id is not None:
            try:
                validate_token(run_id, "Idempotency-Key (the run id)")
            except InvalidName as e:
                raise HttpProblem("invalid_run_id", e.message) from None
            why = reserved_run_id(run_id)
            if why is not None:
                raise HttpProblem("invalid_run_id", f"run id {run_id!r} {why}")
        options = start_options(request.headers)  # attributes, keyed starts (0047)
        limited = concurrency_options(request.headers)  # a concurrency key (0048)
        limited.update(flow_options(request.headers))  # priority and fairness (0049)
        body = await read_body(request, self.config.max_body)
        value = require_json(request, body)
        try:
            receipt = await self.client.trigger(
                agent,
                value,
                run_id=run_id,
                wait=True,
                timeout=self.config.start_wait,
                sender=caller.name,
                **options,
                **limited,
            )
        except UnknownAgent as e:
            raise HttpProblem("unknown_agent", e.message) from None
        except TriggerRejected as e:
            raise self._rejected(e, run_id) from None
        except PayloadTooLarge as e:
            raise HttpProblem("payload_too_large", e.message) from None
        answer, status = start_answer(receipt, "singleton_key" in options or "debounce" in options)
        return json_response(answer, status, {"Location": f"/v1/runs/{receipt.run_id}"})

    @_answers
    async def status(self, request: Request) -> Response:
        self._authorize(request, "read")
        run_id = self._run_id(request)
        try:
            return json_response(await status_report(self.client, run_id))
        except RunNotFound as e:
            raise HttpProblem("unknown_run", e.message, run_id=run_id) from None

    @_answers
    async def history(self, request: Request) -> Response:
        self._authorize(request, "read")
        run_id = self._run_id(request)
        history = await self.client.history(run_id)
        if not history and await self.client.pending(run_id) is None:
            raise HttpProblem("unknown_run", f"no run with id '{run_id}'", run_id=run_id)
        return json_response(history_report(history))

    @_answers
    async def runs(self, request: Request) -> Response:
        self._authorize(request, "read")
        q = request.query_params
        unknown = {k for k in q if not k.startswith("attr.")} - {
            "agent", "status", "liveness", "schedule", "parent", "since", "limit", "after"
        }  # fmt: skip
        if unknown:
            raise HttpProblem("invalid_query", f"unknown parameter {sorted(unknown)[0][:64]!r}")
        statuses = [s for v in q.getlist("status") for s in v.split(",") if s]
        bad = [s for s in statuses if s not in RUN_STATUSES]
        if bad:
            raise HttpProblem("invalid_query", f"status {bad[0][:32]!r} is not a run status")
        states = [s for v in q.getlist("liveness") for s in v.split(",") if s]
        wrong = [s for s in states if s not in LIVENESS_STATES]
        if wrong:
            raise HttpProblem("invalid_query", f"liveness {wrong[0][:32]!r} is not a state")
        since = unix_seconds(q.get("since"), "since")
        limit_text = q.get("limit", "100")
        if not limit_text.isdigit() or not 1 <= int(limit_text) <= QUERY_LIMIT_MAX:
            raise HttpProblem("invalid_query", f"limit: 1 to {QUERY_LIMIT_MAX}")
        try:
            page = await list_runs(
                self.client.broker,
                self.client.names,
                agent=q.get("agent"),
                status=[s for s in RUN_STATUSES if s in statuses],
                liveness=[s for s in LIVENESS_STATES if s in states],
                since=since,
                schedule=q.get("schedule"),
                parent_run_id=q.get("parent"),
                attributes=query_attributes(q),
                after=q.get("after"),
                limit=int(limit_text),
            )
        except InvalidName as e:
            raise HttpProblem("invalid_query", e.message) from None
        except ValueError as e:
            raise HttpProblem("invalid_query", str(e)) from None
        except SojournError as e:
            raise HttpProblem("unavailable", e.message) from None
        return json_response({"runs": page.runs, "next": page.next})

    @_answers
    async def signal(self, request: Request) -> Response:
        caller = self._authorize(request, "signal")
        run_id = self._run_id(request)
        name = str(request.path_params["name"])
        try:
            validate_signal_name(name)
        except InvalidName as e:
            raise HttpProblem("invalid_trigger", e.message, run_id=run_id) from None
        if name.startswith(RESERVED_SIGNAL_PREFIX):
            raise HttpProblem(
                "forbidden", f"signal names starting with {RESERVED_SIGNAL_PREFIX!r} are reserved"
            )
        signal_id = request.headers.get("idempotency-key")
        body = await read_body(request, self.config.max_body)
        value = require_json(request, body)
        await self._exists(run_id)
        sid = await self._signal(run_id, name, value, signal_id, caller.name)
        return json_response(SignalAnswer(run_id=run_id, signal=name, signal_id=sid), 202)

    async def _signal(
        self, run_id: str, name: str, value: Any, signal_id: str | None, sender: str | None
    ) -> str:
        """Send the signal as ``sender`` (``None``: as the gateway's own user)."""
        try:
            return await self.client.signal(
                run_id,
                name,
                value,
                signal_id=signal_id,
                sender=sender,
                wait=True,
                timeout=self.config.start_wait,
            )
        except TriggerRejected as e:
            raise self._rejected(e, run_id) from None
        except PayloadTooLarge as e:
            raise HttpProblem("payload_too_large", e.message, run_id=run_id) from None
        except InvalidName as e:
            raise HttpProblem("invalid_header", e.message, run_id=run_id) from None

    @_answers
    async def cancel(self, request: Request) -> Response:
        caller = self._authorize(request, "cancel")
        run_id = self._run_id(request)
        body = await read_body(request, self.config.max_body)
        value = require_json(request, body)
        reason = ""
        if value is not None:
            try:
                reason = from_raw(value, _CancelRequest).reason
            except msgspec.ValidationError as e:
                raise HttpProblem("invalid_trigger", f"cancel body: {e}", run_id=run_id) from None
        last = await self._exists(run_id)
        ended = next((status for e in last if (status := end_status(e)) is not None), None)
        if ended is not None and continued_as(last) is None:
            # The intake would take the cancel and write nothing; saying 202 "cancel requested"
            # for it would be untrue. (A run that continued as new is cancelled in its chain's
            # current run, by the intake.)
            raise HttpProblem(
                "run_ended",
                f"run '{run_id}' has already ended ({ended}): nothing to cancel",
                run_id=run_id,
            )
        try:
            await self.client.cancel(
                run_id, reason, by=caller.name, wait=True, timeout=self.config.start_wait
            )
        except TriggerRejected as e:
            raise self._rejected(e, run_id) from None
        return json_response(CancelAnswer(run_id=run_id), 202)

    terminate = _answers(Controls.terminate)
    resume = _answers(Controls.resume)
    budget = _answers(Controls.budget)
    schedule = _answers(Controls.schedule)
    pause = _answers(Controls.pause)
    routed = _answers(RoutedWebhooks.routed)
    fork = _answers(Forking.fork)

    # --- server-sent events (``EventStreams``: admission, resume point, the response) -------

    async def _exists(self, run_id: str) -> list[RunEvent]:
        """``unknown_run`` at once for a run nothing is known of (the intake would take a few
        seconds of retries to say so), from a look at its last event and its stored start.
        A run with a history costs one read; only one without looks further. Returns the
        events of the run's last decision (none for a run not started yet), so that a caller
        can tell an ended run without another read."""
        broker, names = self.client.broker, self.client.names
        last = await broker.direct_get_last(names.events_stream, names.events(run_id))
        if last is not None:
            try:
                return list(decode_events(last.data))
            except msgspec.MsgspecError:
                return []  # not ours to judge here: the intake answers for it
        if await presence(broker, names, run_id) == "missing":
            raise HttpProblem("unknown_run", f"no run with id '{run_id}'", run_id=run_id)
        return []

    async def _open_stream(self, request: Request) -> tuple[str, int]:
        """The run and the resume point (``after``) of an event stream's request (``events``,
        ``stream``), once the caller may read, a stream is free and the run exists."""
        self._authorize(request, "read")
        run_id = self._run_id(request)
        after = self._resume_from(request, "after")
        self._admit_stream()
        await self._exists(run_id)
        return run_id, after

    @_answers
    async def events(self, request: Request) -> Response:
        """Every view of the run as it changes (``event: view``, ``id`` its ``last_seq``),
        then ``event: end``."""
        run_id, after = await self._open_stream(request)

        async def views() -> AsyncIterator[tuple[str, int | None, bytes]]:
            async with contextlib.aclosing(self.client.watch(run_id)) as stream:
                async for view in stream:
                    if after and view.last_seq <= after:
                        continue  # sent before (a pending view, with no last_seq, too)
                    yield "view", view.last_seq or None, encode(view)

        return self._sse(views())

    @_answers
    async def stream(self, request: Request) -> Response:
        """The run's output chunks after an offset (``event: chunk``, ``id`` the offset), then
        ``event: end`` once the run has ended and every chunk was sent."""
        run_id, after = await self._open_stream(request)

        async def chunks() -> AsyncIterator[tuple[str, int | None, bytes]]:
            async with self.client.stream(run_id, after=after) as reader:
                async for c in reader:
                    yield "chunk", c.offset, encode(c.as_json())

        return self._sse(chunks())

    # --- callbacks and webhooks -----------------------------------------------------------

    def _keys(self) -> CallbackKeys:
        if self.config.callback_keys is None:
            raise HttpProblem("not_found", "this gateway has no callback keys configured")
        return self.config.callback_keys

    @_answers
    async def callback(self, request: Request) -> Response:
        keys = self._keys()
        token = str(request.path_params["token"])
        claims = await self._claims(request, keys, token, b"")
        return await self._deliver(request, claims)

    @_answers
    async def webhook(self, request: Request) -> Response:
        keys = self._keys()
        name = str(request.path_params["route"])
        route = self.config.webhooks.get(name)
        if route is None:
            await self.dead_letters.keep(request, b"", "unknown_webhook", "no such webhook route")
            raise HttpProblem("unknown_webhook", f"no webhook route {name[:64]!r}")
        body = await self._bounded(request)
        try:
            verify_webhook(route, request.headers, body, time.time())
        except WebhookRejected as e:
            await self.dead_letters.keep(request, body, e.code, e.message)
            raise HttpProblem(e.code, e.message) from None
        claims = await self._claims(request, keys, str(request.path_params["token"]), body)
        return await self._deliver(request, claims, body)

    async def _bounded(self, request: Request) -> bytes:
        try:
            return await read_body(request, self.config.max_body)
        except HttpProblem as p:
            await self.dead_letters.keep(request, b"", p.code, p.detail)
            raise

    async def _claims(
        self, request: Request, keys: CallbackKeys, token: str, body: bytes
    ) -> CallbackClaims:
        try:
            return keys.verify(token, time.time())
        except CallbackTokenExpired as e:
            await self.dead_letters.keep(request, body, "token_expired", e.message)
            raise HttpProblem("token_expired", e.message) from None
        except CallbackTokenInvalid as e:
            await self.dead_letters.keep(request, body, "invalid_token", e.message)
            raise HttpProblem("invalid_token", e.message) from None

    async def _deliver(
        self, request: Request, claims: CallbackClaims, body: bytes | None = None
    ) -> Response:
        """The claims' one signal, with the body as its payload, under the claims' signal id:
        a repeat is the same signal, answered the same. Sent as the gateway's own user: the
        signed token is the credential, and it names no caller."""
        if body is None:
            body = await self._bounded(request)
        try:
            payload = payload_of(request, body)
        except HttpProblem as p:
            await self.dead_letters.keep(request, body, p.code, p.detail)
            raise
        try:
            sid = await self._signal(
                claims.run_id, claims.signal, payload, claims.signal_id, sender=None
            )
        except HttpProblem as p:
            if p.status != 503:
                await self.dead_letters.keep(request, body, p.code, p.detail)
            raise
        answer = CallbackAnswer(delivered=True, signal=claims.signal, signal_id=sid)
        return json_response(answer)


class _CancelRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    reason: str = ""
