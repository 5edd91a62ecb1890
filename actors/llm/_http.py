"""The HTTP facts a model client needs, kept pure (no I/O) so they can be tested alone.

Every byte from a provider is hostile: a ``Retry-After`` is parsed with ``fullmatch`` and
bounded, an error message is clipped and stripped of control characters before it reaches a
run's history, and the server-sent-events parser bounds each line and the whole stream.
"""

from __future__ import annotations

import email.utils
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

import msgspec

from sojourn.schemas.codec import decode_json

from ._types import (
    ModelError,
    ModelProtocolError,
    ModelRateLimited,
    ModelRequestRejected,
    ModelUnavailable,
)

__all__ = [
    "MESSAGE_MAX",
    "RETRY_AFTER_MAX",
    "SseParser",
    "clip",
    "error_for_status",
    "provider_message",
    "retry_after",
]

RETRY_AFTER_MAX: Final = 3600.0
"""The longest ``Retry-After`` honoured, in seconds: a provider cannot park a run for days."""

MESSAGE_MAX: Final = 500
"""Characters of a provider's error message kept (it goes into the run's history)."""

_SECONDS = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,6})?")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clip(text: str, limit: int = MESSAGE_MAX) -> str:
    """``text`` with control characters replaced and at most ``limit`` characters."""
    text = _CONTROL.sub("?", text.strip())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds the provider asks us to wait: ``retry-after-ms`` (OpenAI's), else
    ``Retry-After`` as delta-seconds or an HTTP-date; ``None`` when absent or unreadable.
    Bounded to 0..``RETRY_AFTER_MAX``."""
    ms = headers.get("retry-after-ms", "").strip()  # str.strip: \x1c-\x1f too; float() not
    if _SECONDS.fullmatch(ms):
        return _bounded(float(ms) / 1000)
    value = headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if _SECONDS.fullmatch(value):
        return _bounded(float(value))
    if len(value) > 64:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # an HTTP-date is GMT; a date without a zone is read so too
        return None
    return _bounded(when.timestamp() - now)


def _bounded(seconds: float) -> float | None:
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_MAX)


def provider_message(body: bytes) -> str:
    """The message of an error body: OpenAI's ``{"error": {"message": ...}}``, the common
    variants of it, or the body as text, clipped."""
    try:
        data: Any = decode_json(body[:65536])
    except msgspec.DecodeError:
        return clip(body[:4096].decode("utf-8", "replace")) or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            for key in ("message", "detail", "error"):
                if isinstance(err.get(key), str):
                    return clip(err[key])
        if isinstance(err, str):
            return clip(err)
        if isinstance(data.get("detail"), str):
            return clip(data["detail"])
    return clip(body[:4096].decode("utf-8", "replace"))


def error_for_status(
    status: int, headers: Mapping[str, str], body: bytes, now: float, what: str
) -> ModelError:
    """The sojourn error for a non-2xx answer: 429 (and 503 with ``Retry-After``) is
    ``ModelRateLimited``, 408/409/5xx ``ModelUnavailable``, any other status
    ``ModelRequestRejected`` (terminal)."""
    message = f"{what} answered {status}: {provider_message(body)}"
    wait = retry_after(headers, now)
    if status == 429 or (status == 503 and wait is not None):
        return ModelRateLimited(message, status=status, retry_after=wait)
    if status in (408, 409) or 500 <= status <= 599:
        return ModelUnavailable(message, status=status, retry_after=wait)
    return ModelRequestRejected(message, status=status)


class SseParser:
    """Server-sent events from bytes as they arrive: ``feed`` returns the ``data`` of every
    event completed by the bytes (multi-line data joined with ``\\n``); comments and other
    fields are skipped.

    Bounds: a line longer than ``max_line`` bytes, an event's data longer than ``max_line``,
    or more than ``max_total`` bytes in all raise ``ModelProtocolError``.
    """

    __slots__ = ("_buf", "_data", "_data_len", "_total", "max_line", "max_total")

    def __init__(self, *, max_line: int, max_total: int) -> None:
        self.max_line = max_line
        self.max_total = max_total
        self._buf = bytearray()
        self._data: list[bytes] = []
        self._data_len = 0
        self._total = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        self._total += len(chunk)
        if self._total > self.max_total:
            raise ModelProtocolError(f"the event stream passed {self.max_total} bytes")
        self._buf += chunk
        return list(self._events())

    def _events(self) -> Iterator[bytes]:
        buf = self._buf
        start = 0
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            line = bytes(buf[start:end])
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if len(line) > self.max_line:
                raise ModelProtocolError(f"an event-stream line passed {self.max_line} bytes")
            if not line:
                if self._data:
                    yield b"\n".join(self._data)
                self._data = []
                self._data_len = 0
                continue
            if line.startswith(b":"):
                continue
            field, _, value = line.partition(b":")
            if field != b"data":
                continue
            if value.startswith(b" "):
                value = value[1:]
            self._data_len += len(value) + 1
            if self._data_len > self.max_line:
                raise ModelProtocolError(f"an event's data passed {self.max_line} bytes")
            self._data.append(value)
        del buf[:start]
        if len(buf) > self.max_line:
            raise ModelProtocolError(f"an event-stream line passed {self.max_line} bytes")

    def close(self) -> list[bytes]:
        """The last event, if the stream ended without the blank line that completes it."""
        out = list(self._events())
        if self._buf:  # a last line without its end
            out.extend(self.feed(b"\n\n"))
        elif self._data:
            out.append(b"\n".join(self._data))
            self._data = []
        return out
