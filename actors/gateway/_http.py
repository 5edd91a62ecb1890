"""The HTTP side of the gateway that has nothing to do with runs: problem documents, bounded
request bodies, and what a body means as a JSON value.

Every byte of a request is hostile: a body is read up to the configured limit and no further
(a ``Content-Length`` above it is refused before reading), its type is checked before it is
decoded, and every failure is a ``HttpProblem`` with a code from the one vocabulary
(``sojourn.schemas.gateway``).
"""

from __future__ import annotations

import math
import re
import urllib.parse
from typing import Any, Final

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from sojourn.schemas.codec import encode
from sojourn.schemas.gateway import HTTP_STATUS, PROBLEM_TYPE, Problem, problem_title
from sojourn.schemas.guard import BodyRefused, check_json

__all__ = [
    "HttpProblem",
    "json_response",
    "payload_of",
    "problem_response",
    "read_body",
    "require_json",
    "unix_seconds",
]

_LENGTH: Final = re.compile(r"[0-9]{1,15}")
_FORM_FIELDS_MAX: Final = 1000


class HttpProblem(Exception):
    """An error answered as a problem document; ``code`` decides the HTTP status."""

    def __init__(
        self,
        code: str,
        detail: str,
        *,
        run_id: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.run_id = run_id
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)

    def problem(self) -> Problem:
        return Problem(
            type=PROBLEM_TYPE + self.code,
            title=problem_title(self.code),
            status=self.status,
            detail=self.detail,
            code=self.code,
            run_id=self.run_id,
        )


def problem_response(p: HttpProblem) -> Response:
    return Response(
        encode(p.problem()),
        status_code=p.status,
        media_type="application/problem+json",
        headers=p.headers,
    )


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        encode(body), status_code=status, media_type="application/json", headers=headers
    )


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, at most ``limit`` bytes.

    Raises:
        HttpProblem: ``payload_too_large`` (declared or sent), ``invalid_header`` (a
            ``Content-Length`` that is not a number).
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not _LENGTH.fullmatch(declared):
            raise HttpProblem("invalid_header", "Content-Length is not a number")
        if int(declared) > limit:
            raise HttpProblem(
                "payload_too_large", f"the body is {declared} bytes; the limit is {limit}"
            )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HttpProblem("payload_too_large", f"the body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


def _is_json(media: str) -> bool:
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def require_json(request: Request, body: bytes) -> msgspec.Raw | None:
    """The body as a JSON value (``None`` for an empty body), for the API's own endpoints:
    a body must be JSON (``Content-Type`` absent or JSON).

    Raises:
        HttpProblem: ``unsupported_media_type`` or ``invalid_json``.
    """
    media = _media_type(request)
    if media and not _is_json(media):
        raise HttpProblem(
            "unsupported_media_type", f"the body must be application/json, not {media[:64]!r}"
        )
    if not body.strip():
        return None
    return _json(body)


def _json(body: bytes) -> msgspec.Raw:
    try:
        check_json(body, what="the body")
    except BodyRefused as e:  # invalid_json, invalid_encoding, too_deep, duplicate_key ...
        raise HttpProblem(e.code, e.message) from None
    return msgspec.Raw(body)


def payload_of(request: Request, body: bytes) -> Any:
    """A callback's or webhook's body as the signal's payload. External systems post JSON,
    forms or text: JSON is the value itself, a form an object of its fields (a field given
    more than once: a list of its values), text ``{"content_type": ..., "text": ...}``.

    Raises:
        HttpProblem: ``invalid_json``, or ``unsupported_media_type`` for anything else
            (binary bodies, text that is not UTF-8).
    """
    media = _media_type(request)
    if not body.strip():
        return None
    if not media or _is_json(media):
        return _json(body)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HttpProblem("unsupported_media_type", "the body is not UTF-8 text") from None
    if media == "application/x-www-form-urlencoded":
        try:
            pairs = urllib.parse.parse_qsl(
                text, keep_blank_values=True, strict_parsing=True, max_num_fields=_FORM_FIELDS_MAX
            )
        except ValueError as e:
            raise HttpProblem("invalid_json", f"the form body is malformed: {e}") from None
        fields: dict[str, Any] = {}
        for key, value in pairs:
            if key in fields:
                prior = fields[key]
                fields[key] = [*prior, value] if isinstance(prior, list) else [prior, value]
            else:
                fields[key] = value
        return fields
    if media.startswith("text/") or media in ("application/xml", "application/x-ndjson"):
        return {"content_type": media, "text": text}
    raise HttpProblem(
        "unsupported_media_type",
        f"a callback body is JSON, a form or text, not {media[:64]!r}",
    )


def unix_seconds(text: str | None, param: str) -> float | None:
    """A query parameter of unix seconds (``1764892800``, ``1764892800.5``); ``None`` if absent.

    Raises:
        HttpProblem: ``invalid_query``.
    """
    if text is None:
        return None
    try:
        value = float(text) if len(text) <= 24 else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise HttpProblem("invalid_query", f"{param}: unix seconds")
    return value
