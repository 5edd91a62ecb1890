"""Objects in a JetStream object store, through the ``Broker`` façade: put, verified get,
exists, delete.

The layout is NATS's own object store (chunks on ``$O.<bucket>.C.<nuid>``, the object's
description on ``$O.<bucket>.M.<base64url(name)>``, the stream ``OBJ_<bucket>``), so
``nats object ls/get`` read it too. Chunks are plain publishes and reads are direct gets: reading
needs no consumer and cannot hang on a missing chunk (nats-py's ``ObjectStore.get`` waits on an
ordered consumer with no deadline). Used by retention's archive (``broker/archive.py``) and the
run model's snapshots (``projections/model.py``).

Everything read back is hostile: the description is bounded and checked field by field, and
the body's size is bounded (``max_bytes``, refused before any chunk is read) and must match the
description's size, chunk count and SHA-256 digest.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import msgspec

from sojourn.schemas.errors import ObjectUnreadable, SojournError

from .connection import Broker, JetStreamError

__all__ = ["CHUNK_SIZE", "ObjectStore", "ObjectUnreadable"]

CHUNK_SIZE = 128 * 1024
"""Bytes per object-store chunk (NATS's default)."""

_META_MAX = 64 * 1024
"""The largest object description accepted, in bytes (NATS writes a few hundred)."""

_ROLLUP = "Nats-Rollup"
"""JetStream's rollup header: ``sub`` keeps only this message on its subject."""

_NUID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_DIGEST_PREFIX = "SHA-256="
_DIRECT_PAGE = 64


class _ObjectMeta(msgspec.Struct, frozen=True, kw_only=True):
    """The part of NATS's object description (``ObjectInfo``) read back; the rest is ignored."""

    name: str
    bucket: str
    nuid: str
    size: int = 0
    chunks: int = 0
    digest: str = ""
    deleted: bool = False


class ObjectStore:
    """One object-store bucket: objects (bytes) by name.

    Args:
        broker: the connection.
        bucket: the bucket's name (its stream is ``OBJ_<bucket>``).
        max_bytes: the largest object ``get`` reads back.
        description: written into each object's description (what ``nats object info``
            shows).
    """

    def __init__(
        self, broker: Broker, bucket: str, *, max_bytes: int, description: str = ""
    ) -> None:
        self.broker = broker
        self.bucket = bucket
        self.stream = f"OBJ_{bucket}"
        self.max_bytes = max_bytes
        self.description = description

    def _error(self, name: str, problem: str) -> SojournError:
        """The error a damaged object raises (``ArchiveStore`` names the run instead)."""
        return ObjectUnreadable(f"object {name!r} in {self.bucket}: {problem}")

    def stream_config(self, replicas: int = 1) -> dict[str, Any]:
        """The object store's stream, as NATS clients create it (JetStream API JSON)."""
        return {
            "name": self.stream,
            "subjects": [f"$O.{self.bucket}.C.>", f"$O.{self.bucket}.M.>"],
            "retention": "limits",
            "storage": "file",
            "discard": "new",
            "max_age": 0,
            "max_bytes": -1,
            "allow_rollup_hdrs": True,
            "allow_direct": True,
            "num_replicas": replicas,
        }

    async def ensure(self, replicas: int = 1) -> None:
        """Create the bucket's stream if it is missing (an existing one is left as it is).

        Raises:
            PermissionDenied: it is missing and this user may not create it.
        """
        await self.broker.ensure_stream(self.stream_config(replicas))

    def _meta_subject(self, name: str) -> str:
        return f"$O.{self.bucket}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"

    def _chunk_subject(self, nuid: str) -> str:
        return f"$O.{self.bucket}.C.{nuid}"

    async def _meta(self, name: str) -> _ObjectMeta | None:
        m = await self.broker.direct_get_last(self.stream, self._meta_subject(name))
        if m is None:
            return None
        if len(m.data) > _META_MAX:
            raise self._error(name, "description too large")
        try:
            # NATS's object-store JSON (not a sojourn wire body): parsed, then checked by type.
            meta = msgspec.convert(json.loads(m.data), _ObjectMeta)
        except (ValueError, RecursionError, msgspec.ValidationError) as e:  # any bytes
            raise self._error(name, f"description unreadable: {e}") from e
        if meta.name != name or meta.bucket != self.bucket or not _NUID.fullmatch(meta.nuid):
            raise self._error(name, "description names another object")
        return meta

    async def exists(self, name: str) -> bool:
        """Whether an object ``name`` is stored (one direct get)."""
        meta = await self._meta(name)
        return meta is not None and not meta.deleted

    async def get(self, name: str) -> bytes | None:
        """The object ``name`` (``None``: none is stored).

        Raises:
            ObjectUnreadable (or the subclass's error): the object is larger than
                ``max_bytes``, or its chunks do not match its description (size, count,
                SHA-256 digest).
        """
        meta = await self._meta(name)
        if meta is None or meta.deleted:
            return None
        if not 0 <= meta.size <= self.max_bytes:
            raise self._error(name, f"{meta.size} bytes (at most {self.max_bytes} are read)")
        subject = self._chunk_subject(meta.nuid)
        parts: list[bytes] = []
        total = 0
        seq = 1
        while total < meta.size:
            msgs, _pending = await self.broker.direct_get_batch(
                self.stream, subject, seq, _DIRECT_PAGE
            )
            if not msgs:
                break
            for m in msgs:
                parts.append(m.data)
                total += len(m.data)
                if total > meta.size:
                    break
            seq = msgs[-1].seq + 1
        data = b"".join(parts)
        if len(data) != meta.size or len(parts) != meta.chunks:
            raise self._error(
                name,
                f"holds {len(data)} bytes in {len(parts)} chunks, its description says "
                f"{meta.size} in {meta.chunks}",
            )
        if meta.digest != _digest(data):
            raise self._error(name, "digest mismatch")
        return data

    async def put(self, name: str, data: bytes) -> None:
        """Store ``data`` as the object ``name``, replacing any earlier one.

        The chunks go first, under a fresh id, then the description (a rollup: the only one
        on its subject), then the replaced object's chunks are purged. A crash before the
        description leaves the earlier object (or none) in place and some unreferenced chunks.

        Raises:
            JetStreamError: the stream refused a write (full, missing).
            BrokerUnavailable: the broker did not answer.
        """
        before = await self._meta(name)
        nuid = uuid.uuid4().hex
        subject = self._chunk_subject(nuid)
        chunks = 0
        for start in range(0, len(data), CHUNK_SIZE):
            await self.broker.publish(subject, data[start : start + CHUNK_SIZE])
            chunks += 1
        meta = {
            "name": name,
            "description": self.description,
            "headers": {},
            "options": {"max_chunk_size": CHUNK_SIZE},
            "bucket": self.bucket,
            "nuid": nuid,
            "size": len(data),
            "mtime": _now(),
            "chunks": chunks,
            "digest": _digest(data),
            "deleted": False,
        }
        await self.broker.publish(
            self._meta_subject(name), json.dumps(meta).encode(), {_ROLLUP: "sub"}
        )
        if before is not None and before.nuid != nuid:
            await self._purge(self._chunk_subject(before.nuid))

    async def delete(self, name: str) -> bool:
        """Remove the object ``name`` (NATS's way: a deleted description, the chunks purged).
        ``False`` if none was stored."""
        meta = await self._meta(name)
        if meta is None or meta.deleted:
            return False
        tomb = {
            "name": name,
            "bucket": self.bucket,
            "nuid": meta.nuid,
            "size": 0,
            "chunks": 0,
            "digest": "",
            "deleted": True,
            "mtime": _now(),
        }
        await self.broker.publish(
            self._meta_subject(name), json.dumps(tomb).encode(), {_ROLLUP: "sub"}
        )
        await self._purge(self._chunk_subject(meta.nuid))
        return True

    async def _purge(self, subject: str) -> None:
        try:
            await self.broker.api(f"$JS.API.STREAM.PURGE.{self.stream}", {"filter": subject})
        except JetStreamError:
            pass  # unreferenced chunks: wasted bytes, never read


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _digest(data: bytes) -> str:
    return _DIGEST_PREFIX + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()
