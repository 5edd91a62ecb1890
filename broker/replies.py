"""Requests with their answers on one shared reply subscription: nats-py's request, leaner.

Every round trip sojourn awaits (an event append's publish ack, a JetStream API call, a core
request) is a publish with a reply subject and a wait for the first answer. nats-py's
``request`` does that with a fresh NUID token, an ``asyncio.wait_for`` (a second future, a
timer and two callbacks) and a done-callback per request: about 20 µs of CPU that an append,
whose whole round trip is some 400 µs, pays every time (``bench.foundation`` counts it in the
floor as well as in sojourn's figure, since both append through ``Broker.publish_raw``).

``Replies`` keeps one wildcard subscription on ``<inbox>.*`` (the connection's inbox prefix,
so an authenticated user's ``_INBOX.<user>.>`` permission covers it), names each request by a
counter, and bounds the wait with one timer handle. The semantics are nats-py's: the first
answer wins, a header-only answer with ``Status: 503`` is "no responders"
(``NoRespondersError``), no answer in time is nats-py's ``TimeoutError``.
"""

from __future__ import annotations

import asyncio
import itertools

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from . import headers as h

__all__ = ["Replies"]

_NO_RESPONDERS = "503"


class Replies:
    """One connection's request/reply multiplexer (see the module docstring)."""

    def __init__(self, nc: NATS) -> None:
        self._nc = nc
        self._prefix = ""
        self._waiting: dict[str, asyncio.Future[Msg]] = {}
        self._ids = itertools.count(1)
        self._ready: asyncio.Future[None] | None = None

    async def request(
        self, subject: str, data: bytes, headers: dict[str, str] | None, timeout: float
    ) -> Msg:
        """Publish ``data`` to ``subject`` with a reply subject of this multiplexer's and return
        the first answer.

        Raises:
            NoRespondersError: the server said nobody subscribes to ``subject``.
            nats.errors.TimeoutError: no answer within ``timeout`` seconds.
        """
        if self._ready is None or not self._ready.done() or self._ready.exception():
            await self._subscribe()
        loop = asyncio.get_running_loop()
        token = str(next(self._ids))
        answer: asyncio.Future[Msg] = loop.create_future()
        self._waiting[token] = answer
        timer = loop.call_later(timeout, _give_up, answer)
        try:
            await self._nc.publish(subject, data, reply=f"{self._prefix}{token}", headers=headers)
            msg = await answer
        finally:
            timer.cancel()
            self._waiting.pop(token, None)
        if not msg.data and msg.headers and msg.headers.get(h.STATUS) == _NO_RESPONDERS:
            raise NoRespondersError
        return msg

    async def _subscribe(self) -> None:
        """Subscribe ``<inbox>.*`` once; concurrent first requests wait for the one doing it,
        and a failed subscription is tried again by the next request."""
        if self._ready is not None and not self._ready.done():
            await asyncio.shield(self._ready)
            return
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ready = ready
        try:
            prefix = f"{self._nc.new_inbox()}."
            await self._nc.subscribe(f"{prefix}*", cb=self._answer)
        except BaseException as e:
            ready.set_exception(e)
            ready.exception()  # retrieved: the next request subscribes again
            raise
        self._prefix = prefix
        ready.set_result(None)

    async def _answer(self, msg: Msg) -> None:
        answer = self._waiting.get(msg.subject[len(self._prefix) :])
        if answer is not None and not answer.done():
            answer.set_result(msg)


def _give_up(answer: asyncio.Future[Msg]) -> None:
    if not answer.done():
        answer.set_exception(NatsTimeoutError())
