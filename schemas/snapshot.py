"""The run model's snapshot: what the watchdog and the projector would otherwise re-fold from
the first message of the events stream at every start.

One MessagePack document (``ModelSnapshot``) per role, the object ``model`` in the bucket
``<PREFIX>_SNAPSHOTS``, written by the projector leader: the live runs' summaries, the count
of ended runs, the anomaly baselines, the agents, and ``position``, the events-stream sequence
of the last decision folded into it. A reader restores it and follows the stream from
``position + 1``; folding the rest gives what folding everything gives
(tests/projections/test_snapshot.py).

The summaries' type is a parameter (``ModelSnapshot[RunSummary]``): the fold that makes them
lives in ``sojourn.projections.summary``, and ``schemas`` imports nothing of ours. Readers refuse
a ``format`` newer than ``SNAPSHOT_FORMAT`` before decoding the rest (a newer writer may have
changed any field), and a document that does not decode is refused whole. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec

from .errors import SnapshotUnreadable
from .health import WedgeRecord

__all__ = [
    "SNAPSHOT_FORMAT",
    "HistoryBaselineState",
    "ModelSnapshot",
    "RateBaselineState",
    "SnapshotUnreadable",
    "decode_snapshot",
    "encode_snapshot",
]

SNAPSHOT_FORMAT = 1
"""The version of ``ModelSnapshot`` this code writes and the newest it reads."""

S = TypeVar("S")


class RateBaselineState(msgspec.Struct, frozen=True, kw_only=True):
    """An agent's tool-call counts (``projections.anomaly.RateBaseline``): ``(minute, count)``
    pairs, minutes since the epoch, and the time of the first call counted."""

    minutes: tuple[tuple[int, int], ...] = ()
    first_at: float | None = None


class HistoryBaselineState(msgspec.Struct, frozen=True, kw_only=True):
    """An agent's typical completed-run length (``projections.anomaly.HistoryBaseline``)."""

    mean: float = 0.0
    runs: int = 0


class ModelSnapshot(msgspec.Struct, Generic[S], frozen=True, kw_only=True):
    """The run model at events-stream sequence ``position`` (every decision up to it folded,
    none after it).

    Attributes:
        format: ``SNAPSHOT_FORMAT`` of the writer.
        position: the sequence of the last decision folded (0: none).
        applied_time: the stored time of that decision (unix seconds).
        taken_at: when the snapshot was taken (unix seconds, the writer's clock).
        runs: every live run's summary (ended runs are not kept).
        ended: how many runs ended up to ``position``.
        tool_calls / history: the anomaly baselines, by agent.
        agents: the agents seen (served or named by a run), sorted.
        wedges: the wedge records of live runs the model holds (those it made itself for an
            undecodable message included; a reader's wedge follower replaces the others).
        stream_created: the events stream's creation time (JetStream's ``created``), so a
            snapshot of a stream since deleted and made again is not applied to the new one.
    """

    format: int
    position: int
    applied_time: float = 0.0
    taken_at: float = 0.0
    runs: tuple[S, ...] = ()
    ended: int = 0
    tool_calls: dict[str, RateBaselineState] = {}
    history: dict[str, HistoryBaselineState] = {}
    agents: tuple[str, ...] = ()
    wedges: tuple[WedgeRecord, ...] = ()
    stream_created: str = ""


class _Format(msgspec.Struct):
    """The one field read before the rest: a newer format is refused unread."""

    format: int


_encoder = msgspec.msgpack.Encoder()
_format_decoder = msgspec.msgpack.Decoder(_Format)
_decoders: dict[type[Any], msgspec.msgpack.Decoder[Any]] = {}


def encode_snapshot(snapshot: ModelSnapshot[Any]) -> bytes:
    return _encoder.encode(snapshot)


def decode_snapshot(data: bytes, summary: type[S]) -> ModelSnapshot[S]:
    """The snapshot in ``data``, its runs decoded as ``summary``.

    Raises:
        SnapshotUnreadable: it does not decode, or its format is newer than this code's
            (or not a format at all).
    """
    try:
        fmt = _format_decoder.decode(data).format
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
        raise SnapshotUnreadable(f"not a model snapshot: {e}") from e
    if not 1 <= fmt <= SNAPSHOT_FORMAT:
        raise SnapshotUnreadable(
            f"snapshot format {fmt} (this sojourn reads up to {SNAPSHOT_FORMAT})"
        )
    decoder = _decoders.get(summary)
    if decoder is None:
        decoder = _decoders[summary] = msgspec.msgpack.Decoder(ModelSnapshot[summary])  # type: ignore[valid-type]
    try:
        snap: ModelSnapshot[S] = decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
        raise SnapshotUnreadable(f"the model snapshot cannot be decoded: {e}") from e
    if snap.position < 0 or snap.ended < 0:
        raise SnapshotUnreadable("the model snapshot has a negative position or count")
    return snap
