"""Browser sessions for the console (docs/gateway.md, "Browser sessions"): a sign-in with a
bearer token sets a signed, expiring session cookie, and a per-session CSRF token guards every
state-changing request made with it.

The cookie is ``s1.<token ref>.<session id>.<expiry>.<HMAC-SHA256>``, base64url, signed with
the gateway's session key. It holds no token: ``token ref`` is an HMAC of the token's SHA-256
digest under the same key, looked up among the tokens the gateway has now, so a session's role
and name are its token's, and removing the token (a restart with a new tokens file) ends its
sessions. The gateway keeps no session state: any gateway with the same key (``--session-key``)
accepts the cookie. The CSRF token is an HMAC of the session id: the console reads it from the
sign-in's answer (or ``GET /ui/session``, which only same-origin script can read) and sends it
as ``X-CSRF-Token``; a cross-site page can neither read it nor, with ``SameSite=Strict``, have
the cookie sent at all.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from starlette.requests import Request

from ._auth import BearerTokens, Caller

__all__ = [
    "COOKIE",
    "CSRF_HEADER",
    "SESSION_TTL",
    "Session",
    "SessionKey",
    "Sessions",
    "same_origin",
]

COOKIE: Final = "sojourn_session"
CSRF_HEADER: Final = "x-csrf-token"
SESSION_TTL: Final = 12 * 3600.0
"""Seconds a session lasts by default (``--session-ttl``)."""

_COOKIE_MAX: Final = 256
_COOKIE_FORM: Final = re.compile(
    r"s1\.([A-Za-z0-9_-]{22})\.([A-Za-z0-9_-]{22})\.([0-9]{1,12})\.([A-Za-z0-9_-]{43})"
)
_CSRF_FORM: Final = re.compile(r"[A-Za-z0-9_-]{32}")
_KEY_MIN: Final = 32


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class SessionKey:
    """The secret session cookies are signed with (at least 32 bytes)."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < _KEY_MIN:
            raise ValueError(f"a session key is at least {_KEY_MIN} bytes")
        self._secret = secret

    def __repr__(self) -> str:
        return "SessionKey(...)"

    @classmethod
    def random(cls) -> SessionKey:
        """A key of this process only: its sessions end with it and no other gateway takes
        them."""
        return cls(secrets.token_bytes(32))

    @classmethod
    def load(cls, path: str | Path) -> SessionKey:
        """The file's first line that is not blank or a ``#`` comment, as the key.

        Raises:
            OSError: the file cannot be read.
            ValueError: no key, or one shorter than 32 characters.
        """
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                return cls(line.encode())
        raise ValueError(f"{path}: no session key (one line of at least {_KEY_MIN} characters)")

    def mac(self, purpose: bytes, data: bytes) -> bytes:
        return hmac.new(self._secret, purpose + b"\0" + data, hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in browser: its token's caller, the session id and when it expires."""

    caller: Caller
    sid: str
    expires: int
    csrf: str


class Sessions:
    """Issues and checks session cookies for the gateway's bearer tokens."""

    def __init__(
        self,
        key: SessionKey,
        tokens: BearerTokens,
        *,
        ttl: float = SESSION_TTL,
        secure: bool = False,
    ) -> None:
        if not 60 <= ttl <= 30 * 86400:
            raise ValueError("a session lasts 60 s to 30 days")
        self._key = key
        self.ttl = ttl
        self.secure = secure
        self._tokens = tokens
        self._by_ref = {self._ref(digest): digest for digest in tokens.digests()}

    def _ref(self, digest: bytes) -> str:
        return _b64(self._key.mac(b"token", digest)[:16])

    def _csrf(self, sid: str) -> str:
        return _b64(self._key.mac(b"csrf", sid.encode())[:24])

    def sign_in(self, token: str, now: float) -> tuple[str, Session] | None:
        """The cookie value and session for a bearer token; ``None`` for no token of these."""
        digest = self._tokens.digest_of(token)
        caller = None if digest is None else self._tokens.by_digest(digest)
        if digest is None or caller is None:
            return None
        ref = self._ref(digest)
        sid = _b64(secrets.token_bytes(16))
        expires = int(now + self.ttl)
        body = f"s1.{ref}.{sid}.{expires}"
        mac = _b64(self._key.mac(b"cookie", body.encode()))
        return f"{body}.{mac}", Session(caller, sid, expires, self._csrf(sid))

    def session_of(self, cookie: str | None, now: float) -> Session | None:
        """The session a cookie value stands for; ``None`` for a malformed, forged or expired
        cookie, or one whose token the gateway no longer has."""
        if cookie is None or len(cookie) > _COOKIE_MAX:
            return None
        m = _COOKIE_FORM.fullmatch(cookie)
        if m is None:
            return None
        ref, sid, expires_text, mac = m.groups()
        body = cookie[: -len(mac) - 1]
        if not hmac.compare_digest(mac, _b64(self._key.mac(b"cookie", body.encode()))):
            return None
        expires = int(expires_text)
        if expires <= now:
            return None
        digest = self._by_ref.get(ref)
        caller = None if digest is None else self._tokens.by_digest(digest)
        if caller is None:
            return None
        return Session(caller, sid, expires, self._csrf(sid))

    @staticmethod
    def csrf_ok(session: Session, given: str | None) -> bool:
        """Whether ``given`` (the ``X-CSRF-Token`` header) is the session's CSRF token."""
        if given is None or not _CSRF_FORM.fullmatch(given):
            return False
        return hmac.compare_digest(given, session.csrf)

    def set_cookie(self, value: str, max_age: int) -> str:
        """A ``Set-Cookie`` header value: ``HttpOnly; SameSite=Strict; Path=/`` (and
        ``Secure`` when the gateway is told it is served over TLS)."""
        secure = "; Secure" if self.secure else ""
        return f"{COOKIE}={value}; Max-Age={max_age}; Path=/; HttpOnly; SameSite=Strict{secure}"

    def clear_cookie(self) -> str:
        return self.set_cookie("", 0)


def same_origin(request: Request, origin: str) -> bool:
    """Whether an ``Origin`` header names the host the request was sent to."""
    host = request.headers.get("host", "")
    _, _, rest = origin.partition("://")
    return bool(host) and rest == host
