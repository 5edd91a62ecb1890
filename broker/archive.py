"""The archive: ended runs' histories, kept in a JetStream object store once they leave the hot
events stream (retention, ``Settings.retain_ended``).

One object per run, named by its run id, in the bucket ``<PREFIX>_ARCHIVE`` (the stream
``OBJ_<PREFIX>_ARCHIVE``), stored and read back by ``broker.objects.ObjectStore`` (NATS's own
object-store layout, through the ``Broker`` façade; a read never waits on a consumer).

The object's body is the run's history exactly as the events stream stored it, one
msgspec-encoded (MessagePack) ``ArchivedRun`` document with a format version: every decision's
stream sequence, writer, ``Nats-Msg-Id`` and the encoded events as stored. ``decode_archive``
turns it back into the same ``Decision`` list ``EventStore.load`` returned before archiving.

Everything read back is hostile: the object store bounds the body (``MAX_ARCHIVE``) and checks
it against its description (size, chunk count, SHA-256 digest); here the document must decode,
in a format this code reads, and name the run it was asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from sojourn.schemas.codec import decode_events
from sojourn.schemas.errors import HistoryError, SojournError
from sojourn.schemas.wire import ARCHIVE_FORMAT, ArchivedDecision, ArchivedRun

from . import headers as h
from .connection import Broker
from .delivery import StoredMessage
from .eventstore import Decision
from .names import Names
from .objects import CHUNK_SIZE, ObjectStore

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

MAX_ARCHIVE = 1024 * 1024 * 1024
"""The largest archived history read back, in bytes (1 GiB): a description claiming more is
refused before anything is read."""


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
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
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


class ArchiveStore(ObjectStore):
    """Put, get, look for and delete one run's archived history (bytes) in the object store
    (``ObjectStore``, one object per run id; a damaged one raises ``HistoryError``).

    Args:
        broker: the connection.
        names: the deployment's names (the bucket is ``<PREFIX>_ARCHIVE``).
        max_bytes: the largest object ``get`` reads back.
    """

    def __init__(self, broker: Broker, names: Names, *, max_bytes: int = MAX_ARCHIVE) -> None:
        super().__init__(
            broker,
            names.archive_bucket,
            max_bytes=max_bytes,
            description="a sojourn run's archived history (sojourn.broker.archive)",
        )
        self.names = names
        assert self.stream == names.archive_stream

    def _error(self, name: str, problem: str) -> SojournError:
        return HistoryError(f"run {name}: archive {problem}", run_id=name)
