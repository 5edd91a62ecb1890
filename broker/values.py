"""Value pieces: content-addressed blobs in the stream ``<PREFIX>_VALUES``, through the
``Broker`` façade.

A piece is one message on ``<prefix>.val.<sha256 hex>``, written create-only
(``Nats-Expected-Last-Subject-Sequence: 0``), so the broker itself keeps each piece exactly
once however many writers, values and runs hold it: a second write of the same piece is
refused as a conflict, which means "already stored". (NATS's object store would cost two
messages per piece, under a random chunk id, and could not refuse a second copy.)

Everything read back is hostile: a digest is checked by full match before it names a
subject, a piece is refused unread beyond ``PIECE_MAX`` and refused if its bytes do not hash
to its name. Verified pieces are kept in a bounded cache (``cache_bytes``), and digests known
to be stored in a bounded set, so a value that grows a little from step to step costs the
writes of its new pieces only.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections import OrderedDict
from collections.abc import Awaitable, Iterable, Sequence

from sojourn.schemas.errors import ValueUnreadable

from . import headers as h
from .connection import Broker, JetStreamError
from .eventstore import WRONG_LAST_SEQUENCE
from .names import Names

__all__ = ["DIGEST", "PIECE_MAX", "PieceStore", "digest_of"]

PIECE_MAX = 256 * 1024
"""The largest piece written or read back, in bytes."""

DIGEST = re.compile(r"[0-9a-f]{64}")
"""A piece's name: the SHA-256 of its bytes, lower-case hex."""

KNOWN_MAX = 200_000
"""Digests remembered as stored (about 100 bytes each), least recently used first out."""

CONCURRENCY = 32
"""Piece reads or writes in flight at once for one value."""


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class PieceStore:
    """The pieces of one deployment, with a bounded cache of verified ones.

    Args:
        broker: the connection.
        names: the deployment's names.
        cache_bytes: bytes of piece content kept in memory (0: none).
    """

    def __init__(self, broker: Broker, names: Names, *, cache_bytes: int = 64 * 1024 * 1024):
        self.broker = broker
        self.names = names
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cached = 0
        self._known: OrderedDict[str, None] = OrderedDict()
        self.reads = 0
        """Pieces read from the broker (cache misses)."""
        self.writes = 0
        """Pieces written (new to this store)."""

    # --- the caches -----------------------------------------------------------------------

    def _remember(self, digest: str, data: bytes | None) -> None:
        known = self._known
        known[digest] = None
        known.move_to_end(digest)
        while len(known) > KNOWN_MAX:
            known.popitem(last=False)
        if data is None or len(data) > self.cache_bytes:
            return
        if digest in self._cache:
            self._cache.move_to_end(digest)
            return
        self._cache[digest] = data
        self._cached += len(data)
        while self._cached > self.cache_bytes:
            _, old = self._cache.popitem(last=False)
            self._cached -= len(old)

    @property
    def cached_bytes(self) -> int:
        return self._cached

    # --- writing --------------------------------------------------------------------------

    async def put_many(self, pieces: Iterable[tuple[str, bytes]]) -> None:
        """Store every ``(digest, data)`` not known to be stored yet (each at most once).

        Raises:
            ValueError: a piece is larger than ``PIECE_MAX`` or not named by its digest.
            JetStreamError / BrokerUnavailable: the broker refused or did not answer.
        """
        todo: dict[str, bytes] = {}
        for digest, data in pieces:
            if digest in self._known or digest in todo:
                continue
            if len(data) > PIECE_MAX or digest_of(data) != digest:
                raise ValueError(f"piece {digest[:16]}... is not a valid piece")
            todo[digest] = data
        await _bounded(self._put(d, b) for d, b in todo.items())

    async def _put(self, digest: str, data: bytes) -> None:
        ack = await self.broker.try_publish(
            self.names.value(digest),
            data,
            {h.EXPECTED_LAST_SUBJECT_SEQUENCE: "0", h.MSG_ID: f"val:{digest}"},
        )
        if isinstance(ack, JetStreamError):
            if ack.err_code != WRONG_LAST_SEQUENCE:
                raise ack
            # Already stored (by us before, by another worker, for another value).
        else:
            self.writes += not ack.duplicate
        self._remember(digest, data)

    # --- reading --------------------------------------------------------------------------

    async def get_many(self, digests: Sequence[str]) -> list[bytes]:
        """The pieces named by ``digests``, in order, each checked against its name.

        Raises:
            ValueUnreadable: a digest is malformed, or a piece is missing, larger than
                ``PIECE_MAX`` or does not hash to its name.
            BrokerUnavailable / JetStreamError: the broker did not answer.
        """
        for d in digests:
            if not isinstance(d, str) or not DIGEST.fullmatch(d):
                raise ValueUnreadable(f"malformed piece digest {str(d)[:80]!r}")
        found: dict[str, bytes] = {}
        missing = []
        for d in dict.fromkeys(digests):
            data = self._cache.get(d)
            if data is None:
                missing.append(d)
            else:
                self._cache.move_to_end(d)
                found[d] = data

        async def read(d: str) -> None:
            found[d] = await self._get(d)

        await _bounded(read(d) for d in missing)
        return [found[d] for d in digests]

    async def _get(self, digest: str) -> bytes:
        m = await self.broker.direct_get_last(self.names.values_stream, self.names.value(digest))
        self.reads += 1
        if m is None:
            raise ValueUnreadable(
                f"value piece {digest} is missing from {self.names.values_stream}"
            )
        data = bytes(m.data)
        if len(data) > PIECE_MAX:
            raise ValueUnreadable(
                f"value piece {digest} is {len(data)} bytes (at most {PIECE_MAX})"
            )
        if digest_of(data) != digest:
            raise ValueUnreadable(f"value piece {digest} does not match its digest")
        self._remember(digest, data)
        return data


async def _bounded(jobs: Iterable[Awaitable[None]]) -> None:
    """Await ``jobs``, at most ``CONCURRENCY`` at a time; the first error is raised."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(job: Awaitable[None]) -> None:
        async with gate:
            await job

    await asyncio.gather(*(one(j) for j in jobs))
