"""What the broker hands back: deliveries, core subscriptions and publish acks, typed.

Nothing above ``sojourn.broker`` sees a nats-py type. A message from a durable consumer (an
inbox message, a wake) or from a core subscription is a ``Delivery``: its subject, body, headers
as a plain ``dict[str, str]``, and, for a consumer's message, how to settle it (``ack``,
``nak``, ``in_progress``, ``term``) and where it sits (``num_delivered``, ``stream_seq``,
``timestamp``...). A JetStream publish is answered with a ``PublishAck``, and a message read
back from a stream (a direct get) is a ``StoredMessage``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime

import msgspec
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as _NatsSubscription
from nats.errors import TimeoutError as NatsTimeoutError

from . import headers as h

__all__ = [
    "Delivery",
    "LocalWake",
    "NotADelivery",
    "OnDelivery",
    "PublishAck",
    "StoredMessage",
    "Subscription",
]


class PublishAck(msgspec.Struct, frozen=True, kw_only=True):
    """JetStream's answer to a publish it stored.

    Attributes:
        stream: the stream that stored the message.
        seq: the message's stream sequence.
        duplicate: the stream already held a message with this ``Nats-Msg-Id`` (within its
            duplicate window): nothing new was stored, and ``seq`` is the earlier message's.
    """

    stream: str
    seq: int
    duplicate: bool = False


class StoredMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One message as a stream stores it, read back by a direct get
    (``Broker.direct_get_last`` / ``_next`` / ``_range`` / ``_batch``, ``StreamFollower``).

    Attributes:
        subject: the subject it was stored on.
        seq: its stream sequence.
        data: its body.
        headers: the headers of the answer: the message's own (``Nats-Msg-Id``,
            ``Sojourn-Writer``...) and JetStream's about where it sits (``Nats-Stream``,
            ``Nats-Sequence``, ``Nats-Subject``, ``Nats-Time-Stamp``).
        time: when the stream stored it, unix seconds (0.0 when the answer did not say).
    """

    subject: str
    seq: int
    data: bytes
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    time: float = 0.0

    def __repr__(self) -> str:
        return f"<StoredMessage {self.subject!r} #{self.seq} {len(self.data)} bytes>"

    def header(self, name: str, default: str = "") -> str:
        """One header's value, ``default`` when it is not set."""
        return self.headers.get(name, default)

    @classmethod
    def from_nats(cls, msg: Msg) -> StoredMessage:
        """A direct get's answer (not a status answer) as the message it carries; for the
        broker's own use."""
        headers = dict(msg.headers or {})
        return cls(
            subject=headers.get(h.SUBJECT, ""),
            seq=int(headers.get(h.SEQUENCE, "") or 0),
            data=msg.data,
            headers=headers,
            time=_stored_time(headers.get(h.TIME_STAMP, "")),
        )


def _stored_time(stamp: str) -> float:
    """``Nats-Time-Stamp`` (RFC 3339 with nanoseconds) as unix seconds; 0.0 if unreadable."""
    if not stamp:
        return 0.0
    try:
        head, _, frac = stamp.rstrip("Z").partition(".")
        base = datetime.fromisoformat(head + "+00:00").timestamp()
        return base + (float("0." + frac) if frac else 0.0)
    except ValueError:
        return 0.0


_V1_TOKENS = 9
"""Tokens of an ack subject without a domain (nats-py's ``_V1_TOKEN_COUNT``)."""


class NotADelivery(ValueError):
    """The message came from a core subscription, not a durable consumer: it has no delivery
    metadata (and cannot be acknowledged)."""


class Delivery:
    """One message delivered to this process: by a durable consumer (an inbox message, a wake),
    or by a core subscription.

    Only a consumer's delivery can be settled and has metadata; on a core subscription's
    message the metadata properties raise ``NotADelivery``.
    """

    __slots__ = ("_counts", "_msg")

    def __init__(self, msg: Msg) -> None:
        self._msg = msg
        self._counts: tuple[int, int, int, int, int] | None = None

    def __repr__(self) -> str:
        return f"<Delivery {self.subject!r} {len(self.data)} bytes>"

    # --- the message ---------------------------------------------------------------------------

    @property
    def subject(self) -> str:
        return self._msg.subject

    @property
    def data(self) -> bytes:
        return self._msg.data

    @property
    def reply(self) -> str:
        """The reply subject ("" when none). For a consumer's delivery it is its ack subject."""
        return self._msg.reply or ""

    @property
    def headers(self) -> dict[str, str]:
        """The message's headers (empty when it has none)."""
        return self._msg.headers or {}

    def header(self, name: str, default: str = "") -> str:
        """One header's value, ``default`` when it is not set."""
        return (self._msg.headers or {}).get(name, default)

    async def respond(self, data: bytes) -> None:
        """Answer a request: publish ``data`` on its reply subject."""
        await self._msg.respond(data)

    # --- settling a consumer's delivery --------------------------------------------------------

    async def ack(self) -> None:
        """Done with it: the consumer never delivers it again."""
        await self._msg.ack()

    async def nak(self, delay: float | None = None) -> None:
        """Hand it back: delivered again after ``delay`` seconds (at once without one)."""
        await self._msg.nak(delay=delay)

    async def in_progress(self) -> None:
        """Still working on it: restart its ack deadline (may be called any number of times)."""
        await self._msg.in_progress()

    async def term(self) -> None:
        """Never deliver it again, without processing it."""
        await self._msg.term()

    # --- where it sits -------------------------------------------------------------------------

    def _meta(self) -> Msg.Metadata:
        try:
            return self._msg.metadata
        except Exception as e:
            raise NotADelivery(f"{self.subject!r} is not a consumer's delivery") from e

    def _numbers(self) -> tuple[int, int, int, int, int]:
        """``(num_delivered, stream_seq, consumer_seq, num_pending, stored_ns)`` from the ack
        subject, read once: the same tokens nats-py's metadata reads, without building its
        ``datetime`` (most of the cost of reading the metadata on every start and wake)."""
        counts = self._counts
        if counts is None:
            try:
                t = Msg.Metadata._get_metadata_fields(self._msg.reply)
                if len(t) == _V1_TOKENS:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>...
                    counts = (int(t[4]), int(t[5]), int(t[6]), int(t[8]), int(t[7]))
                else:  # $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>...
                    a = Msg.Ack
                    counts = (
                        int(t[a.NumDelivered]),
                        int(t[a.StreamSeq]),
                        int(t[a.ConsumerSeq]),
                        int(t[a.NumPending]),
                        int(t[a.Timestamp]),
                    )
            except Exception as e:
                raise NotADelivery(f"{self.subject!r} is not a consumer's delivery") from e
            self._counts = counts
        return counts

    @property
    def num_delivered(self) -> int:
        """How many times it has been delivered (1 the first time)."""
        return self._numbers()[0]

    @property
    def stream_seq(self) -> int:
        """Its sequence in the stream."""
        return self._numbers()[1]

    @property
    def consumer_seq(self) -> int:
        """Its delivery sequence in the consumer."""
        return self._numbers()[2]

    @property
    def num_pending(self) -> int:
        """How many messages the consumer still had to deliver after this one."""
        return self._numbers()[3]

    @property
    def timestamp(self) -> datetime:
        """When the stream stored it (UTC)."""
        return self._meta().timestamp

    @property
    def stored_at(self) -> float:
        """When the stream stored it, in Unix seconds (``timestamp`` without a ``datetime``)."""
        return self._numbers()[4] / 1e9

    @property
    def stream(self) -> str:
        """The stream it was stored in."""
        return self._meta().stream

    @property
    def consumer(self) -> str:
        """The durable consumer that delivered it."""
        return self._meta().consumer


OnDelivery = Callable[[Delivery], Awaitable[None]]
"""A core subscription's callback."""


class Subscription:
    """A core NATS subscription (``Broker.subscribe``): what is published on its subject while
    it is open, nothing stored. Read it with ``next_msg`` unless it was made with a callback."""

    __slots__ = ("_sub",)

    def __init__(self, sub: _NatsSubscription) -> None:
        self._sub = sub

    @property
    def subject(self) -> str:
        return self._sub.subject

    async def next_msg(self, timeout: float | None = 1.0) -> Delivery:
        """The next message.

        Raises:
            TimeoutError: none arrived within ``timeout`` seconds.
        """
        try:
            return Delivery(await self._sub.next_msg(timeout=timeout))
        except NatsTimeoutError:
            raise TimeoutError(f"no message on {self.subject} within {timeout}s") from None

    async def unsubscribe(self) -> None:
        await self._sub.unsubscribe()


class LocalWake(Delivery):
    """A wake this process gives itself (an in-process timer came due): it came from no
    consumer, so there is nothing to settle and no delivery metadata. A run it fails to move
    is woken again by the broker's own copy of the timer (its backstop)."""

    __slots__ = ("_headers", "_subject")

    def __init__(self, subject: str, headers: dict[str, str] | None = None) -> None:
        self._subject = subject
        self._headers = headers or {}

    def __repr__(self) -> str:
        return f"<LocalWake {self._subject!r}>"

    @property
    def subject(self) -> str:
        return self._subject

    @property
    def data(self) -> bytes:
        return b""

    @property
    def reply(self) -> str:
        return ""

    @property
    def headers(self) -> dict[str, str]:
        return self._headers

    def header(self, name: str, default: str = "") -> str:
        return self._headers.get(name, default)

    async def respond(self, data: bytes) -> None:
        raise NotADelivery(f"{self._subject!r} is a local wake: nobody to answer")

    async def ack(self) -> None:
        return None

    async def nak(self, delay: float | None = None) -> None:
        return None

    async def in_progress(self) -> None:
        return None

    async def term(self) -> None:
        return None

    def _meta(self) -> Msg.Metadata:
        raise NotADelivery(f"{self._subject!r} is a local wake, not a consumer's delivery")

    def _numbers(self) -> tuple[int, int, int, int, int]:
        raise NotADelivery(f"{self._subject!r} is a local wake, not a consumer's delivery")
