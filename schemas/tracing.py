"""W3C Trace Context values as sojourn accepts them (pure).

A ``traceparent`` or ``tracestate`` comes from the wire (a NATS header on a start or a signal,
an HTTP header through the gateway, a caller's argument) and is hostile like every byte from
there: a value that is not well formed, or too long, is ignored, never an error. The accepted
value is what ``RunStarted.traceparent`` and ``SignalReceived.traceparent`` record
(docs/wire.md). Nothing here imports OpenTelemetry: the values are plain text until the
telemetry room (``sojourn.actors.telemetry``) reads them.
"""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple

__all__ = [
    "TRACEPARENT_MAX",
    "TRACESTATE_MAX",
    "TraceParent",
    "derived_id",
    "parse_traceparent",
    "trace_context",
    "valid_traceparent",
    "valid_tracestate",
]

TRACEPARENT_MAX = 128
"""Longest ``traceparent`` read (version 00 is 55 characters; a later version may add fields)."""
TRACESTATE_MAX = 512
"""Longest ``tracestate`` kept (the W3C's own advice: at least 512 characters propagated)."""
_TRACESTATE_MEMBERS = 32

_PARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[ -~]*)?")
_MEMBER = re.compile(
    r"[a-z0-9][_0-9a-z\-*/]{0,255}(@[a-z][_0-9a-z\-*/]{0,13})?=[!-+\--<>-~]{0,255}[!-+\--<>-~]?"
)


class TraceParent(NamedTuple):
    """A well-formed ``traceparent``, as numbers."""

    trace_id: int
    span_id: int
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 1)


def parse_traceparent(value: object) -> TraceParent | None:
    """``value`` as a ``TraceParent``, or ``None`` unless it is a well-formed W3C
    ``traceparent`` of at most ``TRACEPARENT_MAX`` characters (version ``ff``, an all-zero
    trace or parent id, and a version 00 value with more fields are refused)."""
    if not isinstance(value, str) or len(value) > TRACEPARENT_MAX:
        return None
    m = _PARENT.fullmatch(value)
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    t, s = int(trace_id, 16), int(span_id, 16)
    if not t or not s:
        return None
    return TraceParent(t, s, int(flags, 16))


def valid_traceparent(value: object) -> str | None:
    """``value`` if it is a well-formed ``traceparent`` (``parse_traceparent``), else ``None``."""
    if parse_traceparent(value) is None:
        return None
    assert isinstance(value, str)
    return value


def valid_tracestate(value: object) -> str | None:
    """``value`` if it is a well-formed ``tracestate`` (at most ``TRACESTATE_MAX`` characters
    and 32 members, each ``key=value`` by the W3C grammar), else ``None``."""
    if not isinstance(value, str) or not value or len(value) > TRACESTATE_MAX:
        return None
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]
    if not members or len(members) > _TRACESTATE_MEMBERS:
        return None
    if not all(_MEMBER.fullmatch(m) for m in members):
        return None
    return ",".join(members)


def derived_id(bits: int, *parts: object) -> int:
    """A non-zero id of ``bits`` (64 or 128) derived from ``parts``: the same on every worker
    and every activation, so that a span emitted from any of them has the same id."""
    text = "\x1f".join(str(p) for p in parts).encode()
    n = int.from_bytes(hashlib.blake2b(text, digest_size=bits // 8).digest(), "big")
    return n or 1


def trace_context(traceparent: object, tracestate: object) -> tuple[str | None, str | None]:
    """The trace context a message carries, as recorded: a well-formed ``traceparent`` and,
    only with one, a well-formed ``tracestate``; ``(None, None)`` otherwise."""
    parent = valid_traceparent(traceparent)
    if parent is None:
        return None, None
    return parent, valid_tracestate(tracestate)
