"""The archive: ended runs' histories, kept in a JetStream object store once they leave the hot
events stream (retention, ``Settings.retain_ended``).

One object per run, named by its run id, in the bucket ``<PREFIX>_ARCHIVE`` (the stream
``OBJ_<PREFIX>_ARCHIVE``). The layout is NATS's own object store (chunks on
``$O.<bucket>.C.<nuid>``, the object's description on ``$O.<bucket>.M.<base64url(name)>``), so
``nats object ls/get`` read it too. It is written and read here through the ``Broker`` façade:
chunks are plain publishes, reads are direct gets, so reading an archived run needs no consumer
and cannot hang on a missing chunk (nats-py's ``ObjectStore.get`` waits on an ordered
consumer with no deadline).

The object's body is the run's history exactly as the events stream stored it, one
msgspec-encoded (MessagePack) ``ArchivedRun`` document with a format version: every decision's
stream sequence, writer, ``Nats-Msg-Id`` and the encoded events as stored. ``decode_archive``
turns it back into the same ``Decision`` list ``EventStore.load`` returned before archiving.

Everything read back is hostile: the description is checked field by field, the body's size
is bounded (``MAX_ARCHIVE``) and must match the description's size, chunk count and SHA-256
digest, and the document must name the run it was asked for.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from sojourn.schemas.codec import decode_events
from sojourn.schemas.errors import HistoryError
from sojourn.schemas.wire import ARCHIVE_FORMAT, ArchivedDecision, ArchivedRun

from . import headers as h
from .connection import Broker, JetStreamError
from .delivery import StoredMessage
from .eventstore import Decision
from .names import Names

__all__ = [
    "ARCHIVE_FORMAT",
    "CHUNK_SIZE",
    "MAX_ARCHIVE",
    "ArchiveStore",
    "ArchivedDecision",
    "ArchivedRun",
    "decode_archive",
    "encode_archive",
]

CHUNK_SIZE = 128 * 1024
"""Bytes per object-store chunk (NATS's default)."""

MAX_ARCHIVE = 1024 * 1024 * 1024
"""The largest archived history read back, in bytes (1 GiB): a description claiming more is
refused before anything is read."""

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


_archive_decoder = msgspec.msgpack.Decoder(ArchivedRun)
_archive_encoder = msgspec.msgpack.Encoder()


def encode_archive(run_id: str, messages: Sequence[StoredMessage], archived_at: float) -> bytes:
    """The archived form of a run's history, from its stored messages in order."""
    return _archive_encoder.encode(
        ArchivedRun(
            format=ARCHIVE_FORMAT,
            run_id=run_id,
            archived_at=archived_at,
            decisions=tuple(
                ArchivedDecision(
                    seq=m.seq,
                    writer=m.header(h.WRITER),
                    msg_id=m.header(h.MSG_ID),
                    data=m.data,
                )
                for m in messages
            ),
        )
    )


def decode_archive(run_id: str, data: bytes) -> list[Decision]:
    """The decisions of an archived history, as ``EventStore.load`` returns them.

    Raises:
        HistoryError: the document is not an ``ArchivedRun`` of this run in a format this
            code reads, its sequences are not increasing, or an event cannot be decoded.
    """
    try:
        doc = _archive_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise HistoryError(
            f"run {run_id}: the archive cannot be decoded: {e}", run_id=run_id
        ) from e
    if not 1 <= doc.format <= ARCHIVE_FORMAT:
        raise HistoryError(
            f"run {run_id}: archive format {doc.format} (this sojourn reads up to "
            f"{ARCHIVE_FORMAT})",
            run_id=run_id,
        )
    if doc.run_id != run_id:
        raise HistoryError(f"run {run_id}: the archive holds another run", run_id=run_id)
    out: list[Decision] = []
    last = 0
    for d in doc.decisions:
        if d.seq <= last:
            raise HistoryError(
                f"run {run_id}: archived sequences do not increase at {d.seq}", run_id=run_id
            )
        last = d.seq
        try:
            events = tuple(decode_events(d.data))
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise HistoryError(
                f"run {run_id}: archived message {d.seq} cannot be decoded: {e}",
                run_id=run_id,
                seq=d.seq,
            ) from e
        out.append(Decision(d.seq, events, d.writer, d.msg_id, len(d.data)))
    return out


class ArchiveStore:
    """Put, get, look for and delete one run's archived history (bytes) in the object store.

    Args:
        broker: the connection.
        names: the deployment's names (the bucket is ``<PREFIX>_ARCHIVE``).
        max_bytes: the largest object ``get`` reads back.
    """

    def __init__(self, broker: Broker, names: Names, *, max_bytes: int = MAX_ARCHIVE) -> None:
        self.broker = broker
        self.names = names
        self.max_bytes = max_bytes
        self.bucket = names.archive_bucket
        self.stream = names.archive_stream

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

    def _meta_subject(self, run_id: str) -> str:
        name = base64.urlsafe_b64encode(run_id.encode()).decode()
        return f"$O.{self.bucket}.M.{name}"

    def _chunk_subject(self, nuid: str) -> str:
        return f"$O.{self.bucket}.C.{nuid}"

    async def _meta(self, run_id: str) -> _ObjectMeta | None:
        m = await self.broker.direct_get_last(self.stream, self._meta_subject(run_id))
        if m is None:
            return None
        if len(m.data) > _META_MAX:
            raise HistoryError(f"run {run_id}: archive description too large", run_id=run_id)
        try:
            # NATS's object-store JSON (not a sojourn wire body): parsed, then checked by type.
            meta = msgspec.convert(json.loads(m.data), _ObjectMeta)
        except (ValueError, msgspec.ValidationError) as e:
            raise HistoryError(
                f"run {run_id}: archive description unreadable: {e}", run_id=run_id
            ) from e
        if meta.name != run_id or meta.bucket != self.bucket or not _NUID.fullmatch(meta.nuid):
            raise HistoryError(
                f"run {run_id}: archive description names another object", run_id=run_id
            )
        return meta

    async def exists(self, run_id: str) -> bool:
        """Whether an archived history of ``run_id`` is stored (one direct get)."""
        meta = await self._meta(run_id)
        return meta is not None and not meta.deleted

    async def get(self, run_id: str) -> bytes | None:
        """The archived history of ``run_id`` (``None``: none is stored).

        Raises:
            HistoryError: the object is larger than ``max_bytes``, or its chunks do not match
                its description (size, count, SHA-256 digest).
        """
        meta = await self._meta(run_id)
        if meta is None or meta.deleted:
            return None
        if not 0 <= meta.size <= self.max_bytes:
            raise HistoryError(
                f"run {run_id}: archive of {meta.size} bytes (at most {self.max_bytes} are read)",
                run_id=run_id,
            )
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
            raise HistoryError(
                f"run {run_id}: archive holds {len(data)} bytes in {len(parts)} chunks, its "
                f"description says {meta.size} in {meta.chunks}",
                run_id=run_id,
            )
        if meta.digest != _digest(data):
            raise HistoryError(f"run {run_id}: archive digest mismatch", run_id=run_id)
        return data

    async def put(self, run_id: str, data: bytes) -> None:
        """Store ``data`` as ``run_id``'s archived history, replacing any earlier one.

        The chunks go first, under a fresh id, then the description (a rollup: the only one
        on its subject), then the replaced object's chunks are purged. A crash before the
        description leaves the earlier object (or none) in place and some unreferenced chunks.

        Raises:
            JetStreamError: the stream refused a write (full, missing).
            BrokerUnavailable: the broker did not answer.
        """
        before = await self._meta(run_id)
        nuid = uuid.uuid4().hex
        subject = self._chunk_subject(nuid)
        chunks = 0
        for start in range(0, len(data), CHUNK_SIZE):
            await self.broker.publish(subject, data[start : start + CHUNK_SIZE])
            chunks += 1
        meta = {
            "name": run_id,
            "description": "a sojourn run's archived history (sojourn.broker.archive)",
            "headers": {},
            "options": {"max_chunk_size": CHUNK_SIZE},
            "bucket": self.bucket,
            "nuid": nuid,
            "size": len(data),
            "mtime": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            "chunks": chunks,
            "digest": _digest(data),
            "deleted": False,
        }
        await self.broker.publish(
            self._meta_subject(run_id), json.dumps(meta).encode(), {_ROLLUP: "sub"}
        )
        if before is not None and before.nuid != nuid:
            await self._purge(self._chunk_subject(before.nuid))

    async def delete(self, run_id: str) -> bool:
        """Remove ``run_id``'s archived history (NATS's way: a deleted description, the chunks
        purged). ``False`` if none was stored."""
        meta = await self._meta(run_id)
        if meta is None or meta.deleted:
            return False
        tomb = {
            "name": run_id,
            "bucket": self.bucket,
            "nuid": meta.nuid,
            "size": 0,
            "chunks": 0,
            "digest": "",
            "deleted": True,
            "mtime": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        }
        await self.broker.publish(
            self._meta_subject(run_id), json.dumps(tomb).encode(), {_ROLLUP: "sub"}
        )
        await self._purge(self._chunk_subject(meta.nuid))
        return True

    async def _purge(self, subject: str) -> None:
        try:
            await self.broker.api(f"$JS.API.STREAM.PURGE.{self.stream}", {"filter": subject})
        except JetStreamError:
            pass  # unreferenced chunks: wasted bytes, never read


def _digest(data: bytes) -> str:
    return _DIGEST_PREFIX + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()
