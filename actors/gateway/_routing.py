"""Where a routed webhook goes: a field of its body names the run (pure).

A routed webhook route (``--webhook NAME=SCHEME:SECRET;start=AGENT;id=PATH`` or
``...;signal=NAME;id=PATH``, docs/gateway.md "Routed webhooks") reads the run id from one field
of the verified JSON body: ``PATH`` is a JSON pointer (RFC 6901, ``/data/object/id``) or a
dotted path (``data.object.id``); a segment of digits indexes an array. The field must hold a
string or an integer, and with the route's prefix it must be a run id sojourn accepts.

Bodies are hostile: the path is bounded and parsed once, when the route is configured; the
walk is total (any value, any depth: a missing key, a wrong type, an index out of range are
all "missing"), and every refusal is a ``RouteRefused`` with a problem code.
"""

from __future__ import annotations

import re
from typing import Any, Final

from sojourn.schemas.errors import InvalidName
from sojourn.schemas.names import reserved_run_id, validate_token

__all__ = [
    "FIELD_PATH_MAX",
    "FIELD_SEGMENTS_MAX",
    "RouteRefused",
    "extract_field",
    "parse_field_path",
    "routed_run_id",
]

FIELD_PATH_MAX: Final = 256
"""The longest path text a route may name."""

FIELD_SEGMENTS_MAX: Final = 16
"""At most this many segments (a provider's id sits a few levels deep)."""

_PREFIX = re.compile(r"[A-Za-z0-9_-]{0,64}")
_INDEX = re.compile(r"0|[1-9][0-9]{0,8}")


class RouteRefused(Exception):
    """A verified webhook that cannot be routed: ``code`` (``missing_field``,
    ``invalid_run_id``) is the problem the gateway answers with."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def parse_field_path(text: str) -> tuple[str, ...]:
    """The segments of a JSON pointer (``/a/b``, with ``~1`` for ``/`` and ``~0`` for ``~``)
    or of a dotted path (``a.b``).

    Raises:
        ValueError: empty, longer than ``FIELD_PATH_MAX``, more than ``FIELD_SEGMENTS_MAX``
            segments, an empty segment, or a pointer with a bad ``~`` escape.
    """
    if not isinstance(text, str) or not text or len(text) > FIELD_PATH_MAX:
        raise ValueError(f"a field path is 1 to {FIELD_PATH_MAX} characters")
    if text.startswith("/"):
        raw = text[1:].split("/")
        if any(re.search(r"~(?![01])", s) for s in raw):
            raise ValueError(f"field path {text!r}: '~' is escaped as ~0, '/' as ~1")
        segments = [s.replace("~1", "/").replace("~0", "~") for s in raw]
    else:
        segments = text.split(".")
    if len(segments) > FIELD_SEGMENTS_MAX:
        raise ValueError(f"field path {text!r}: at most {FIELD_SEGMENTS_MAX} segments")
    if any(not s for s in segments):
        raise ValueError(f"field path {text!r} has an empty segment")
    return tuple(segments)


_MISSING: Final = object()


def extract_field(value: Any, path: tuple[str, ...]) -> Any:
    """The value at ``path`` in a decoded JSON ``value``, or ``None`` when there is none (a
    missing key, a segment into a scalar, an index out of range). JSON ``null`` is ``None``
    too: a run cannot be named by it."""
    here: Any = value
    for segment in path:
        if isinstance(here, dict):
            here = here.get(segment, _MISSING)
        elif isinstance(here, list) and _INDEX.fullmatch(segment):
            index = int(segment)
            here = here[index] if index < len(here) else _MISSING
        else:
            return None
        if here is _MISSING:
            return None
    return here


def routed_run_id(body: Any, path: tuple[str, ...], prefix: str, shown: str) -> str:
    """The run id a body names: the prefix and the text of the string or integer at ``path``.

    ``shown``: the path as configured, for messages.

    Raises:
        RouteRefused: ``missing_field`` (no such field, or it is not a string or an integer),
            ``invalid_run_id`` (prefix and value are not a valid, unreserved run id).
    """
    if _PREFIX.fullmatch(prefix) is None:
        raise ValueError("a run id prefix is at most 64 characters of A-Z a-z 0-9 _ -")
    found = extract_field(body, path)
    if isinstance(found, bool) or not isinstance(found, str | int):
        what = "no such field" if found is None else f"a {type(found).__name__}"
        raise RouteRefused(
            "missing_field",
            f"the body's field {shown!r} names the run: a string or an integer ({what})",
        )
    text = str(found) if isinstance(found, int) else found
    run_id = prefix + text
    try:
        validate_token(run_id, "run id")
    except InvalidName:
        raise RouteRefused(
            "invalid_run_id",
            f"the body's field {shown!r} does not make a run id: 1-128 characters of "
            "A-Z a-z 0-9 _ - (with the route's prefix)",
        ) from None
    why = reserved_run_id(run_id)
    if why is not None:
        raise RouteRefused("invalid_run_id", f"the body's field {shown!r}: the run id {why}")
    return run_id
