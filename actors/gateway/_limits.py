"""The shared rate limits over HTTP (decision 0046):

- ``GET /v1/limits``: every limit's record (``read``);
- ``GET /v1/limits/{name}``: one (``404 unknown_limit``);
- ``POST /v1/limits/{name}`` with ``{"requests": "500/min", "tokens": "200k/min", "burst": 1}``:
  set its rates (``operate``: the admin role);
- ``POST /v1/limits/{name}/block`` with ``{"seconds": 30}`` and ``POST .../unblock``
  (``operate``).

Each answers with the limit's record once a worker wrote it (``503 unavailable`` when no worker
answers: the request stays queued).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sojourn.schemas.codec import from_raw
from sojourn.schemas.errors import BrokerUnavailable, InvalidName
from sojourn.schemas.gateway import GatewayAction
from sojourn.schemas.limits import LIMIT_BLOCK_MAX, Limit, validate_limit_name

from ..client.base import TriggerRejected
from ..client.client import Client
from ._auth import Caller
from ._http import HttpProblem, json_response, problem_response, read_body, require_json

__all__ = ["LimitsHost", "limits_routes"]

log = logging.getLogger("sojourn.gateway")


class LimitsHost(Protocol):
    """What the routes need of the gateway."""

    client: Client
    max_body: int

    def _authorize(self, request: Request, action: GatewayAction) -> Caller: ...


class _Block(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    seconds: float


Handler = Callable[[Request], Awaitable[Response]]


def _guarded(handler: Handler) -> Handler:
    """``handler`` answering its failures as problems."""

    async def guarded(request: Request) -> Response:
        try:
            return await handler(request)
        except HttpProblem as p:
            return problem_response(p)
        except TriggerRejected as e:
            return problem_response(HttpProblem(e.code, e.message))
        except (BrokerUnavailable, TimeoutError) as e:
            return problem_response(HttpProblem("unavailable", str(e)))
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return problem_response(HttpProblem("internal", "the gateway failed; see its log"))

    return guarded


def _name(request: Request) -> str:
    name = str(request.path_params["name"])
    try:
        return validate_limit_name(name)
    except InvalidName as e:
        raise HttpProblem("invalid_limit", e.message) from None


def limits_routes(host: LimitsHost) -> list[Route]:
    """The routes, bound to ``host``."""

    async def listed(request: Request) -> Response:
        host._authorize(request, "read")
        return json_response(await host.client.limits())

    async def one(request: Request) -> Response:
        host._authorize(request, "read")
        name = _name(request)
        record = await host.client.limit(name)
        if record is None:
            raise HttpProblem("unknown_limit", f"no limit {name!r} is declared")
        return json_response(record)

    async def set_rates(request: Request) -> Response:
        caller = host._authorize(request, "operate")
        name = _name(request)
        value = require_json(request, await read_body(request, host.max_body))
        if value is None:
            raise HttpProblem("invalid_limit", 'the body names the rates: {"requests": "500/min"}')
        try:
            limit: Limit = from_raw(value, Limit)
        except msgspec.ValidationError as e:
            raise HttpProblem("invalid_limit", f"body: {e}") from None
        return json_response(await host.client.set_limit(name, limit, by=caller.name))

    async def verb(request: Request) -> Response:
        caller = host._authorize(request, "operate")
        name = _name(request)
        action = str(request.path_params["verb"])
        if action == "unblock":
            return json_response(await host.client.unblock_limit(name, by=caller.name))
        if action != "block":
            raise HttpProblem("not_found", "a limit is blocked or unblocked")
        value = require_json(request, await read_body(request, host.max_body))
        try:
            body: _Block = from_raw(value or msgspec.Raw(b"null"), _Block)
        except msgspec.ValidationError as e:
            raise HttpProblem("invalid_limit", f'body: {{"seconds": N}}: {e}') from None
        if not 0 < body.seconds <= LIMIT_BLOCK_MAX:
            raise HttpProblem(
                "invalid_limit", f"a block lasts more than 0 and at most {LIMIT_BLOCK_MAX:g} s"
            )
        return json_response(await host.client.block_limit(name, body.seconds, by=caller.name))

    return [
        Route("/v1/limits", _guarded(listed), methods=["GET"]),
        Route("/v1/limits/{name}", _guarded(one), methods=["GET"]),
        Route("/v1/limits/{name}", _guarded(set_rates), methods=["POST"]),
        Route("/v1/limits/{name}/{verb}", _guarded(verb), methods=["POST"]),
    ]
