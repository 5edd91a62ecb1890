"""Connecting to NATS, and the one façade over nats-py that the rest of sojourn uses.

``Broker`` normalizes transport quirks so nobody above it sees them: an empty fetch is an empty
list (nats-py raises ``TimeoutError``), "no servers" is ``BrokerUnavailable``, a JetStream API
error is ``JetStreamError`` with its numeric code, and a request the server's permissions refused
is ``PermissionDenied`` (the server does not answer it: it reports the violation asynchronously,
and nats-py hands that to the error callback). nats-py is migrating to a new ``nats-jetstream``
package; that migration should touch this module, ``connecting.py``, ``totality.py``,
``direct.py``, ``pull.py``, ``delivery.py`` and ``eventstore.py`` only.

No nats-py type leaves ``sojourn.broker``: a consumer's or a subscription's message is a
``Delivery``, a publish is answered with a ``PublishAck``, a message read back from a stream
(a direct get) is a ``StoredMessage``, a wait that ran out is the built-in
``TimeoutError``, and ``BROKER_ERRORS`` names what else a broker call may raise.

How to connect is one ``ConnectOptions`` (``options.py``); the first connect and its errors are
``connecting.py``, nats-py's read loop made total ``totality.py``, permission violations
``denials.py`` and direct gets ``direct.py``. ``ConnectOptions``, ``CredentialsError``,
``resolve_url``, ``DEFAULT_URL`` and the ``ENV_*`` names are importable from here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from sojourn.schemas.codec import decode_json
from sojourn.schemas.errors import BrokerUnavailable, JetStreamError, PermissionDenied

from . import headers as h
from .connecting import dial
from .delivery import Delivery, OnDelivery, PublishAck, StoredMessage, Subscription
from .denials import Denials
from .direct import DirectReads
from .drift import Finding, consumer_finding, stream_finding
from .names import inbox_prefix
from .options import (
    DEFAULT_URL,
    ENV_CREDS,
    ENV_TLS_CA,
    ENV_TLS_CERT,
    ENV_TLS_KEY,
    ConnectOptions,
    CredentialsError,
    options_of,
    redact_url,
    resolve_url,
)
from .pull import PullConsumer, open_pull
from .replies import Replies
from .server import MIN_SERVER_VERSION

__all__ = [
    "BATCH_MAX",
    "BROKER_ERRORS",
    "DEFAULT_URL",
    "ENV_CREDS",
    "ENV_TLS_CA",
    "ENV_TLS_CERT",
    "ENV_TLS_KEY",
    "MIN_SERVER_VERSION",
    "Broker",
    "ConnectOptions",
    "CredentialsError",
    "JetStreamError",
    "PullConsumer",
    "header",
    "resolve_url",
]

log = logging.getLogger("sojourn.broker")


log = logging.getLogger("sojourn.broker")

BATCH_MAX = 1000
"""The most messages one atomic batch may hold (the server's limit)."""

_STREAM_NOT_FOUND = 10059
_STREAM_EXISTS = 10058
_CONSUMER_NOT_FOUND = 10014
_CONSUMER_EXISTS = 10148

BROKER_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.Error,
    BrokerUnavailable,
    JetStreamError,
)
"""What a broker call may raise when the broker, not the caller, is the trouble: nats-py's base
error (a closed connection, a refused request), ``BrokerUnavailable`` and ``JetStreamError``.
``except BROKER_ERRORS`` keeps the caller free of nats-py."""


class Broker:
    """One NATS connection plus the JetStream operations sojourn needs, typed.

    Attributes:
        url: the server URL, any password in it hidden (for logs and messages).
        user: the authenticated user name when known (the user in the URL), else ``None``;
            it is the ``<sender>`` of the authenticated inbox subjects.
    """

    def __init__(
        self, nc: NATS, url: str, *, user: str | None = None, denials: Denials | None = None
    ) -> None:
        self._nc = nc
        self.url = redact_url(url)
        self.user = user
        self._denials = denials or Denials()
        self._direct = DirectReads(nc, self._denials, self.permission_denied, self.stream_config)
        self._replies = Replies(nc)

    @classmethod
    async def connect(
        cls,
        target: str | ConnectOptions | None = None,
        *,
        name: str = "sojourn",
        connect_timeout: float = 2.0,
        reconnect: bool = True,
    ) -> Broker:
        """Connect (a URL, or ``ConnectOptions`` for credentials and TLS) and check the server.

        Raises:
            BrokerUnavailable: nothing answered at the URL.
            CredentialsError: a creds or TLS file cannot be used, the server refused the
                credentials, or TLS is required by one side and not set up on the other.
            BrokerVersionError: the server is older than 2.12 (no message schedules).
        """
        opts = options_of(target).resolved()
        nc, denials = await dial(
            opts, name=name, connect_timeout=connect_timeout, reconnect=reconnect
        )
        return cls(nc, resolve_url(opts.url), user=opts.user, denials=denials)

    def sender(self, default: str) -> str:
        """The token this connection publishes ``<prefix>.as.<sender>...`` messages under: its
        authenticated user, else ``default`` (a claim, on a server without authentication)."""
        return self.user or default

    @property
    def server_version(self) -> str:
        return str(self._nc._server_info.get("version", "?"))

    @property
    def connected(self) -> bool:
        """Whether the connection is up now (``False`` while it reconnects, and once closed):
        what readiness probes report."""
        return bool(self._nc.is_connected)

    async def close(self) -> None:
        """Close the connection, promptly whatever the server's state.

        Not drain(): a worker's outstanding pull requests make drain wait its full timeout
        (30 s); everything we must not lose has been acknowledged by then anyway. While the
        connection is down, whatever nats-py buffered for the reconnect cannot reach a server:
        it is dropped, because nats-py's close would write it to the dead socket and raise
        half-way (``RuntimeError`` under uvloop), leaving the process to exit with a traceback.
        """
        nc = self._nc
        if nc.is_closed:
            return
        if nc.is_connected:
            with contextlib.suppress(Exception):
                await nc.flush(timeout=1)
        else:
            nc._pending = []
            nc._pending_data_size = 0
        try:
            await nc.close()
        except (OSError, RuntimeError) as e:  # the socket died under the close
            log.debug("NATS (%s): closing: %s: %s", self.url, type(e).__name__, e)
            with contextlib.suppress(Exception):
                nc._transport.close()  # type: ignore[union-attr]

    def sever(self) -> None:
        """Cut the connection at once, as the death of the process would: nothing buffered
        is sent, no reconnect is tried, every later call fails. For tests that crash a
        worker inside their own process (``SojournEnv.explore_crashes``)."""
        nc = self._nc
        nc.options["allow_reconnect"] = False
        nc._pending = []
        nc._pending_data_size = 0
        writer = getattr(nc._transport, "_io_writer", None)
        if writer is not None:
            writer.transport.abort()

    # --- core NATS -----------------------------------------------------------------------------

    @property
    def max_payload(self) -> int:
        """The largest message the server accepts, headers included (its ``max_payload``)."""
        return int(self._nc.max_payload)

    @property
    def inbox_prefix(self) -> str:
        """What every reply inbox of this connection starts with: ``_INBOX.<user>`` for a
        connection with a user name, ``_INBOX`` without one (``names.inbox_prefix``)."""
        return bytes(self._nc._inbox_prefix).decode()

    def new_inbox(self, owner: str | None = None) -> str:
        """A fresh request/reply inbox subject (``<inbox_prefix>.<unique>``) to subscribe to.

        ``owner``: the inbox of a message this connection sends as another name (a gateway
        speaking for its callers): ``_INBOX.<owner>.<unique>``, where the intake answers a
        message sent as ``owner`` (its permissions must let it subscribe there)."""
        if owner is None or owner == self.user:
            return self._nc.new_inbox()
        return f"{inbox_prefix(owner)}.{uuid.uuid4().hex}"

    async def subscribe(
        self, subject: str, *, cb: OnDelivery | None = None, max_msgs: int = 0, queue: str = ""
    ) -> Subscription:
        """A core subscription to ``subject`` (wildcards allowed): what is published there from
        now on, nothing stored. With ``cb`` each message is handed to it; without, read them
        with ``Subscription.next_msg``. ``max_msgs`` > 0 ends it after that many messages.
        With ``queue``, each message goes to one member of that queue group (a service).

        A subscription the server's permissions refuse is not an error here (the server says
        so later): see ``denied``."""
        if cb is None:
            return Subscription(await self._nc.subscribe(subject, queue, max_msgs=max_msgs))
        on_delivery = cb

        async def deliver(m: Msg) -> None:
            await on_delivery(Delivery(m))

        return Subscription(await self._nc.subscribe(subject, queue, cb=deliver, max_msgs=max_msgs))

    async def flush(self, timeout: float = 10.0) -> None:
        """Wait until the server has processed everything sent so far (subscriptions
        included): a round trip.

        Shielded: a caller cancelled meanwhile (an event stream whose client went away) leaves
        nats-py's own wait to finish, since nats-py resolves its PONG future without looking
        whether it was cancelled, and logs an ``InvalidStateError`` from its read loop when it
        was."""
        await asyncio.shield(self._nc.flush(timeout=timeout))  # type: ignore[arg-type]

    async def publish_core(
        self, subject: str, data: bytes, headers: dict[str, str] | None = None, *, reply: str = ""
    ) -> None:
        """A core NATS publish: no stream is asked to store it, nothing is acknowledged (an
        answer on a reply inbox, a notice for live subscribers)."""
        await self._nc.publish(subject, data, reply=reply, headers=headers)

    async def request(
        self,
        subject: str,
        data: bytes,
        headers: dict[str, str] | None = None,
        *,
        timeout: float = 5.0,
    ) -> Delivery:
        """A core request: publish ``data`` with a fresh reply inbox, return the first answer.

        Raises:
            TimeoutError: no answer within ``timeout``.
            PermissionDenied: this connection may not publish to ``subject``.
            BROKER_ERRORS: nobody subscribes to ``subject`` (nats-py's "no responders").
        """
        try:
            return Delivery(await self._request(subject, data, headers, timeout))
        except NatsTimeoutError:
            raise TimeoutError(f"no answer on {subject} within {timeout}s") from None

    async def present(self, subject: str, timeout: float) -> bool | None:
        """Whether a connection subscribes to ``subject``: ``True`` when a request there is
        answered, ``False`` when the server says at once that nobody subscribes ("no
        responders": the subscriber's connection is gone), ``None`` when it cannot tell within
        ``timeout`` (a subscriber that does not answer, such as a stopped process whose
        connection is still open)."""
        try:
            await self._request(subject, b"", None, timeout)
        except NoRespondersError:
            return False
        except (NatsTimeoutError, TimeoutError):
            return None
        return True

    # --- permissions ---------------------------------------------------------------------------

    def denied(self, subject: str, *, since: float = 0.0) -> bool:
        """Whether the server reported refusing ``subject`` (a publish or a subscription) on
        this connection at or after ``since`` (``time.monotonic()``). nats-py does not fail a
        refused subscription; the server says so after the SUB, before its next PONG."""
        return self._denials.since(subject, since)

    def permission_denied(self, subject: str) -> PermissionDenied:
        """The error for a publish to ``subject`` that the server refused."""
        who = f"user '{self.user}'" if self.user else f"the connection to {self.url}"
        return PermissionDenied(
            f"permission denied: {who} may not publish to {subject} (its role does not allow "
            "it; the roles: docs/operations.md, Security)",
            subject=subject,
        )

    async def _request(
        self, subject: str, data: bytes, headers: dict[str, str] | None, timeout: float
    ) -> Msg:
        """A request (``broker/replies.py``: nats-py's, leaner), except that a permission
        violation reported for ``subject`` while it waits ends it at once with
        ``PermissionDenied`` (the server never answers it)."""
        task = asyncio.current_task()
        assert task is not None
        denied = False
        started = time.monotonic()

        def on_denied() -> None:
            nonlocal denied
            if not denied:
                denied = True
                task.cancel()

        stop = self._denials.watch(subject, on_denied)
        try:
            return await self._replies.request(subject, data, headers, timeout)
        except asyncio.CancelledError:
            if not denied or task.uncancel() > 0:
                raise  # cancelled by someone else (too)
            raise self.permission_denied(subject) from None
        except (NatsTimeoutError, TimeoutError):
            if self._denials.since(subject, started):
                raise self.permission_denied(subject) from None
            raise
        finally:
            stop()

    # --- raw JetStream API -------------------------------------------------------------------

    async def api(
        self, subject: str, payload: dict[str, Any] | None = None, *, timeout: float = 5.0
    ) -> dict[str, Any]:
        """One ``$JS.API`` request; raises ``JetStreamError`` when answered with an error.

        Raises:
            JetStreamError: the API answered with an error.
            PermissionDenied: this connection may not make the request.
            BrokerUnavailable: no answer within ``timeout``.
        """
        data = b"" if payload is None else msgspec.json.encode(payload)
        try:
            msg = await self._request(subject, data, None, timeout)
        except (NatsTimeoutError, TimeoutError) as e:
            raise BrokerUnavailable(f"JetStream did not answer {subject} in {timeout}s") from e
        reply: dict[str, Any] = decode_json(msg.data) if msg.data else {}
        err = reply.get("error")
        if err:
            description = str(err.get("description", err))
            raise JetStreamError(
                f"{subject}: {description}",
                code=int(err.get("code", 0)),
                err_code=int(err.get("err_code", 0)),
                description=description,
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

        The raw floor, for measurements that want nothing on top; sojourn itself uses
        ``try_publish`` (typed) and ``publish``.

        "No responders" (no stream captures the subject right now: a server still recovering
        its streams after a restart) comes back as a 503 error, like the server's own answer.

        Raises:
            PermissionDenied: this connection may not publish to ``subject``.
            TimeoutError: no answer within ``timeout`` (nats-py's, a ``TimeoutError`` too).
        """
        try:
            msg = await self._request(subject, data, headers, timeout)
        except NoRespondersError:
            msg = None
        if msg is None or not msg.data:
            status = ((msg.headers or {}) if msg is not None else {}).get(h.STATUS, "")
            return {
                "error": {
                    "code": int(status or 503),
                    "err_code": 0,
                    "description": "no JetStream stream answered (no responders)",
                }
            }
        ack: dict[str, Any] = decode_json(msg.data)
        return ack

    async def try_publish(
        self,
        subject: str,
        data: bytes,
        headers: dict[str, str] | None = None,
        *,
        timeout: float = 5.0,
    ) -> PublishAck | JetStreamError:
        """A JetStream publish whose refusal is an answer, not an error: the ack, or the
        ``JetStreamError`` the stream answered with (returned, not raised). A broken fence
        (``Nats-Expected-Last-Subject-Sequence``) is ``err_code`` 10071; no stream capturing
        the subject right now (a server still recovering after a restart) is ``code`` 503.

        Raises:
            TimeoutError: no answer within ``timeout``.
            PermissionDenied: this connection may not publish to ``subject``.
        """
        try:
            raw = await self.publish_raw(subject, data, headers, timeout=timeout)
        except NatsTimeoutError as e:
            raise TimeoutError(f"no publish ack for {subject} within {timeout}s") from e
        return _publish_result(subject, raw)

    async def try_publish_batch(
        self,
        messages: Sequence[tuple[str, bytes, dict[str, str]]],
        *,
        timeout: float = 10.0,
    ) -> PublishAck | JetStreamError:
        """An atomic batch publish (JetStream 2.12+, a stream with ``allow_atomic``): every
        message ``(subject, data, headers)`` is stored, in order and contiguously, or none is.
        The ack names the last message (its ``seq``; the others have the preceding ones).

        Every check applies to the batch as a whole at commit: one broken fence
        (``Nats-Expected-Last-Subject-Sequence``, ``err_code`` 10071) or one ``Nats-Msg-Id``
        the stream already holds (``err_code`` 10201) refuses all of it. Under
        ``sync_interval: always`` the batch costs one flush instead of one per message. Every
        message is stored with the batch's headers (``Nats-Batch-Id``, ``Nats-Batch-Sequence``,
        and ``Nats-Batch-Commit`` on the last): about 55 bytes more each.

        Raises:
            ValueError: no messages, or more than ``BATCH_MAX``.
            TimeoutError: no answer to the commit within ``timeout`` (the batch may or may not
                be stored; the server abandons an uncommitted one after 10 s).
            PermissionDenied: this connection may not publish to a subject of the batch.
        """
        if not messages or len(messages) > BATCH_MAX:
            raise ValueError(f"a batch holds 1 to {BATCH_MAX} messages, not {len(messages)}")
        # Stored with every message of the batch: short (12 characters, 72 random bits, unique
        # enough among the batches in flight on one stream).
        batch_id = secrets.token_urlsafe(9)
        last = len(messages) - 1
        for i, (subject, data, headers) in enumerate(messages[:last]):
            marks = {h.BATCH_ID: batch_id, h.BATCH_SEQUENCE: str(i + 1)}
            await self._nc.publish(subject, data, headers={**headers, **marks})
        subject, data, headers = messages[last]
        marks = {h.BATCH_ID: batch_id, h.BATCH_SEQUENCE: str(last + 1), h.BATCH_COMMIT: "1"}
        try:
            raw = await self.publish_raw(subject, data, {**headers, **marks}, timeout=timeout)
        except NatsTimeoutError as e:
            raise TimeoutError(f"no ack for a batch of {len(messages)} within {timeout}s") from e
        return _publish_result(subject, raw)

    async def publish(
        self,
        subject: str,
        data: bytes,
        headers: dict[str, str] | None = None,
        *,
        timeout: float = 5.0,
    ) -> PublishAck:
        """A JetStream publish that must be stored.

        Raises:
            JetStreamError: the stream refused it.
            BrokerUnavailable: no answer within ``timeout``.
            PermissionDenied: this connection may not publish to ``subject``.
        """
        try:
            result = await self.try_publish(subject, data, headers, timeout=timeout)
        except TimeoutError as e:
            raise BrokerUnavailable(f"no publish ack for {subject} within {timeout}s") from e
        if isinstance(result, JetStreamError):
            raise result
        return result

    async def direct_get_last(
        self, stream: str, subject: str, *, timeout: float = 5.0
    ) -> StoredMessage | None:
        """The last message on ``subject`` (direct get), or ``None`` when there is none."""
        return await self._direct.last(stream, subject, timeout)

    async def direct_get_next(
        self, stream: str, subject: str, seq: int, *, timeout: float = 5.0
    ) -> StoredMessage | None:
        """The first message on ``subject`` at or after stream sequence ``seq``."""
        return await self._direct.first_from(stream, subject, seq, timeout)

    async def direct_get_range(
        self,
        stream: str,
        subject: str,
        from_seq: int = 1,
        *,
        page: int = 1000,
        timeout: float = 10.0,
    ) -> list[StoredMessage]:
        """Every message on ``subject`` from ``from_seq`` on, in order (batched direct get)."""
        return await self._direct.every(stream, subject, from_seq, page, timeout)

    async def direct_get_batch(
        self, stream: str, subject: str, seq: int, batch: int, *, timeout: float = 10.0
    ) -> tuple[list[StoredMessage], int]:
        """Up to ``batch`` messages matching ``subject`` (wildcards allowed) from ``seq`` on,
        and how many more match after them; fewer when they pass ``BATCH_MAX_BYTES`` (at least
        one: go on from the last one's sequence)."""
        return await self._direct.batch(stream, subject, seq, batch, timeout)

    async def direct_get_last_of(
        self, stream: str, subjects: list[str], *, limit: int = 1, timeout: float = 10.0
    ) -> list[StoredMessage]:
        """The last message of each subject matching any of ``subjects`` (wildcards allowed),
        at most ``limit`` of them and ``BATCH_MAX_BYTES`` (but at least one), in stream order;
        ``[]`` when none matches."""
        return await self._direct.last_of(stream, subjects, limit, timeout)

    # --- streams and consumers ---------------------------------------------------------------

    async def stream_config(self, name: str) -> dict[str, Any] | None:
        """The stream's current config, or ``None`` when there is no such stream."""
        try:
            info = await self.api(f"$JS.API.STREAM.INFO.{name}")
        except JetStreamError as e:
            if e.err_code != _STREAM_NOT_FOUND:
                raise
            return None
        config: dict[str, Any] = info["config"]
        return config

    async def ensure_stream(
        self, config: dict[str, Any], optional: frozenset[str] = frozenset()
    ) -> Finding:
        """Create the stream if it is missing; never change one that exists: the answer says
        how it differs from ``config`` (``sojourn.broker.drift``; ``optional``: keys the caller
        can do without), and the caller decides what that means (``ensure_topology`` refuses
        to start on a key sojourn relies on).

        Only reads an existing stream, so a user allowed only to read stream info (a client, a
        watchdog) can start against streams an admin or a worker created.

        Raises:
            PermissionDenied: the stream is missing and this user may not create it, or may not
                read its info.
        """
        name = config["name"]
        current = await self.stream_config(name)
        if current is None:
            try:
                await self.api(f"$JS.API.STREAM.CREATE.{name}", config)
                return Finding("stream", name, None, "created")
            except JetStreamError as e:
                if e.err_code != _STREAM_EXISTS:  # created meanwhile, with another config
                    raise
            current = await self.stream_config(name)
            if current is None:  # pragma: no cover - created and deleted at once
                raise JetStreamError(f"stream {name} vanished", code=404, err_code=0)
        return stream_finding(config, current, optional)

    async def consumer_config(self, stream: str, name: str) -> dict[str, Any] | None:
        """The durable consumer's current config, or ``None`` when there is no such consumer
        (or no such stream)."""
        try:
            info = await self.api(f"$JS.API.CONSUMER.INFO.{stream}.{name}")
        except JetStreamError as e:
            if e.err_code not in (_CONSUMER_NOT_FOUND, _STREAM_NOT_FOUND):
                raise
            return None
        config: dict[str, Any] = info["config"]
        return config

    async def ensure_consumer(self, stream: str, config: dict[str, Any]) -> Finding:
        """Create the durable consumer if it is missing; never change one that exists: the
        answer says how it differs from ``config``, as ``ensure_stream``'s does.

        Raises:
            PermissionDenied: this user may not read the consumer's info or create it.
        """
        name = config["durable_name"]
        current = await self.consumer_config(stream, name)
        if current is None:
            try:
                await self.api(
                    f"$JS.API.CONSUMER.CREATE.{stream}.{name}",
                    # "create" fails on an existing consumer with another config instead of
                    # overwriting it (one created meanwhile by another process).
                    {"stream_name": stream, "config": config, "action": "create"},
                )
                return Finding("consumer", stream, name, "created")
            except JetStreamError as e:
                if e.err_code != _CONSUMER_EXISTS:
                    raise
            current = await self.consumer_config(stream, name)
            if current is None:  # pragma: no cover - created and deleted at once
                raise JetStreamError(f"consumer {stream}/{name} vanished", code=404, err_code=0)
        return consumer_finding(stream, config, current)

    async def pull(self, stream: str, consumer: str) -> PullConsumer:
        """A fetcher for the durable ``consumer`` of ``stream`` (``pull.py``: a message is
        handed over as soon as it arrives, never held for a batch to fill)."""

        def denied_since(subject: str, started: float) -> PermissionDenied | None:
            if self._denials.since(subject, started):
                return self.permission_denied(subject)
            return None

        return await open_pull(self._nc, stream, consumer, denied_since)


def header(msg: StoredMessage | Delivery, name: str, default: str = "") -> str:
    """A header of ``msg`` (``default`` when it is not set): ``msg.header(name, default)``."""
    return msg.header(name, default)


def _publish_result(subject: str, raw: dict[str, Any]) -> PublishAck | JetStreamError:
    """A PubAck's JSON as a ``PublishAck``, or the error it carries."""
    err = raw.get("error")
    if err or "seq" not in raw:  # an error answer carries "seq": 0 too
        err = err or {"description": f"no sequence in the answer: {raw}"}
        description = str(err.get("description", err))
        return JetStreamError(
            f"publish to {subject}: {description}",
            code=int(err.get("code", 0)),
            err_code=int(err.get("err_code", 0)),
            description=description,
        )
    return PublishAck(
        stream=str(raw.get("stream", "")),
        seq=int(raw["seq"]),
        duplicate=bool(raw.get("duplicate", False)),
    )
