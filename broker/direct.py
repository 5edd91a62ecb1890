"""Direct gets: messages read back from a stream by subject and sequence, no consumer needed.

Every read of a connection answers on one wildcard inbox, each request on its own token: no
subscription (and no nats-py task) is made and dropped per read. A status answer (no message,
no stream, an error) is told from a stored message by the server's ``Nats-Sequence`` header,
never by headers a publisher may have stored, and "no responders" from a stream that exists
is ``BrokerUnavailable`` (no replica could answer), never "nothing stored".
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError

from sojourn.schemas.errors import BrokerUnavailable, JetStreamError, PermissionDenied

from . import headers as h
from .delivery import StoredMessage
from .denials import Denials

__all__ = ["BATCH_MAX_BYTES", "DirectReads"]

T = TypeVar("T")

_MISSING = ("404", "503")
"""Direct-get answers meaning "nothing there": no such message, or no such stream yet (a
deployment prefix nothing has used answers 503, no responders). A 503 from a stream that does
exist means no replica could answer (a cluster electing a leader): ``_nobody_answered``
raises ``BrokerUnavailable`` then, never "nothing stored"."""


BATCH_MAX_BYTES = 8 * 2**20
"""The most bytes one batched direct get asks the server for (its ``max_bytes``): a page of
1,000 messages of up to ``max_payload`` each could otherwise be a gigabyte in one answer. A
page cut short says how many more match, and the reader goes on from where it stopped."""


def _status_of(msg: Msg) -> str | None:
    """The status of a direct get's answer, ``None`` when it carries a stored message.

    A status answer is the server's own and carries no message; an answer that carries one
    always has its ``Nats-Sequence`` (set by the server), and whatever other headers its
    publisher stored with it are the message's: a stored ``Status: 500`` or ``Status: 204``
    header must not end a read (it wedged every follower of the stream at that message)."""
    headers = msg.headers or {}
    if h.SEQUENCE in headers:
        return None
    return headers.get(h.STATUS)


def _code(text: str) -> int:
    """A status code or count from a header (0 when it is not a number)."""
    return int(text) if text.isdigit() and len(text) < 19 else 0


class DirectReads:
    """The direct gets of one connection, over its shared reads inbox.

    Args:
        nc: the connection.
        denials: its permission violations (a refused read ends at once).
        refused: the error for a request the server refused (``Broker.permission_denied``).
        stream_config: a stream's config, ``None`` when it does not exist
            (``Broker.stream_config``).
    """

    def __init__(
        self,
        nc: NATS,
        denials: Denials,
        refused: Callable[[str], PermissionDenied],
        stream_config: Callable[[str], Awaitable[dict[str, Any] | None]],
    ) -> None:
        self._nc = nc
        self._denials = denials
        self._refused = refused
        self._stream_config = stream_config
        self._reads: dict[str, Callable[[Msg], None]] = {}
        self._reads_prefix = ""
        self._reads_sub: asyncio.Future[None] | None = None
        self._read_ids = itertools.count(1)

    async def last(self, stream: str, subject: str, timeout: float) -> StoredMessage | None:
        """The last message on ``subject``, or ``None`` when there is none."""
        return await self._one(f"$JS.API.DIRECT.GET.{stream}.{subject}", b"", subject, timeout)

    async def first_from(
        self, stream: str, subject: str, seq: int, timeout: float
    ) -> StoredMessage | None:
        """The first message on ``subject`` at or after stream sequence ``seq``."""
        req = msgspec.json.encode({"seq": seq, "next_by_subj": subject})
        return await self._one(f"$JS.API.DIRECT.GET.{stream}", req, subject, timeout)

    async def _one(
        self, api: str, req: bytes, subject: str, timeout: float
    ) -> StoredMessage | None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Msg] = loop.create_future()

        def on_msg(m: Msg) -> None:
            if not done.done():
                done.set_result(m)

        # Not ``nc.request``: it takes any answer with a ``Status: 503`` header for "no
        # responders", a stored message's own header included.
        msg = await self._read(api, req, on_msg, done, f"direct get {subject}", timeout)
        status = _status_of(msg)
        if status == "503":
            await self._nobody_answered(api, subject)
        if status in _MISSING:
            return None
        if status:
            raise JetStreamError(
                f"direct get {subject}: status {status}", code=_code(status), err_code=0
            )
        return StoredMessage.from_nats(msg)

    async def every(
        self, stream: str, subject: str, from_seq: int, page: int, timeout: float
    ) -> list[StoredMessage]:
        """Every message on ``subject`` from ``from_seq`` on, in order, ``page`` at a time."""
        out: list[StoredMessage] = []
        seq = from_seq
        while True:
            msgs, pending = await self.batch(stream, subject, seq, page, timeout)
            out.extend(msgs)
            if not msgs or pending == 0:
                return out
            seq = msgs[-1].seq + 1

    async def batch(
        self, stream: str, subject: str, seq: int, batch: int, timeout: float
    ) -> tuple[list[StoredMessage], int]:
        """Up to ``batch`` messages matching ``subject`` (wildcards allowed) from ``seq`` on,
        and how many more match after them."""
        req = msgspec.json.encode(
            {"seq": seq, "batch": batch, "next_by_subj": subject, "max_bytes": BATCH_MAX_BYTES}
        )
        return await self._batched(stream, req, subject, timeout)

    async def last_of(
        self, stream: str, subjects: list[str], batch: int, timeout: float
    ) -> list[StoredMessage]:
        """The last message of each subject matching any of ``subjects`` (wildcards allowed),
        at most ``batch`` of them, in stream order: one request however many filters."""
        req = msgspec.json.encode(
            {"multi_last": subjects, "batch": batch, "max_bytes": BATCH_MAX_BYTES}
        )
        msgs, _ = await self._batched(stream, req, " or ".join(subjects), timeout)
        return msgs

    async def _batched(
        self, stream: str, req: bytes, subject: str, timeout: float
    ) -> tuple[list[StoredMessage], int]:
        """A batched direct get: the messages answered, and the count left after them."""
        msgs: list[StoredMessage] = []
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()

        nobody = [False]

        def on_msg(m: Msg) -> None:
            if done.done():
                return  # a late answer to a read given up on
            headers = m.headers or {}
            status = _status_of(m)
            if status is not None:
                nobody[0] = status == "503"
                if status == "204" or status in _MISSING:
                    done.set_result(_code(headers.get(h.NUM_PENDING, "0")))
                else:
                    done.set_exception(
                        JetStreamError(
                            f"direct get {subject}: status {status} "
                            f"{headers.get(h.DESCRIPTION, '')}",
                            code=_code(status),
                            err_code=0,
                        )
                    )
                return
            msgs.append(StoredMessage.from_nats(m))

        api = f"$JS.API.DIRECT.GET.{stream}"
        pending = await self._read(api, req, on_msg, done, f"reading {subject}", timeout)
        if not msgs and nobody[0]:
            await self._nobody_answered(api, subject)
        return msgs, pending

    async def _read(
        self,
        api: str,
        req: bytes,
        on_msg: Callable[[Msg], None],
        done: asyncio.Future[T],
        what: str,
        timeout: float,
    ) -> T:
        """Send a direct get on the shared reads inbox; every answer goes to ``on_msg`` until
        ``done`` is resolved (by ``on_msg``), which is returned.

        Raises:
            PermissionDenied: the server refused this user the read.
            BrokerUnavailable: ``done`` was not resolved within ``timeout`` seconds.
        """

        def on_denied() -> None:
            if not done.done():
                done.set_exception(self._refused(api))

        await self._reading()
        token = str(next(self._read_ids))
        self._reads[token] = on_msg
        stop = self._denials.watch(api, on_denied)
        try:
            await self._nc.publish(api, req, reply=f"{self._reads_prefix}.{token}")
            try:
                return await asyncio.wait_for(done, timeout)
            except TimeoutError as e:
                raise BrokerUnavailable(f"{what} timed out after {timeout}s") from e
        finally:
            stop()
            self._reads.pop(token, None)

    async def _reading(self) -> None:
        """Subscribe the direct-get inbox (once; concurrent first reads wait for it)."""
        if self._reads_sub is None:
            self._reads_sub = asyncio.get_running_loop().create_future()
            self._reads_prefix = self._nc.new_inbox()
            try:

                async def route(m: Msg) -> None:
                    handler = self._reads.get(m.subject.rpartition(".")[2])
                    if handler is not None:
                        handler(m)

                # Every read in flight shares this one queue: room for many pages of answers.
                await self._nc.subscribe(
                    f"{self._reads_prefix}.*",
                    cb=route,
                    pending_msgs_limit=1_000_000,
                    pending_bytes_limit=1024 * 1024 * 1024,
                )
            except BaseException as e:
                failed, self._reads_sub = self._reads_sub, None
                failed.set_exception(e)
                failed.exception()  # retrieved: the next read tries again
                raise
            self._reads_sub.set_result(None)
        await asyncio.shield(self._reads_sub)

    async def _nobody_answered(self, api: str, subject: str) -> None:
        """A direct get got "no responders". For a stream that does not exist yet that means
        nothing is stored; for one that exists it means no replica could answer right now (a
        cluster electing a leader), and "nothing stored" would be a lie that makes a run look
        absent: raise ``BrokerUnavailable`` (callers retry) instead.

        Raises:
            BrokerUnavailable: the stream exists.
        """
        stream = api.removeprefix("$JS.API.DIRECT.GET.").split(".", 1)[0]
        try:
            exists = await self._stream_config(stream) is not None
        except (JetStreamError, TimeoutError, NatsTimeoutError):
            exists = True  # the meta leader is not answering either: certainly not "absent"
        if exists:
            raise BrokerUnavailable(
                f"no replica of stream {stream} answered a direct get of {subject[:200]} "
                "(a leader election?)"
            )
