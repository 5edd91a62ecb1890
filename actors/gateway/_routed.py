"""Routed webhooks, and the gateway's search-attribute parameters.

``POST /v1/webhooks/{route}`` (no callback token) serves the routes configured with
``start=AGENT`` or ``signal=NAME`` (``_webhooks.py``): after the route's signature check the
JSON body either **starts** a run of the agent, its input the body and its run id the body
field ``id=PATH`` names (with ``prefix=``), so a provider's retries are one run; or is
**delivered** as the signal to the run that field names, under a signal id derived from the
route and the body (a retry is the same signal). Sent as the gateway's own user: the signature
is the credential, and it names no caller. What is refused before the signature matches
(unknown route, oversized body, bad signature) writes nothing but its dead-letter record.

Also the attribute parts of ``POST /v1/agents/{agent}/runs`` (the ``Sojourn-Attributes``
header: a JSON object) and ``GET /v1/runs`` (``attr.KEY=VALUE`` parameters).

A mixin of the gateway's handler class (``_app.py``), which wraps the handler in its error
mapping.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from sojourn.schemas.attributes import (
    InvalidAttributes,
    validate_attributes,
    validate_filter,
)
from sojourn.schemas.codec import decode_json
from sojourn.schemas.errors import PayloadTooLarge, UnknownAgent, WebhookRejected
from sojourn.schemas.gateway import SignalAnswer, StartAnswer

from ..client.base import TriggerRejected
from ..client.client import Client
from ._deadletters import DeadLetters
from ._http import HttpProblem, json_response, require_json
from ._routing import RouteRefused, parse_field_path, routed_run_id
from ._webhooks import WebhookRoute
from ._webhooks import verify as verify_webhook

__all__ = [
    "ATTRIBUTES_HEADER",
    "ATTRIBUTES_HEADER_MAX",
    "RoutedWebhooks",
    "query_attributes",
    "start_attributes",
]

ATTRIBUTES_HEADER: Final = "sojourn-attributes"
"""The start's search attributes: ``Sojourn-Attributes: {"customer": 42, "tier": "gold"}``."""

ATTRIBUTES_HEADER_MAX: Final = 8192
"""The longest ``Sojourn-Attributes`` header read (32 keys of 256-byte values fit)."""

_ATTR_PARAM: Final = "attr."


def start_attributes(headers: Mapping[str, str]) -> dict[str, Any] | None:
    """The ``Sojourn-Attributes`` header of a start as attributes, ``None`` without one.

    Raises:
        HttpProblem: ``invalid_attributes``: too long, not a JSON object, or refused by
            ``validate_attributes``.
    """
    text = headers.get(ATTRIBUTES_HEADER)
    if text is None:
        return None
    if len(text) > ATTRIBUTES_HEADER_MAX:
        raise HttpProblem(
            "invalid_attributes", f"Sojourn-Attributes is longer than {ATTRIBUTES_HEADER_MAX}"
        )
    try:
        value = decode_json(text.encode("utf-8", "surrogatepass"))
        checked = validate_attributes(value)
    except (msgspec.DecodeError, UnicodeError):
        raise HttpProblem(
            "invalid_attributes", 'Sojourn-Attributes is a JSON object: {"key": value, ...}'
        ) from None
    except InvalidAttributes as e:
        raise HttpProblem("invalid_attributes", e.message) from None
    return {k: v for k, v in checked.items() if v is not None}


def query_attributes(params: Any) -> dict[str, str]:
    """The ``attr.KEY=VALUE`` parameters of ``GET /v1/runs`` as a listing filter.

    Raises:
        HttpProblem: ``invalid_query``: a key given twice, or refused by ``validate_filter``.
    """
    pairs: dict[str, str] = {}
    for name, value in params.multi_items():
        if not name.startswith(_ATTR_PARAM):
            continue
        key = name[len(_ATTR_PARAM) :]
        if key in pairs:
            raise HttpProblem("invalid_query", f"attribute {key[:64]!r} is given twice")
        pairs[key] = value
    try:
        return validate_filter(pairs)
    except InvalidAttributes as e:
        raise HttpProblem("invalid_query", e.message) from None


def _signal_id(route: WebhookRoute, body: bytes) -> str:
    """A routed signal's id: the same body on the same route is the same signal."""
    return f"wh:{route.name}:{hashlib.sha256(body).hexdigest()[:48]}"


class _Config(Protocol):
    @property
    def webhooks(self) -> Mapping[str, WebhookRoute]: ...

    @property
    def start_wait(self) -> float: ...


class RoutedWebhooks:
    """The handler; ``_app._Gateway`` provides the rest."""

    if TYPE_CHECKING:
        client: Client
        dead_letters: DeadLetters

        config: _Config

        async def _bounded(self, request: Request) -> bytes: ...

        async def _signal(
            self, run_id: str, name: str, value: Any, signal_id: str | None, sender: str | None
        ) -> str: ...

    async def routed(self, request: Request) -> Response:
        """``POST /v1/webhooks/{route}``: start or signal the run the verified body names."""
        name = str(request.path_params["route"])
        route = self.config.webhooks.get(name)
        if route is None or not route.routed:
            await self.dead_letters.keep(request, b"", "unknown_webhook", "no such routed webhook")
            detail = f"no routed webhook route {name[:64]!r}"
            if route is not None:
                detail += f": this route takes a callback token, POST /v1/webhooks/{name}/TOKEN"
            raise HttpProblem("unknown_webhook", detail)
        body = await self._bounded(request)
        try:
            verify_webhook(route, request.headers, body, time.time())
        except WebhookRejected as e:
            await self.dead_letters.keep(request, body, e.code, e.message)
            raise HttpProblem(e.code, e.message) from None
        try:
            raw = require_json(request, body)
            value = None if raw is None else decode_json(bytes(raw))
            assert route.id_field is not None  # a routed route has one (WebhookRoute)
            path = parse_field_path(route.id_field)
            run_id = routed_run_id(value, path, route.id_prefix, route.id_field)
        except RouteRefused as e:
            await self.dead_letters.keep(request, body, e.code, e.message)
            raise HttpProblem(e.code, e.message) from None
        except HttpProblem as p:
            await self.dead_letters.keep(request, body, p.code, p.detail)
            raise
        if route.start is not None:
            return await self._start_routed(request, route.start, run_id, raw, body)
        assert route.signal is not None
        try:
            sid = await self._signal(run_id, route.signal, raw, _signal_id(route, body), None)
        except HttpProblem as p:
            if p.status != 503:
                await self.dead_letters.keep(request, body, p.code, p.detail)
            p.run_id = p.run_id or run_id
            raise
        return json_response(SignalAnswer(run_id=run_id, signal=route.signal, signal_id=sid), 202)

    async def _start_routed(
        self, request: Request, agent: str, run_id: str, raw: Any, body: bytes
    ) -> Response:
        try:
            receipt = await self.client.trigger(
                agent, raw, run_id=run_id, wait=True, timeout=self.config.start_wait
            )
        except (UnknownAgent, TriggerRejected, PayloadTooLarge) as e:
            code = (
                "unknown_agent"
                if isinstance(e, UnknownAgent)
                else "payload_too_large"
                if isinstance(e, PayloadTooLarge)
                else e.code
            )
            await self.dead_letters.keep(request, body, code, e.message)
            raise HttpProblem(code, e.message, run_id=run_id) from None
        status = 202 if receipt.queued else 201 if receipt.created else 200
        answer = StartAnswer(run_id=receipt.run_id, created=receipt.created, queued=receipt.queued)
        return json_response(answer, status, {"Location": f"/v1/runs/{receipt.run_id}"})
