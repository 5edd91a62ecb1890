"""Large values by reference: stored once, in pieces shared between versions.

A value larger than ``Settings.value_inline_max`` (a step's result, a journaled value, a run's
output, the input ``ctx.continue_as_new`` passes on) is not written into the event that
carries it: its JSON is cut into pieces, each stored under its SHA-256 in the values stream
if it is not there yet (``sojourn.broker.values``), and the event holds a ``ValueRef``
instead (``StepCompleted.result_ref`` ...; the inline field is ``null``).

Where the cuts fall is what makes a growing value cheap. The JSON is written out canonically
(msgspec), and between the elements of a large array or the members of a large object (and of
any large array or object inside one, recursively) there is a place a cut may go. A cut is
made there when the piece so far holds at least ``PIECE_MIN`` bytes and the element just
passed hashes to a multiple of ``CUT_EVERY`` (or the piece reached ``PIECE_SOFT_MAX``). A
cut depends only on what came before it, so a conversation state that gains a message at
its end keeps every piece but the last; an edit in the middle changes the pieces around it,
and the cuts fall in the same places again after it. A value of many pieces keeps its
reference small: the list of its pieces' digests is itself stored the same way (``depth``
1), and only its last piece changes as the value grows.

Reading back trusts nothing: the reference's shape and bounds are checked before any piece
is read, each piece is checked against its digest (``PieceStore``), and the value against the
reference's size and SHA-256. A failure is ``ValueUnreadable``, a ``HistoryError``: the
worker wedges the run with the reason instead of executing it on a value it cannot trust.

Retention: pieces are shared by every value and run that holds them, so deleting a run
deletes none; the values stream keeps them forever (``max_age`` 0), as the events stream
keeps histories. An archived history still refers to them. Reclaiming pieces no live or
archived history refers to would need a mark-and-sweep over every history; it is not built.
"""

from __future__ import annotations

import hashlib
import weakref
import zlib
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar, cast

import msgspec

from sojourn.broker.connection import Broker
from sojourn.broker.names import Names
from sojourn.broker.values import DIGEST, PIECE_MAX, PieceStore, digest_of
from sojourn.schemas.codec import decode_json, encode, from_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import ValueUnreadable
from sojourn.schemas.events import (
    RunCompleted,
    RunEvent,
    RunStarted,
    StepCompleted,
    ValueRecorded,
    ValueRef,
)

__all__ = [
    "CUT_EVERY",
    "PIECE_MIN",
    "PIECE_SOFT_MAX",
    "Values",
    "has_refs",
    "join",
    "split",
    "values_for",
]

PIECE_MIN = 2 * 1024
"""A cut is made only after a piece holds this many bytes."""
PIECE_SOFT_MAX = 64 * 1024
"""A piece is cut at the next element boundary past this many bytes, whatever the hashes."""
PIECE_HARD_MAX = 128 * 1024
"""A piece is cut here even inside an element (a long string): never larger."""
CUT_EVERY = 4
"""A boundary is a cut when the element before it hashes to a multiple of this (past
``PIECE_MIN``): pieces of about ``PIECE_MIN`` + this many elements."""
INLINE_PARTS = 16
"""A reference lists at most this many leaf pieces itself; beyond, it lists the pieces of its
digest list (``depth`` 1)."""
REF_PARTS_MAX = 4096
"""Digests one reference, or one digest list, may name: a bound on what a reference read
back can ask for."""

assert PIECE_HARD_MAX <= PIECE_MAX


# --- cutting and joining (pure) -------------------------------------------------------------


class _Out:
    """The canonical JSON being written, and the places a cut may go (offset, hash)."""

    __slots__ = ("boundaries", "chunks", "size")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.boundaries: list[tuple[int, int]] = []

    def put(self, b: bytes) -> None:
        self.chunks.append(b)
        self.size += len(b)

    def boundary(self, element: bytes) -> None:
        self.boundaries.append((self.size, zlib.crc32(element)))


def _write(value: Any, encoded: bytes, out: _Out) -> None:
    """Write ``value`` (whose canonical JSON is ``encoded``), opening every array and object
    larger than a piece's minimum so that cuts may go between their elements (a value's
    digest list too: it grows at its end like the value)."""
    if len(encoded) <= PIECE_MIN or not isinstance(value, (list, dict)):
        out.put(encoded)
        return
    if isinstance(value, list):
        out.put(b"[")
        for i, item in enumerate(value):
            if i:
                out.put(b",")
            item_b = encode(item)
            _write(item, item_b, out)
            out.boundary(item_b)
        out.put(b"]")
        return
    out.put(b"{")
    for i, (key, item) in enumerate(value.items()):
        if i:
            out.put(b",")
        key_b = encode(key)
        out.put(key_b + b":")
        item_b = encode(item)
        _write(item, item_b, out)
        out.boundary(key_b + item_b)
    out.put(b"}")


def _cuts(boundaries: Sequence[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """The byte ranges of the pieces, from the candidate boundaries."""
    ranges: list[tuple[int, int]] = []
    start = 0
    for offset, h in boundaries:
        length = offset - start
        if length >= PIECE_MIN and (h % CUT_EVERY == 0 or length >= PIECE_SOFT_MAX):
            ranges.append((start, offset))
            start = offset
    if start < size or not ranges:
        ranges.append((start, size))
    out: list[tuple[int, int]] = []
    for a, b in ranges:  # inside one long element: fixed cuts
        while b - a > PIECE_HARD_MAX:
            out.append((a, a + PIECE_HARD_MAX))
            a += PIECE_HARD_MAX
        out.append((a, b))
    return out


def split(raw: bytes) -> tuple[bytes, list[bytes]]:
    """The canonical JSON of the value ``raw`` and its pieces (which concatenate to it).

    Raises:
        msgspec.DecodeError: ``raw`` is not JSON.
    """
    value = decode_json(raw)
    encoded = encode(value)
    out = _Out()
    _write(value, encoded, out)
    data = b"".join(out.chunks)
    return data, [data[a:b] for a, b in _cuts(out.boundaries, len(data))]


def _digest_list(parts: Sequence[str]) -> bytes:
    return encode(list(parts))


def join(pieces: Iterable[bytes]) -> bytes:
    return b"".join(pieces)


def has_refs(events: Iterable[RunEvent]) -> bool:
    """Whether any of ``events`` holds a value by reference."""
    return any(_ref_of(e) is not None for e in events)


def _ref_of(e: RunEvent) -> ValueRef | None:
    if isinstance(e, StepCompleted):
        return e.result_ref
    if isinstance(e, ValueRecorded):
        return e.value_ref
    if isinstance(e, RunCompleted):
        return e.output_ref
    if isinstance(e, RunStarted):
        return e.input_ref
    return None


def _inline_of(e: RunEvent) -> msgspec.Raw | None:
    if isinstance(e, StepCompleted):
        return e.result
    if isinstance(e, ValueRecorded):
        return e.value
    if isinstance(e, RunCompleted):
        return e.output
    if isinstance(e, RunStarted):
        return e.input
    return None


_NULL = msgspec.Raw(b"null")
E = TypeVar("E", StepCompleted, ValueRecorded, RunCompleted, RunStarted)


def _with(e: RunEvent, raw: msgspec.Raw, ref: ValueRef | None) -> RunEvent:
    r = msgspec.structs.replace
    if isinstance(e, StepCompleted):
        return r(e, result=raw, result_ref=ref)
    if isinstance(e, ValueRecorded):
        return r(e, value=raw, value_ref=ref)
    if isinstance(e, RunCompleted):
        return r(e, output=raw, output_ref=ref)
    assert isinstance(e, RunStarted)
    return r(e, input=raw, input_ref=ref)


# --- storing and loading --------------------------------------------------------------------


class Values:
    """Stores large values by reference and reads references back (one per worker, through
    ``values_for``, so that its piece cache is shared by the worker's activations).

    Args:
        pieces: the piece store.
        inline_max: values of at most this many bytes stay inline.
        max_value: the largest value a reference read back may hold.
    """

    def __init__(self, pieces: PieceStore, *, inline_max: int, max_value: int) -> None:
        self.pieces = pieces
        self.inline_max = inline_max
        self.max_value = max_value

    async def store(self, raw: bytes) -> ValueRef | None:
        """Store ``raw`` by reference if it is larger than ``inline_max``; ``None``: inline.

        Every piece is stored before the reference is returned, so an event holding it never
        names a piece that is not there.
        """
        if len(raw) <= self.inline_max:
            return None
        data, pieces = split(raw)
        named = [(digest_of(p), p) for p in pieces]
        await self.pieces.put_many(named)
        parts = [d for d, _ in named]
        depth = 0
        if len(parts) > INLINE_PARTS:
            _, index = split(_digest_list(parts))
            named_index = [(digest_of(p), p) for p in index]
            await self.pieces.put_many(named_index)
            parts, depth = [d for d, _ in named_index], 1
        return ValueRef(
            sha256=hashlib.sha256(data).hexdigest(), size=len(data), parts=tuple(parts), depth=depth
        )

    async def load(self, ref: ValueRef) -> msgspec.Raw:
        """The value ``ref`` names, checked piece by piece and as a whole.

        Raises:
            ValueUnreadable: the reference is malformed or out of bounds, or what it names
                is missing or does not match it.
        """
        if not (isinstance(ref.sha256, str) and DIGEST.fullmatch(ref.sha256)):
            raise ValueUnreadable("a value reference's sha256 is malformed")
        if not 0 <= ref.size <= self.max_value:
            raise ValueUnreadable(
                f"a value reference names {ref.size} bytes (at most {self.max_value} are read)"
            )
        if ref.depth not in (0, 1) or not 0 < len(ref.parts) <= REF_PARTS_MAX:
            raise ValueUnreadable(
                f"a value reference of depth {ref.depth} with {len(ref.parts)} parts is out of "
                "bounds"
            )
        parts: Sequence[str] = ref.parts
        if ref.depth == 1:
            listing = join(await self.pieces.get_many(parts))
            if len(listing) > REF_PARTS_MAX * 67 + 2:
                raise ValueUnreadable("a value reference's digest list is too long")
            try:
                parts = from_raw(listing, list[str])
            except msgspec.MsgspecError as e:
                raise ValueUnreadable(f"a value reference's digest list is unreadable: {e}") from e
            if not 0 < len(parts) <= REF_PARTS_MAX:
                raise ValueUnreadable(f"a value's digest list names {len(parts)} pieces")
            if len(parts) * 1 > ref.size:
                raise ValueUnreadable("a value's digest list names more pieces than bytes")
        # Fetch in rounds so that a reference claiming more than its size stops early.
        chunks: list[bytes] = []
        total = 0
        for start in range(0, len(parts), 64):
            for piece in await self.pieces.get_many(parts[start : start + 64]):
                total += len(piece)
                if total > ref.size:
                    raise ValueUnreadable(
                        f"a value's pieces hold more than the {ref.size} bytes its reference says"
                    )
                chunks.append(piece)
        data = join(chunks)
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
            raise ValueUnreadable(
                f"a value's pieces hold {len(data)} bytes that do not match its reference "
                f"({ref.size} bytes, sha256 {ref.sha256[:16]}...)"
            )
        return msgspec.Raw(data)

    async def externalize(self, events: Sequence[RunEvent]) -> list[RunEvent]:
        """``events`` with every large value stored by reference (the rest unchanged)."""
        out: list[RunEvent] = []
        for e in events:
            raw = _inline_of(e)
            if raw is not None and _ref_of(e) is None and len(raw) > self.inline_max:
                ref = await self.store(bytes(raw))
                if ref is not None:
                    e = _with(e, _NULL, ref)
            out.append(e)
        return out

    async def resolve(self, events: Iterable[RunEvent]) -> list[RunEvent]:
        """``events`` with every reference replaced by the value it names.

        Raises:
            ValueUnreadable: a reference cannot be read back as written.
        """
        out: list[RunEvent] = []
        for e in events:
            ref = _ref_of(e)
            if ref is not None:
                e = _with(e, await self.load(ref), None)
            out.append(e)
        return out

    async def resolve_one(self, e: E) -> E:
        """``e`` with its reference, if any, replaced by the value it names."""
        return cast(E, (await self.resolve([e]))[0])


_per_broker: weakref.WeakKeyDictionary[Broker, dict[str, Values]] = weakref.WeakKeyDictionary()


def values_for(broker: Broker, names: Names, settings: Settings) -> Values:
    """The ``Values`` of a connection and deployment: one piece cache per worker (per
    connection), shared by its activations and kept as long as the connection."""
    by_prefix = _per_broker.setdefault(broker, {})
    v = by_prefix.get(names.prefix)
    if v is None or v.inline_max != settings.value_inline_max:
        v = Values(
            PieceStore(broker, names),
            inline_max=settings.value_inline_max,
            max_value=settings.max_value,
        )
        by_prefix[names.prefix] = v
    return v
