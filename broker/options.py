"""How to reach and authenticate to a NATS server: ``ConnectOptions`` (URL with optional
``user:password@``, a creds file, TLS files), which every command, ``Client``, ``Worker`` and
``Watchdog`` share, and the URL helpers behind it (the environment's defaults, a cluster's list
of URLs, passwords hidden for logs, the user name a connection publishes under).

Pure but for reading the environment and the files named: nothing here connects.
"""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from sojourn.schemas.errors import SojournError

__all__ = [
    "DEFAULT_URL",
    "ENV_CREDS",
    "ENV_TLS_CA",
    "ENV_TLS_CERT",
    "ENV_TLS_KEY",
    "ENV_URL",
    "ConnectOptions",
    "CredentialsError",
    "creds_user",
    "redact_url",
    "resolve_url",
    "server_urls",
    "url_user",
]

DEFAULT_URL = "nats://127.0.0.1:4222"

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


def options_of(target: str | ConnectOptions | None) -> ConnectOptions:
    """``target`` as ``ConnectOptions``: a URL (or ``None``) is the options with that URL."""
    return target if isinstance(target, ConnectOptions) else ConnectOptions(url=target)
