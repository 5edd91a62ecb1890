"""The console's routes under ``/ui/`` (docs/console.md): its pages and assets, the sign-in
that turns a bearer token into a session cookie, and the read models only the console needs
(a run's timeline, the approvals inbox, schedules, workers, dead letters).

Everything the console changes goes through the gateway's own ``/v1`` routes (signals,
cancels, resumes, budgets, terminate, schedules) with the session cookie and its CSRF token;
the role of the session is its token's, so the console can do no more than the token could.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any, Final, Protocol

import msgspec
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from sojourn.broker.follow import read_all
from sojourn.schemas.codec import decode_dead_letter, decode_worker_beat, from_raw
from sojourn.schemas.errors import BrokerUnavailable, InvalidName, SojournError
from sojourn.schemas.gateway import GatewayAction
from sojourn.schemas.health import LivenessState
from sojourn.schemas.names import validate_token
from sojourn.schemas.views import QUERY_LIMIT_MAX, RunView
from sojourn.schemas.vocabulary import WaitingOn

from ..client.client import Client
from ..client.listing import list_runs
from ..gateway._auth import Caller
from ..gateway._http import (
    HttpProblem,
    json_response,
    problem_response,
    read_body,
    require_json,
)
from ..gateway._sessions import COOKIE, Session, Sessions, same_origin
from .timeline import timeline_of

__all__ = ["APPROVAL_PREFIX", "ConsoleHost", "console_routes"]

log = logging.getLogger("sojourn.gateway")

APPROVAL_PREFIX: Final = "approval."
"""The signal name prefix of ``ctx.approval``: a run waiting on ``approval.<name>``."""

_SIGN_IN_MAX: Final = 4096
_INBOX_PAGES: Final = 10
"""Listing pages of waiting runs the approvals inbox reads (1,000 runs each)."""
_DEAD_LETTERS_SHOWN: Final = 200
_TROUBLED: Final[tuple[LivenessState, ...]] = ("stalled", "orphaned", "overdue", "wedged")

_ASSETS: Final = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "vendor/htm-preact-standalone.js": "text/javascript; charset=utf-8",
}

PAGE_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
"""Every console page and asset: scripts and styles only from the gateway, no inline code,
never framed, no referrer."""


class ConsoleHost(Protocol):
    """What the console needs of the gateway it is served by."""

    client: Client
    sessions: Sessions

    def authorize(self, request: Request, action: GatewayAction) -> Caller: ...

    def allowed(self, caller: Caller) -> list[GatewayAction]: ...


class _SignIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    token: str


class SessionAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /ui/session`` and ``GET /ui/session``: who is signed in, what they may do, the
    CSRF token to send as ``X-CSRF-Token``, and when the session ends (unix seconds)."""

    name: str | None
    role: str
    actions: list[GatewayAction]
    csrf: str
    expires_at: int


class Approval(msgspec.Struct, frozen=True, kw_only=True):
    """A run of the approvals inbox: the approval it waits on, since when, its deadline."""

    run_id: str
    agent: str
    approval: str
    waiting_since: float | None
    deadline: float | None
    liveness: LivenessState | None = None


def _load_assets() -> dict[str, tuple[bytes, str]]:
    root = resources.files(__package__).joinpath("static")
    found = {name: (root.joinpath(name).read_bytes(), media) for name, media in _ASSETS.items()}
    found["index.html"] = (root.joinpath("index.html").read_bytes(), "text/html; charset=utf-8")
    return found


Handler = Callable[[Request], Awaitable[Response]]


def _answers(handler: Handler) -> Handler:
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except HttpProblem as p:
            return problem_response(p)
        except BrokerUnavailable as e:
            return problem_response(HttpProblem("unavailable", str(e)))
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return problem_response(HttpProblem("internal", "the gateway failed; see its log"))

    return wrapped


class _Console:
    def __init__(self, host: ConsoleHost) -> None:
        self.host = host
        self.assets = _load_assets()

    # --- pages ----------------------------------------------------------------------------

    async def root(self, request: Request) -> Response:
        return RedirectResponse("/ui/", status_code=307)

    async def page(self, request: Request) -> Response:
        body, media = self.assets["index.html"]
        return Response(body, media_type=media, headers=PAGE_HEADERS)

    async def asset(self, request: Request) -> Response:
        found = self.assets.get(str(request.path_params["path"]))
        if found is None:
            return problem_response(HttpProblem("not_found", "no such console asset"))
        body, media = found
        return Response(body, media_type=media, headers=PAGE_HEADERS)

    # --- sessions -------------------------------------------------------------------------

    def _answer(self, session: Session) -> SessionAnswer:
        caller = session.caller
        return SessionAnswer(
            name=caller.name,
            role=caller.role,
            actions=self.host.allowed(caller),
            csrf=session.csrf,
            expires_at=session.expires,
        )

    async def sign_in(self, request: Request) -> Response:
        """A bearer token in a JSON body (``{"token": "..."}``), never in a URL. JSON only: a
        cross-site form cannot send it without a CORS preflight, which the gateway refuses."""
        media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            raise HttpProblem("unsupported_media_type", "sign in with a JSON body")
        origin = request.headers.get("origin")
        if origin is not None and not same_origin(request, origin):
            raise HttpProblem("invalid_csrf", "a sign-in from another site")
        value = require_json(request, await read_body(request, _SIGN_IN_MAX))  # guarded
        try:
            if value is None:
                raise msgspec.ValidationError("no body")
            sign_in: _SignIn = from_raw(value, _SignIn)
        except (msgspec.ValidationError, msgspec.DecodeError):
            raise HttpProblem("invalid_json", 'the body is {"token": "..."}') from None
        token = sign_in.token
        issued = self.host.sessions.sign_in(token, time.time())
        if issued is None:
            raise HttpProblem("unauthorized", "not one of this gateway's tokens")
        cookie, session = issued
        response = json_response(self._answer(session), headers={"Cache-Control": "no-store"})
        response.headers["Set-Cookie"] = self.host.sessions.set_cookie(
            cookie, int(self.host.sessions.ttl)
        )
        return response

    async def who(self, request: Request) -> Response:
        session = self.host.sessions.session_of(request.cookies.get(COOKIE), time.time())
        if session is None:
            raise HttpProblem("unauthorized", "not signed in")
        return json_response(self._answer(session), headers={"Cache-Control": "no-store"})

    async def sign_out(self, request: Request) -> Response:
        self.host.authorize(request, "read")  # the cookie and its CSRF token
        response = Response(status_code=204)
        response.headers["Set-Cookie"] = self.host.sessions.clear_cookie()
        return response

    # --- read models ----------------------------------------------------------------------

    async def timeline(self, request: Request) -> Response:
        self.host.authorize(request, "read")
        run_id = str(request.path_params["run_id"])
        try:
            validate_token(run_id, "run_id")
        except InvalidName as e:
            raise HttpProblem("invalid_run_id", e.message) from None
        client = self.host.client
        decisions = await client.history(run_id)
        if not decisions:
            raise HttpProblem("unknown_run", f"no run with id '{run_id}'", run_id=run_id)
        liveness = None
        try:
            view = await client.view(run_id)
            liveness = None if view is None else view.liveness
        except SojournError:
            pass  # no read side: the timeline stands without it
        return json_response(timeline_of(run_id, decisions, time.time(), liveness))

    async def _views(self, **query: Any) -> list[RunView]:
        client = self.host.client
        out: list[RunView] = []
        after = None
        for _ in range(_INBOX_PAGES):
            page = await list_runs(
                client.broker, client.names, after=after, limit=QUERY_LIMIT_MAX, **query
            )
            out.extend(page.runs)
            after = page.next
            if after is None:
                break
        return out

    async def approvals(self, request: Request) -> Response:
        """Every run waiting on an approval (``ctx.approval``), oldest first."""
        self.host.authorize(request, "read")
        try:
            views = await self._views(status=["waiting"])
        except SojournError as e:
            raise HttpProblem("unavailable", e.message) from None
        inbox = []
        for v in views:
            for text in v.waiting_on:
                w = WaitingOn.parse(text)
                name = w.target
                if w.kind == "signal" and name.startswith(APPROVAL_PREFIX):
                    inbox.append(
                        Approval(
                            run_id=v.run_id,
                            agent=v.agent,
                            approval=name[len(APPROVAL_PREFIX) :],
                            waiting_since=v.waiting_since,
                            deadline=v.deadline,
                            liveness=v.liveness,
                        )
                    )
                    break
        inbox.sort(key=lambda a: (a.waiting_since or 0.0, a.run_id))
        return json_response({"approvals": inbox})

    async def schedules(self, request: Request) -> Response:
        self.host.authorize(request, "read")
        records = await self.host.client.schedules()
        return json_response({"schedules": records})

    async def workers(self, request: Request) -> Response:
        """The workers' last heartbeats, and the runs the watchdog judges in trouble."""
        self.host.authorize(request, "read")
        client = self.host.client
        names = client.names
        beats = []
        for m in await read_all(client.broker, names.health_stream, names.workers_all):
            try:
                beats.append(decode_worker_beat(m.data))
            except msgspec.MsgspecError:
                continue  # a stranger's bytes: not a worker
        try:
            troubled = await self._views(liveness=list(_TROUBLED))
        except SojournError:
            troubled = []
        now = time.time()
        return json_response({"now": now, "workers": beats, "troubled": troubled[:1000]})

    async def dead_letters(self, request: Request) -> Response:
        """The latest dead letters: what was refused and why (never the bodies)."""
        self.host.authorize(request, "read")
        client = self.host.client
        names = client.names
        info = await client.broker.api(f"$JS.API.STREAM.INFO.{names.dlq_stream}")
        state = info.get("state", {}) if isinstance(info, dict) else {}
        last = int(state.get("last_seq", 0))
        first = max(int(state.get("first_seq", 1)), last - _DEAD_LETTERS_SHOWN + 1, 1)
        letters = []
        if last:
            got, _ = await client.broker.direct_get_batch(
                names.dlq_stream, names.dlq_all, first, _DEAD_LETTERS_SHOWN
            )
            for m in reversed(got):
                try:
                    d = decode_dead_letter(m.data)
                except msgspec.MsgspecError:
                    continue
                letters.append(
                    {
                        "seq": m.seq,
                        "kind": d.kind,
                        "code": d.code,
                        "message": d.message[:1024],
                        "subject": d.subject[:256],
                        "size": d.size or len(d.data),
                        "rejected_at": d.rejected_at,
                    }
                )
        return json_response({"dead_letters": letters})


def console_routes(host: ConsoleHost) -> list[BaseRoute]:
    """The ``/ui`` routes of a gateway."""
    c = _Console(host)
    return [
        Route("/ui", c.root, methods=["GET"]),
        Route("/ui/", c.page, methods=["GET"]),
        Route("/ui/static/{path:path}", c.asset, methods=["GET"]),
        Route("/ui/session", _answers(c.sign_in), methods=["POST"]),
        Route("/ui/session", _answers(c.who), methods=["GET"]),
        Route("/ui/session/end", _answers(c.sign_out), methods=["POST"]),
        Route("/ui/api/runs/{run_id}/timeline", _answers(c.timeline), methods=["GET"]),
        Route("/ui/api/approvals", _answers(c.approvals), methods=["GET"]),
        Route("/ui/api/schedules", _answers(c.schedules), methods=["GET"]),
        Route("/ui/api/workers", _answers(c.workers), methods=["GET"]),
        Route("/ui/api/dead-letters", _answers(c.dead_letters), methods=["GET"]),
    ]
