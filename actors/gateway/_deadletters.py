"""Dead-letter records of the callback and webhook requests the gateway refused.

Those routes are the only ones open without a bearer token: whatever reaches them is kept, as
the intake keeps what it refuses (``<prefix>.dlq.http``, a ``DeadLetter`` of kind ``http``),
so an operator sees the provider whose signatures stopped matching, or the tokens that expired
before their system called back. The records are rate-limited per gateway process: anyone on
the internet can post garbage, and a flood must not push real records out of the stream.
The token in a path is cut to its first characters: a record must not hand out a credential.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Final

from starlette.requests import Request

from sojourn.schemas.codec import encode
from sojourn.schemas.wire import DeadLetter

from ..client.client import Client
from ..ops import metrics as _metrics

__all__ = ["DeadLetters"]

log = logging.getLogger("sojourn.gateway")

BODY_KEPT: Final = 64 * 1024
"""The head of a refused body that is kept (its size and SHA-256 are kept whole)."""

_HEADERS_KEPT: Final = 32
_NEVER_KEPT: Final = frozenset({"authorization", "cookie", "proxy-authorization"})
_TOKEN_SHOWN: Final = 12


class DeadLetters:
    """Keeps refused requests, at most ``rate`` per second (bursts up to ``burst``)."""

    def __init__(self, client: Client, *, rate: float = 20.0, burst: float = 100.0) -> None:
        self._client = client
        self._rate = rate
        self._burst = burst
        self._allowance = burst
        self._at = time.monotonic()

    def _admit(self) -> bool:
        now = time.monotonic()
        self._allowance = min(self._burst, self._allowance + (now - self._at) * self._rate)
        self._at = now
        if self._allowance < 1.0:
            return False
        self._allowance -= 1.0
        return True

    async def keep(self, request: Request, body: bytes, code: str, message: str) -> None:
        """Record the refusal (best effort: a gateway that cannot write the record still
        answers the caller, and logs it)."""
        if not self._admit():
            _metrics.GATEWAY_DEAD_LETTERS_DROPPED.inc()
            return
        headers = {
            k[:256]: v[:256]
            for k, v in list(request.headers.items())[:_HEADERS_KEPT]
            if k.lower() not in _NEVER_KEPT
        }
        record = DeadLetter(
            code=code,
            message=message[:1024],
            subject=f"{request.method} {_redacted(request.url.path)}"[:1024],
            data=body[:BODY_KEPT],
            headers=headers,
            rejected_at=time.time(),
            kind="http",
            size=len(body),
            sha256=hashlib.sha256(body).hexdigest(),
            truncated=len(body) > BODY_KEPT,
        )
        names = self._client.names
        try:
            await self._client.broker.publish(names.dlq("http"), encode(record))
        except Exception as e:  # the caller is answered regardless; the loss is logged
            log.warning("cannot keep a dead-letter record of a refused %s: %s", code, e)
            return
        _metrics.DEAD_LETTERS.labels(code).inc()


def _redacted(path: str) -> str:
    """``/v1/callbacks/<token>`` with the token cut to its first characters."""
    parts = path[:2048].split("/")
    if len(parts) >= 4 and parts[1] == "v1" and parts[2] in ("callbacks", "webhooks"):
        i = 3 if parts[2] == "callbacks" else 4
        if i < len(parts) and len(parts[i]) > _TOKEN_SHOWN:
            parts[i] = parts[i][:_TOKEN_SHOWN] + "..."
    return "/".join(parts)
