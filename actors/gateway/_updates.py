"""``POST /v1/runs/{id}/updates/{name}``: an update over HTTP, answered with the run's answer
(``client.update``; decision 0042).

The body is the handler's payload (JSON; empty: ``null``); ``Idempotency-Key`` is the update
id (a retry with the same key is applied once and answered the same); ``?timeout=`` the
seconds to wait for the answer (default 30, at most 300). Taken with the ``signal`` action,
and sent as the caller's name, so the history records who asked. The run's answer is ``200``
with an ``UpdateAnswer``; a refusal a problem document: ``update_rejected`` (409, nothing
changed), ``update_failed`` (409, the handler raised), ``unknown_update`` (404), ``run_ended``
(409), ``unknown_run`` (404), ``update_timeout`` (504: ask again with the same key), or the
intake's reject code.
"""

from __future__ import annotations

import logging
from typing import Final, Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sojourn.schemas.codec import from_raw
from sojourn.schemas.errors import BrokerUnavailable, InvalidName, PayloadTooLarge
from sojourn.schemas.gateway import GatewayAction
from sojourn.schemas.names import validate_signal_name, validate_token
from sojourn.schemas.updates import UpdateRejectCode, UpdateRejectedError, valid_update_id

from ..client.client import Client
from ._auth import Caller
from ._http import HttpProblem, json_response, problem_response, read_body, require_json

__all__ = ["UpdatesHost", "updates_route"]

log = logging.getLogger("sojourn.gateway")

TIMEOUT_DEFAULT: Final = 30.0
TIMEOUT_MAX: Final = 300.0

_PROBLEM: Final[dict[UpdateRejectCode, str]] = {
    "rejected": "update_rejected",
    "failed": "update_failed",
    "unknown_update": "unknown_update",
    "run_ended": "run_ended",
    "unknown_run": "unknown_run",
    "timeout": "update_timeout",
}
"""The problem code of each refusal (``refused`` answers with the intake's own code)."""


class UpdatesHost(Protocol):
    """What the route needs of the gateway."""

    client: Client
    max_body: int

    def _authorize(self, request: Request, action: GatewayAction) -> Caller: ...


def _timeout(request: Request) -> float:
    raw = request.query_params.get("timeout")
    if raw is None:
        return TIMEOUT_DEFAULT
    try:
        value = float(raw[:32])
    except ValueError:
        value = -1.0
    if not 0 < value <= TIMEOUT_MAX:
        raise HttpProblem(
            "invalid_trigger", f"timeout is seconds, more than 0, at most {TIMEOUT_MAX:g}"
        )
    return value


def updates_route(host: UpdatesHost) -> Route:
    """The route, bound to ``host``."""

    async def update(request: Request) -> Response:
        try:
            caller = host._authorize(request, "signal")
            run_id = str(request.path_params["run_id"])
            name = str(request.path_params["name"])
            try:
                validate_token(run_id, "run_id")
            except InvalidName as e:
                raise HttpProblem("invalid_run_id", e.message) from None
            try:
                validate_signal_name(name)
            except InvalidName as e:
                raise HttpProblem("invalid_trigger", e.message, run_id=run_id) from None
            update_id = request.headers.get("idempotency-key")
            if update_id is not None and not valid_update_id(update_id):
                raise HttpProblem(
                    "invalid_header",
                    "Idempotency-Key (the update id) is 1 to 128 of A-Z a-z 0-9 . _ : -",
                    run_id=run_id,
                )
            timeout = _timeout(request)
            value = require_json(request, await read_body(request, host.max_body))
            payload = from_raw(value) if value is not None else None
            try:
                got = await host.client.update_answer(
                    run_id,
                    name,
                    payload,
                    update_id=update_id,
                    timeout=timeout,
                    sender=caller.name,
                )
            except UpdateRejectedError as e:
                code = (
                    e.intake_code
                    if e.code == "refused" and e.intake_code
                    else _PROBLEM.get(e.code, "internal")
                )
                raise HttpProblem(code, e.reason, run_id=e.run_id or run_id) from None
            except PayloadTooLarge as e:
                raise HttpProblem("payload_too_large", e.message, run_id=run_id) from None
            if not got.ok:
                assert got.code is not None
                code = _PROBLEM.get(got.code, "internal")
                raise HttpProblem(code, got.message or got.code, run_id=got.run_id)
            return json_response(got)
        except HttpProblem as p:
            return problem_response(p)
        except BrokerUnavailable as e:
            return problem_response(HttpProblem("unavailable", str(e)))
        except Exception:
            log.exception("POST %s failed", request.url.path)
            return problem_response(HttpProblem("internal", "the gateway failed; see its log"))

    return Route("/v1/runs/{run_id}/updates/{name}", update, methods=["POST"])
