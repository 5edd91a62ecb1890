"""Search attributes: typed metadata on a run that listings filter by (pure).

A run's attributes are a small flat map, given at its start (``StartTrigger.attributes``,
recorded in ``RunStarted.attributes``) and upserted by its code (``ctx.set_attributes``,
journaled as a ``value.recorded.v1`` of kind ``attributes``). The read side indexes them, and
``sojourn runs --attr k=v``, ``Client.runs(attributes=...)`` and ``GET /v1/runs?attr.k=v``
filter by them (docs/guide.md "Search attributes", decision 0038).

Values are ``str``, ``int`` (64-bit), finite ``float`` or ``bool``; a ``datetime`` is
accepted where attributes are given and stored as its RFC 3339 text in UTC
(``2026-12-05T10:00:00Z``), so such values sort as they compare. In an upsert, ``None``
removes a key. Every check here is total: anything else raises ``InvalidAttributes``.

A filter compares a value's **text** (``attribute_text``): a string as it is, an integer in
decimal, a float as Python's ``repr``, a boolean ``true``/``false``. So ``--attr vip=true``
finds a run whose ``vip`` is ``True`` (or the string ``"true"``), and ``customer=42`` one
whose ``customer`` is ``42`` or ``"42"``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final, TypeAlias

import msgspec

from .codec import decode_json
from .errors import SojournError

__all__ = [
    "ATTRIBUTES_MAX",
    "ATTRIBUTE_KEY_PATTERN",
    "ATTRIBUTE_TEXT_MAX",
    "ATTRIBUTE_VALUE_MAX",
    "AttributeValue",
    "Attributes",
    "InvalidAttributes",
    "attribute_text",
    "decode_upsert",
    "merge_attributes",
    "parse_attribute_args",
    "parse_attribute_filter",
    "validate_attributes",
    "validate_filter",
]

AttributeValue: TypeAlias = str | int | float | bool
"""What one attribute holds (a ``datetime`` is stored as RFC 3339 text)."""

Attributes: TypeAlias = dict[str, AttributeValue]
"""A run's attributes, key to value."""

ATTRIBUTES_MAX: Final = 32
"""At most this many keys on a run (given at start and upserted together)."""

ATTRIBUTE_VALUE_MAX: Final = 256
"""The longest string value, in UTF-8 bytes."""

ATTRIBUTE_TEXT_MAX: Final = 320
"""The longest value text a filter may name (a string's 256 bytes, or a number's text)."""

ATTRIBUTE_KEY_PATTERN: Final = r"[a-z][a-z0-9_]{0,63}"
"""A key: 1-64 characters of a-z, 0-9 and ``_``, starting with a letter (``customer_id``)."""

_KEY = re.compile(ATTRIBUTE_KEY_PATTERN)
_INT_MIN: Final = -(1 << 63)
_INT_MAX: Final = (1 << 63) - 1


class InvalidAttributes(SojournError, ValueError):
    """Attributes (or an attribute filter) that sojourn refuses: too many keys, a malformed
    key, a value of another type, too long, out of range. The intake answers it with
    ``invalid_attributes``; nothing of it is stored."""


def _key(key: object) -> str:
    if not isinstance(key, str) or _KEY.fullmatch(key) is None:
        shown = repr(key)[:80]
        raise InvalidAttributes(
            f"invalid attribute key {shown}: 1-64 characters of a-z, 0-9 and '_', "
            "starting with a letter"
        )
    return key


def _value(key: str, value: object) -> AttributeValue:
    """``value`` as stored, or raise ``InvalidAttributes``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise InvalidAttributes(f"attribute {key!r}: an integer outside 64 bits")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidAttributes(f"attribute {key!r}: a float that is not finite")
        return float(value)
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidAttributes(f"attribute {key!r}: a datetime needs a time zone")
        value = value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, str):
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidAttributes(f"attribute {key!r}: a string that is not UTF-8") from None
        if size > ATTRIBUTE_VALUE_MAX:
            raise InvalidAttributes(
                f"attribute {key!r}: {size} bytes; a value is at most {ATTRIBUTE_VALUE_MAX}"
            )
        return value
    raise InvalidAttributes(
        f"attribute {key!r}: a {type(value).__name__}; a value is a str, int, float, bool "
        "or an aware datetime"
    )


def validate_attributes(
    attributes: object, *, removals: bool = False
) -> dict[str, AttributeValue | None]:
    """The attributes as stored (a new dict), or raise ``InvalidAttributes``.

    ``removals``: ``None`` values are allowed (an upsert's removals); at a start they are not.

    Raises:
        InvalidAttributes: not a mapping, more than ``ATTRIBUTES_MAX`` keys, a malformed key,
            a value of another type, a string longer than ``ATTRIBUTE_VALUE_MAX`` bytes, an
            integer outside 64 bits, a float that is not finite, a naive datetime.
    """
    if not isinstance(attributes, Mapping):
        raise InvalidAttributes("attributes are an object of keys to values")
    if len(attributes) > ATTRIBUTES_MAX:
        raise InvalidAttributes(f"{len(attributes)} attributes; a run has at most {ATTRIBUTES_MAX}")
    out: dict[str, AttributeValue | None] = {}
    for key, value in attributes.items():
        k = _key(key)
        if value is None:
            if not removals:
                raise InvalidAttributes(f"attribute {k!r}: null (only an upsert removes a key)")
            out[k] = None
        else:
            out[k] = _value(k, value)
    return out


def merge_attributes(
    current: Mapping[str, AttributeValue], update: Mapping[str, Any]
) -> Attributes:
    """``current`` with ``update`` applied: its values set, its ``None`` keys removed. Total:
    the fold calls it on what history holds, so a malformed entry (of a history written by
    hand) is skipped, and keys past ``ATTRIBUTES_MAX`` are not added."""
    merged = dict(current)
    for key, value in update.items():
        if not isinstance(key, str) or _KEY.fullmatch(key) is None:
            continue
        if value is None:
            merged.pop(key, None)
            continue
        try:
            stored = _value(key, value)
        except InvalidAttributes:
            continue
        if key in merged or len(merged) < ATTRIBUTES_MAX:
            merged[key] = stored
    return merged


def attribute_text(value: AttributeValue) -> str:
    """The text a filter compares ``value`` by (see the module docstring)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return value


def validate_filter(attributes: object) -> dict[str, str]:
    """A listing's attribute filter as key to value text, or raise ``InvalidAttributes``.

    ``attributes`` maps keys to values (``Client.runs``) or to their text (the CLI's and
    HTTP's ``k=v``); every pair must match (AND)."""
    if not isinstance(attributes, Mapping):
        raise InvalidAttributes("an attribute filter is an object of keys to values")
    if len(attributes) > ATTRIBUTES_MAX:
        raise InvalidAttributes(f"at most {ATTRIBUTES_MAX} attribute filters")
    out: dict[str, str] = {}
    for key, value in attributes.items():
        k = _key(key)
        if value is None:
            raise InvalidAttributes(f"attribute filter {k!r}: null matches nothing")
        text = attribute_text(_value(k, value))
        if len(text) > ATTRIBUTE_TEXT_MAX:
            raise InvalidAttributes(f"attribute filter {k!r}: longer than {ATTRIBUTE_TEXT_MAX}")
        out[k] = text
    return out


def parse_attribute_filter(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``["customer=42", "tier=gold"]`` (the CLI's repeated ``--attr``) as a filter.

    Raises:
        InvalidAttributes: an item without ``=``, a key given twice, or ``validate_filter``'s.
    """
    pairs: dict[str, str] = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals:
            raise InvalidAttributes(f"an attribute is KEY=VALUE, got {item[:80]!r}")
        if key in pairs:
            raise InvalidAttributes(f"attribute {key[:64]!r} is given twice")
        pairs[key] = value
    return validate_filter(pairs)


def parse_attribute_args(items: list[str] | tuple[str, ...]) -> dict[str, AttributeValue]:
    """Attributes from the CLI's repeated ``--attr`` of ``sojourn start``: ``KEY=TEXT`` is a
    string, ``KEY:=JSON`` a typed value (``tier:=3``, ``vip:=true``, ``score:=0.5``).

    Raises:
        InvalidAttributes: an item of neither form, a key given twice, JSON that is not a
            scalar, or ``validate_attributes``'s.
    """
    pairs: dict[str, object] = {}
    for item in items:
        key, equals, text = item.partition("=")
        value: object = text
        if not equals:
            raise InvalidAttributes(f"an attribute is KEY=TEXT or KEY:=JSON, got {item[:80]!r}")
        if key.endswith(":"):
            key = key[:-1]
            try:
                value = decode_json(text.encode())
            except msgspec.DecodeError:
                raise InvalidAttributes(f"attribute {key[:64]!r}: KEY:=JSON needs JSON") from None
        if key in pairs:
            raise InvalidAttributes(f"attribute {key[:64]!r} is given twice")
        pairs[key] = value
    checked = validate_attributes(pairs)
    return {k: v for k, v in checked.items() if v is not None}


def decode_upsert(raw: bytes | msgspec.Raw) -> dict[str, Any]:
    """A recorded ``attributes`` value (an upsert) as a dict, ``{}`` if it is not an object:
    the folds are total."""
    try:
        value = decode_json(bytes(raw))
    except msgspec.DecodeError:
        return {}
    return value if isinstance(value, dict) else {}
