"""Console session cookies (pure): signed, expiring, bound to the token they were made from,
holding no token; CSRF tokens per session."""

from __future__ import annotations

import pytest

from sojourn.actors.gateway import BearerTokens, Caller
from sojourn.actors.gateway._sessions import COOKIE, SessionKey, Sessions

ADMIN = "admin-token-for-sessions-0123"
CLIENT = "client-token-for-sessions-0123"
TOKENS = BearerTokens({ADMIN: Caller("admin", "ada"), CLIENT: Caller("client", "bob")})


def sessions(key: SessionKey | None = None, tokens: BearerTokens = TOKENS) -> Sessions:
    return Sessions(key or SessionKey(b"k" * 32), tokens, ttl=3600)


def test_a_session_is_its_tokens_caller_and_holds_no_token() -> None:
    s = sessions()
    issued = s.sign_in(CLIENT, 1000.0)
    assert issued is not None
    cookie, session = issued
    assert CLIENT not in cookie and ADMIN not in cookie
    assert session.caller == Caller("client", "bob")
    again = s.session_of(cookie, 1001.0)
    assert again is not None and again.caller.role == "client" and again.csrf == session.csrf
    assert s.sign_in("not-a-token-of-these-000", 1000.0) is None
    assert s.sign_in("short", 1000.0) is None


def test_a_forged_expired_or_foreign_cookie_is_no_session() -> None:
    s = sessions()
    issued = s.sign_in(CLIENT, 1000.0)
    assert issued is not None
    cookie, _ = issued
    assert s.session_of(cookie, 1000.0 + 3601) is None  # expired
    # Another key (another deployment, a rotated key) does not accept it.
    assert sessions(SessionKey(b"x" * 32)).session_of(cookie, 1001.0) is None
    # Any byte changed: the role cannot be raised by editing the cookie.
    for i in range(len(cookie)):
        flipped = cookie[:i] + ("A" if cookie[i] != "A" else "B") + cookie[i + 1 :]
        assert s.session_of(flipped, 1001.0) is None, i
    # A longer expiry cannot be written in.
    head, ref, sid, expires, mac = cookie.split(".")
    assert s.session_of(f"{head}.{ref}.{sid}.{int(expires) + 10**6}.{mac}", 1001.0) is None
    for garbage in ("", "s1", "x" * 10_000, "s1....", cookie + ".", None):
        assert s.session_of(garbage, 1001.0) is None


def test_a_token_removed_from_the_file_ends_its_sessions() -> None:
    key = SessionKey(b"k" * 32)
    issued = sessions(key).sign_in(ADMIN, 1000.0)
    assert issued is not None
    without = BearerTokens({CLIENT: Caller("client", "bob")})
    assert sessions(key, without).session_of(issued[0], 1001.0) is None


def test_the_csrf_token_is_the_sessions_own() -> None:
    s = sessions()
    a, b = s.sign_in(ADMIN, 1000.0), s.sign_in(ADMIN, 1000.0)
    assert a is not None and b is not None
    assert a[1].csrf != b[1].csrf  # one per session
    assert Sessions.csrf_ok(a[1], a[1].csrf)
    assert not Sessions.csrf_ok(a[1], b[1].csrf)
    assert not Sessions.csrf_ok(a[1], None)
    assert not Sessions.csrf_ok(a[1], "")
    assert not Sessions.csrf_ok(a[1], a[1].csrf + "x")


def test_the_cookie_is_http_only_strict_and_scoped_to_the_site() -> None:
    header = sessions().set_cookie("v", 60)
    assert header.startswith(f"{COOKIE}=v;")
    assert "HttpOnly" in header and "SameSite=Strict" in header and "Path=/" in header
    assert "Secure" not in header
    secure = Sessions(SessionKey(b"k" * 32), TOKENS, secure=True).set_cookie("v", 60)
    assert secure.endswith("; Secure")


def test_a_session_key_is_long_enough() -> None:
    with pytest.raises(ValueError):
        SessionKey(b"short")
    assert "k" not in repr(SessionKey(b"k" * 32)).replace("SessionKey", "")
