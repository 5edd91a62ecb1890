"""Callback tokens: a run hands an external system one capability, delivering one signal.

A run that waits days for an e-signature service or a payment provider gives it a token
(``ctx.callback``); the HTTP gateway checks the token and delivers the POST body as the signal
the token names, to the run it names, under the signal id it implies, so the intake records
it once however often the system retries. The token can do nothing else: no other run, no
other signal, not after it expires.

A token is ``sjc1.<kid>.<claims>.<mac>``: the claims are base64url (no padding) JSON, the MAC
an HMAC-SHA256 of ``sjc1.<kid>.<claims>`` under the key ``kid`` names, base64url too. It is
signed, not encrypted: the claims (run id, signal name, expiry) are readable by whoever holds
it, which is the system it was handed to.

Verification does the cheap, total checks first (length, then a strict pattern) and decodes
nothing before the MAC matches: a forger's bytes never reach the JSON decoder. Keys rotate by
keyring: the first key signs, every key verifies (put the new key first, drop the old one once
its last token expired).

Pure: no I/O except the explicit loaders ``CallbackKeys.load`` and ``CallbackKeys.from_env``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import os
import re
import secrets
from collections.abc import Mapping, Sequence

import msgspec

from sojourn.schemas.codec import encode, from_raw
from sojourn.schemas.errors import CallbackTokenExpired, CallbackTokenInvalid, InvalidName
from sojourn.schemas.names import RESERVED_SIGNAL_PREFIX, validate_signal_name, validate_token

__all__ = [
    "CALLBACK_KEYS_ENV",
    "EXPIRES_AT_MAX",
    "KEYS_MAX",
    "KEY_FILE_MAX",
    "SECRET_MIN",
    "TOKEN_MAX",
    "TOKEN_VERSION",
    "TTL_MAX",
    "CallbackClaims",
    "CallbackKeys",
    "check_callback_signal",
    "check_ttl",
    "generate_key_file_text",
]

TOKEN_VERSION = "sjc1"
"""The first part of every token: a later format gets another word, never a reinterpretation."""

TOKEN_MAX = 1024
"""Characters of a token, at most. The longest a keyring can issue (a 128-character run id, a
256-character signal name, a 32-character key id) is about 720."""

TTL_MAX = 366 * 24 * 3600
"""The longest a token may live, in seconds: a year and a day."""

SECRET_MIN = 32
"""Bytes of a key's secret, at least (HMAC-SHA256's own output size)."""

KEYS_MAX = 8
"""Keys in a ring, at most: rotation needs two; more than a handful is a mistake."""

KEY_FILE_MAX = 64 * 1024
"""Bytes of a key file, at most."""

CALLBACK_KEYS_ENV = "SOJOURN_CALLBACK_KEYS"
"""The environment variable naming the key file a worker (and the gateway) reads."""

EXPIRES_AT_MAX = 2**53 - 1
"""The latest ``expires_at`` a token may name: the largest integer every JSON reader holds
exactly (a claim beyond it is no time a genuine token could name)."""

_KID = re.compile(r"[A-Za-z0-9_-]{1,32}")
_NONCE = re.compile(r"[0-9a-f]{32}")
_MAC_CHARS = 43
"""base64url of the 32 bytes of an HMAC-SHA256, without padding."""
_TOKEN = re.compile(
    rf"{TOKEN_VERSION}\.([A-Za-z0-9_-]{{1,32}})\.([A-Za-z0-9_-]{{1,{TOKEN_MAX}}})"
    rf"\.([A-Za-z0-9_-]{{{_MAC_CHARS}}})"
)

_INVALID = "the callback token is not valid"
"""The one message of every refusal but expiry: which check failed is the forger's business
only, and a reason would help them (and may echo what they sent)."""


class CallbackClaims(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a token lets its holder do: deliver one ``signal`` to ``run_id`` before
    ``expires_at`` (unix seconds), once (``signal_id``)."""

    run_id: str
    signal: str
    expires_at: int
    nonce: str
    """32 hex characters, random at issue: two tokens for the same run and signal are two
    capabilities, each delivering its own signal once."""

    @property
    def signal_id(self) -> str:
        """The id to send the signal under: the intake records a signal id once, forever, so
        a callback the external system repeats is one signal."""
        return f"callback:{self.nonce}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: bytes, signed: str) -> str:
    return _b64(hmac.new(secret, signed.encode("ascii"), hashlib.sha256).digest())


def check_ttl(ttl_seconds: float) -> float:
    """Return ``ttl_seconds`` if a token may live that long (more than 0, at most
    ``TTL_MAX``), else raise ``ValueError``."""
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float):
        raise ValueError("a callback token's ttl is a number of seconds")
    if not 0 < ttl_seconds <= TTL_MAX:  # also refuses NaN
        raise ValueError(
            f"a callback token's ttl must be more than 0 and at most 366 days ({TTL_MAX} s), "
            f"not {ttl_seconds!r}"
        )
    return float(ttl_seconds)


def check_callback_signal(signal: str) -> str:
    """Return ``signal`` if a callback may deliver it, else raise ``InvalidName``: a valid
    signal name that is not reserved (the intake refuses a ``sojourn-`` name on a signal
    subject, so a token for one could never deliver)."""
    validate_signal_name(signal)
    if signal.startswith(RESERVED_SIGNAL_PREFIX):
        raise InvalidName(f"signal names starting with {RESERVED_SIGNAL_PREFIX!r} are reserved")
    return signal


class CallbackKeys:
    """A keyring of ``(kid, secret)``: the first key signs, every key verifies.

    Raises (constructing):
        ValueError: no keys or more than ``KEYS_MAX``, a key id that is not 1-32 characters of
            ``A-Z a-z 0-9 _ -``, a secret shorter than ``SECRET_MIN`` bytes, a key id twice.
            The message names the key by its place, never by its secret.
    """

    __slots__ = ("_secrets", "_signing")

    def __init__(self, keys: Sequence[tuple[str, bytes]]) -> None:
        entries = [(f"key {n}", kid, secret) for n, (kid, secret) in enumerate(keys, 1)]
        self._secrets = _checked(entries)
        self._signing = next(iter(self._secrets))

    @property
    def signing_kid(self) -> str:
        """The id of the key new tokens are signed with."""
        return self._signing

    @property
    def kids(self) -> tuple[str, ...]:
        """Every key id, the signing one first."""
        return tuple(self._secrets)

    def __repr__(self) -> str:
        return f"CallbackKeys(kids={self.kids!r})"

    # --- loaders ----------------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str) -> CallbackKeys:
        """A keyring from the text of a key file: one ``KID SECRET`` per line (the first
        line's key signs), ``#`` comment lines and blank lines allowed. ``SECRET`` is used as
        its UTF-8 bytes; it must be at least ``SECRET_MIN`` characters.

        Raises:
            ValueError: what is wrong, and on which line (never the line's text: it may hold
                a secret).
        """
        if len(text) > KEY_FILE_MAX:
            raise ValueError(f"a callback key file is at most {KEY_FILE_MAX} characters")
        entries: list[tuple[str, str, bytes]] = []
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            where = f"line {number}"
            if len(fields) != 2:
                raise ValueError(
                    f"{where}: expected `KID SECRET` (two fields separated by spaces), "
                    f"found {len(fields)} fields"
                )
            kid, secret = fields
            if len(secret) < SECRET_MIN:
                raise ValueError(f"{where}: the secret must be at least {SECRET_MIN} characters")
            entries.append((where, kid, secret.encode("utf-8")))
        if not entries:
            raise ValueError("the callback key file holds no keys (expected `KID SECRET` lines)")
        keys = cls.__new__(cls)
        keys._secrets = _checked(entries)
        keys._signing = next(iter(keys._secrets))
        return keys

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CallbackKeys:
        """The keyring of the key file at ``path`` (see ``parse``).

        Raises:
            ValueError: the file is too large, not UTF-8, or not a key file (the message
                starts with the path).
            OSError: the file cannot be read.
        """
        where = os.fspath(path)
        with open(where, "rb") as f:
            data = f.read(KEY_FILE_MAX + 1)
        if len(data) > KEY_FILE_MAX:
            raise ValueError(f"{where}: a callback key file is at most {KEY_FILE_MAX} bytes")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data[: e.start].count(b"\n") + 1
            raise ValueError(f"{where}: line {line}: not UTF-8 text") from None
        try:
            return cls.parse(text)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None

    @staticmethod
    def generate_line(kid: str = "k1") -> str:
        """A key file's line (``KID SECRET``, newline included) for a fresh random key.

        Raises:
            ValueError: ``kid`` is not 1-32 characters of ``A-Z a-z 0-9 _ -``.
        """
        return generate_key_file_text(kid)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> CallbackKeys | None:
        """The keyring of the file ``$SOJOURN_CALLBACK_KEYS`` names; ``None`` when it is unset
        or empty.

        Raises:
            ValueError, OSError: as ``load``.
        """
        path = environ.get(CALLBACK_KEYS_ENV, "")
        return cls.load(path) if path else None

    # --- tokens -----------------------------------------------------------------------------

    def issue(
        self,
        run_id: str,
        signal: str,
        ttl_seconds: float,
        now: float,
        nonce: str | None = None,
    ) -> str:
        """A token delivering ``signal`` to ``run_id`` until at least ``now + ttl_seconds``
        (``expires_at`` is rounded up to a whole second), signed with the first key.
        ``nonce``: 32 lowercase hex characters (default: fresh random ones).

        Raises:
            InvalidName: ``run_id`` is not a name token, ``signal`` not a signal name or a
                reserved (``sojourn-``) one.
            ValueError: ``ttl_seconds`` out of bounds (``check_ttl``), ``now`` not a unix
                time (negative, NaN, infinite), or ``nonce`` not 32 hex characters.
        """
        validate_token(run_id, "run_id")
        check_callback_signal(signal)
        ttl = check_ttl(ttl_seconds)
        if (
            isinstance(now, bool)
            or not isinstance(now, int | float)
            or not 0 <= now < EXPIRES_AT_MAX - TTL_MAX  # also refuses NaN and infinities
        ):
            raise ValueError("now must be a unix time in seconds, 0 or later (finite)")
        if nonce is None:
            nonce = secrets.token_hex(16)
        elif not isinstance(nonce, str) or not _NONCE.fullmatch(nonce):
            raise ValueError("a callback nonce is 32 lowercase hex characters")
        claims = CallbackClaims(
            run_id=run_id, signal=signal, expires_at=math.ceil(now + ttl), nonce=nonce
        )
        signed = f"{TOKEN_VERSION}.{self._signing}.{_b64(encode(claims))}"
        token = f"{signed}.{_mac(self._secrets[self._signing], signed)}"
        assert len(token) <= TOKEN_MAX, "the bounds on names keep tokens short"
        return token

    def verify(self, token: str, now: float) -> CallbackClaims:
        """The claims of ``token`` if one of this ring's keys signed it and it has not expired
        at ``now`` (``now >= expires_at`` is expired).

        Raises:
            CallbackTokenInvalid: anything else: not a string, too long, not the token
                pattern, an unknown key id, a MAC that does not match, claims that do not
                decode or name an invalid run id or signal. One message for all of them.
            CallbackTokenExpired: a genuine token past its expiry.
        """
        if not isinstance(token, str) or len(token) > TOKEN_MAX:
            raise CallbackTokenInvalid(_INVALID)
        matched = _TOKEN.fullmatch(token)
        if matched is None:
            raise CallbackTokenInvalid(_INVALID)
        kid, payload, mac = matched.groups()
        secret = self._secrets.get(kid)
        if secret is None:
            raise CallbackTokenInvalid(_INVALID)
        # The MAC is compared as text: base64 has several spellings of the same last byte,
        # and only the one we wrote is the token.
        expected = _mac(secret, f"{TOKEN_VERSION}.{kid}.{payload}")
        if not hmac.compare_digest(expected.encode("ascii"), mac.encode("ascii")):
            raise CallbackTokenInvalid(_INVALID)
        claims = _decode_claims(payload)
        if not now < claims.expires_at:
            raise CallbackTokenExpired("the callback token has expired")
        return claims


def _decode_claims(payload: str) -> CallbackClaims:
    """The claims of a payload whose MAC matched: ours, unless a key leaked, and checked all
    the same (a key shared with an older or buggy issuer must not widen what a token can do)."""
    try:
        claims: CallbackClaims = from_raw(_unb64(payload), CallbackClaims)
    except (binascii.Error, ValueError, msgspec.MsgspecError):
        raise CallbackTokenInvalid(_INVALID) from None
    try:
        validate_token(claims.run_id, "run_id")
        check_callback_signal(claims.signal)
    except InvalidName:
        raise CallbackTokenInvalid(_INVALID) from None
    if not _NONCE.fullmatch(claims.nonce) or not 0 < claims.expires_at <= EXPIRES_AT_MAX:
        raise CallbackTokenInvalid(_INVALID)
    return claims


def _checked(entries: Sequence[tuple[str, str, bytes]]) -> dict[str, bytes]:
    """The ring's ``kid -> secret`` in signing order, from ``(where, kid, secret)`` entries;
    a ``ValueError`` naming ``where`` for the first one that cannot be used."""
    if not 1 <= len(entries) <= KEYS_MAX:
        raise ValueError(f"a callback keyring holds 1 to {KEYS_MAX} keys, not {len(entries)}")
    ring: dict[str, bytes] = {}
    first: dict[str, str] = {}
    for where, kid, secret in entries:
        if not isinstance(kid, str) or not _KID.fullmatch(kid):
            raise ValueError(f"{where}: a key id is 1-32 characters from A-Z a-z 0-9 _ -")
        if not isinstance(secret, bytes) or len(secret) < SECRET_MIN:
            raise ValueError(f"{where}: the secret must be at least {SECRET_MIN} bytes")
        if kid in ring:
            raise ValueError(f"{where}: the key id is already used by {first[kid]}")
        ring[kid] = secret
        first[kid] = where
    return ring


def generate_key_file_text(kid: str = "k1") -> str:
    """A key file's line for a fresh random key (``sojourn dev``, the docs): ``KID SECRET``.

    Raises:
        ValueError: ``kid`` is not 1-32 characters of ``A-Z a-z 0-9 _ -``.
    """
    if not isinstance(kid, str) or not _KID.fullmatch(kid):
        raise ValueError("a key id is 1-32 characters from A-Z a-z 0-9 _ -")
    return f"{kid} {secrets.token_urlsafe(32)}\n"
