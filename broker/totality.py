"""nats-py's read loop made total: no message from the wire can stop it.

nats-py parses every message's header block, subject and reply subject inside the one task
that reads the connection's socket; an exception there ends that task without closing the
connection, and every later message to the process is silently lost. nats-server passes on what
a publisher sent as it is, so any publisher could do that to every subscriber of a subject it
may publish on. The patches here make a hostile header block or subject harmless instead: such
a message arrives marked (a garbled header, an escaped subject), and every reader refuses it.
"""

from __future__ import annotations

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from . import headers as h

__all__ = ["make_total"]


def make_total(nc: NATS) -> None:
    """Patch ``nc`` (before it connects) so that no header block or subject ends its read
    loop: ``total_headers`` and ``total_subjects``."""
    total_headers(nc)
    total_subjects(nc)


def total_headers(nc: NATS) -> None:
    """Make ``nc``'s header parsing total. nats-py parses a message's header block inside its
    read loop, and some malformed blocks (e.g. ``XXXX\\r\\n\\r\\n``, which nats-server
    passes on as it is) raise there: the read loop then ends without closing the connection,
    and every later message to this process is silently lost. Any publisher could do that to
    every subscriber of a subject it may publish on. Instead, such a message arrives with the
    one header ``Sojourn-Headers-Garbled`` (``headers.GARBLED``), which readers refuse."""
    parse = nc._process_headers

    async def process(raw: bytes) -> dict[str, str] | None:
        try:
            return await parse(raw)
        except Exception as e:
            return {h.GARBLED: f"{type(e).__name__}: {len(raw)}-byte header block"}

    nc._process_headers = process  # type: ignore[method-assign,assignment]


def total_subjects(nc: NATS) -> None:
    """Make ``nc``'s message building total. nats-server passes on any bytes as a subject or
    a reply subject (``PUB t.wake.\\xff 2``), stores them in a stream whose wildcard matches,
    and delivers them to every subscriber and consumer; nats-py decodes both as UTF-8 inside
    its read loop, which then ends on the first that is not, without closing the connection.
    Instead such a subject arrives with its bytes escaped (``t.wake.\\\\xff``): no valid name
    or reply subject has a backslash, so every reader refuses it like any malformed subject
    (and a consumer's delivery can still be acked: its reply, the ack subject, is the
    server's)."""
    build = nc._build_message

    def total(
        sid: int, subject: bytes, reply: bytes, data: bytes, headers: dict[str, str] | None
    ) -> Msg:
        try:
            msg: Msg = build(sid, subject, reply, data, headers)
        except UnicodeDecodeError:
            msg = build(sid, _escaped(subject), _escaped(reply), data, headers)
        return msg

    nc._build_message = total  # type: ignore[method-assign]


def _escaped(raw: bytes) -> bytes:
    """``raw`` as UTF-8 with every byte that is not written ``\\xNN``."""
    return bytes(raw).decode("utf-8", "backslashreplace").encode()
