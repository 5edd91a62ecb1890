"""The gate every JSON body from the wire passes before anything decodes it. Pure: no I/O.

Bytes on a subject are a stranger's. Before a decoder (msgspec's, which recurses) touches a
body, ``check_json`` answers, in one pass each and in bounded time for any input:

- ``invalid_encoding``: the bytes are not UTF-8, or a ``\\u`` escape names half a surrogate
  pair (text no encoder can write back);
- ``too_deep``: arrays and objects nest deeper than the limit (``MAX_DEPTH`` levels in a user
  value: an input, a payload, an output). Depth is measured without recursion, so a body of a
  million ``[`` costs one scan, never a ``RecursionError``;
- ``invalid_json``: not one JSON value (truncated, trailing bytes, ``NaN``, ``Infinity``);
- ``duplicate_key``: an object names a key twice (decoders disagree on which one wins: the
  one value every reader sees must be the one that was validated);
- ``out_of_range``: an integer outside 64 bits (``-2**63`` .. ``2**64 - 1``), or a number too
  large for a double (it would read back as infinity).

``BodyRefused`` is a ``msgspec.DecodeError``: code that already treats a decode error as the
message's fault (refuse, dead-letter, ack) treats a refused body the same way, with its
``code`` to say why. The codec's decoders of stored records check depth against
``RECORD_DEPTH`` so that no decoder of ours can raise ``RecursionError``.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any, Final, Literal, get_args

import msgspec

__all__ = [
    "BODY_REFUSALS",
    "MAX_DEPTH",
    "RECORD_DEPTH",
    "BodyRefusal",
    "BodyRefused",
    "check_depth",
    "check_json",
    "depth_of",
]

MAX_DEPTH: Final = 64
"""How deep arrays and objects may nest in a value from the wire (a run's input, a signal's
payload, a child's output): ``[[1]]`` is 2 levels. A body's own envelope (``{"input": ...}``)
is not counted against its value."""

RECORD_DEPTH: Final = 512
"""The depth beyond which the codec refuses any record (an event message, a beat, a view):
far above what the runtime writes, far below where a recursive decoder would fail."""

INT_MIN: Final = -(2**63)
INT_MAX: Final = 2**64 - 1

BodyRefusal = Literal[
    "invalid_encoding", "too_deep", "invalid_json", "duplicate_key", "out_of_range"
]
"""Why ``check_json`` refused a body (each is also an intake ``RejectCode``)."""
BODY_REFUSALS: tuple[BodyRefusal, ...] = get_args(BodyRefusal)


class BodyRefused(msgspec.DecodeError):
    """A body that must not be decoded; ``code`` says why, ``message`` says where."""

    def __init__(self, code: BodyRefusal, message: str) -> None:
        super().__init__(message)
        self.code: BodyRefusal = code
        self.message = message


_KEEP = b'[]{}"'
_DROP = bytes(b for b in range(256) if b not in _KEEP)
_DROP_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_SQUARE = bytes.maketrans(b"{}", b"[]")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * 19
"""19 digits in a row: an integer that may not fit in 64 bits (or a double with that many)."""
_BIG_EXPONENTS = (b"e000", b"E000", b"e+000", b"E+000")
"""An exponent of three digits or more: a number that may overflow a double."""


def _brackets(data: bytes) -> bytes:
    """The brackets of the JSON text ``data`` outside its strings, in order, in a few passes
    of C code: escaped backslashes and quotes dropped, then everything but brackets and
    quotes, then what stands between quotes."""
    if b'"' not in data:
        return data.translate(None, _DROP_BRACKETS)
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(unescaped.translate(None, _DROP).split(b'"')[::2])


def _deepest(brackets: bytes) -> int:
    return max(0, max(accumulate(map(_STEP.__getitem__, brackets)), default=0))


def depth_of(data: bytes) -> int:
    """How deep arrays and objects nest in the JSON text ``data`` (brackets inside strings do
    not count), without recursion. For text that is not JSON, an upper bound of sorts: only
    ``check_json``'s answer says whether it is JSON."""
    if data.count(b"[") + data.count(b"{") == 0:
        return 0
    return _deepest(_brackets(data))


def _deeper_than(data: bytes, limit: int) -> int | None:
    """``data``'s depth if it is more than ``limit``, else ``None``. Each pass removes the
    innermost level (``[]`` and ``{}``), so a wide body ``d`` levels deep costs ``d`` passes of
    C code over its brackets, at most ``limit + 1``. A body whose pass removes less than an
    eighth of its brackets (narrow and deep, or brackets that do not pair up), and one past
    the limit, are measured bracket by bracket instead (also for the message)."""
    brackets = _brackets(data).translate(_SQUARE)  # depth is the same whatever the kind
    for _ in range(limit + 1):
        if not brackets:
            return None
        inner = brackets.replace(b"[]", b"")  # one level: the result is not scanned again
        if len(inner) * 8 > len(brackets) * 7:
            break  # narrow and deep (or brackets that do not pair up): measure it instead
        brackets = inner
    depth = _deepest(_brackets(data))
    return depth if depth > limit else None


def check_depth(data: bytes | memoryview, limit: int = RECORD_DEPTH, *, what: str = "body") -> None:
    """Refuse (``too_deep``) a body whose arrays and objects nest deeper than ``limit``.

    Costs two ``bytes.count`` for a body with no more than ``limit`` brackets in all.
    """
    raw = bytes(data)
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return
    depth = _deeper_than(raw, limit)
    if depth is not None:
        raise BodyRefused(
            "too_deep", f"{what} nests {depth} levels deep; the limit is {limit} levels"
        )


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                shown = key if len(key) <= 64 else key[:64] + "..."
                raise BodyRefused("duplicate_key", f"an object names the key {shown!r} twice")
            seen.add(key)
    return obj


def _no_constant(name: str) -> Any:
    raise BodyRefused("invalid_json", f"{name} is not JSON (numbers must be finite)")


def _int_in_range(text: str) -> int:
    value = int(text)
    if not INT_MIN <= value <= INT_MAX:
        raise BodyRefused("out_of_range", f"integer {text[:24]}... does not fit in 64 bits")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise BodyRefused("out_of_range", f"number {text[:24]} is too large for a double")
    return value


# One decoder per set of number hooks, made once (``json.loads`` with hooks builds a decoder and
# its scanner on every call).
_DECODE = json.JSONDecoder(object_pairs_hook=_pairs, parse_constant=_no_constant).decode
_DECODE_FLOATS = json.JSONDecoder(
    object_pairs_hook=_pairs, parse_constant=_no_constant, parse_float=_finite_float
).decode
_DECODE_NUMBERS = json.JSONDecoder(
    object_pairs_hook=_pairs,
    parse_constant=_no_constant,
    parse_float=_finite_float,
    parse_int=_int_in_range,
).decode


def _check_encoding(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BodyRefused(
            "invalid_encoding", f"{what} is not UTF-8 (byte {e.start}: {raw[e.start]:#04x})"
        ) from None


def _check_surrogates(value: Any, what: str) -> None:
    """Escaped surrogate pairs are text; a lone half is not (no encoder writes it as UTF-8)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BodyRefused(
            "invalid_encoding", f"{what} escapes half a surrogate pair (\\ud800-\\udfff)"
        ) from None


def check_json(
    data: bytes | memoryview, *, max_depth: int = MAX_DEPTH, envelope: int = 0, what: str = "body"
) -> None:
    """Refuse ``data`` unless it is one well-formed JSON value that every decoder reads the
    same way: UTF-8, nested at most ``max_depth`` levels below its ``envelope`` (the levels of
    the message's own wrapping, e.g. 1 for ``{"input": ...}``), no duplicate keys, every
    number in range. Total: any bytes give ``None`` or ``BodyRefused``.

    Raises:
        BodyRefused: with its ``code`` (``BODY_REFUSALS``).
    """
    raw = bytes(data)
    text = _check_encoding(raw, what)
    limit = max_depth + envelope
    if raw.count(b"[") + raw.count(b"{") > limit:
        depth = _deeper_than(raw, limit)
        if depth is not None:
            raise BodyRefused(
                "too_deep",
                f"{what} nests {depth - envelope} levels deep; the limit is {max_depth} levels",
            )
    digits = raw.translate(_DIGITS)
    if _LONG_RUN in digits:
        decode = _DECODE_NUMBERS
    elif any(e in digits for e in _BIG_EXPONENTS):
        decode = _DECODE_FLOATS
    else:
        decode = _DECODE
    try:
        value = decode(text)
    except BodyRefused:
        raise
    except ValueError as e:  # JSONDecodeError, or an integer of more than 4,300 digits
        raise BodyRefused("invalid_json", f"{what} is not valid JSON: {e}") from None
    except RecursionError:  # unreachable below the depth limit; total all the same
        raise BodyRefused("too_deep", f"{what} nests too deep to read") from None
    if _SURROGATE_ESCAPE.search(raw) is not None:
        _check_surrogates(value, what)
