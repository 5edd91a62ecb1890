"""Webhook signatures: is this request really from the system the route trusts, and recent?

An external system (Stripe, GitHub, a Standard Webhooks sender, anything that can compute an
HMAC) calls ``POST /v1/webhooks/{route}/{token}``. Before any of its body reaches a run, the
gateway checks it here against the route's shared secret: every header is bounded and matched
in full before a single HMAC is computed, and a signature whose timestamp is outside the
route's tolerance is refused, so a captured request cannot be replayed later.

Pure: ``verify`` and ``sign`` take the clock as an argument and do no I/O. Only
``parse_route`` reads the environment or a file, and only where the route's text says so
(``env:VAR``, ``file:PATH``), so that secrets need not sit on a command line.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import os
import re
import typing
from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec

from sojourn.schemas.errors import InvalidName, WebhookRejectCode, WebhookRejected
from sojourn.schemas.names import validate_signal_name, validate_token
from sojourn.schemas.wire import RESERVED_SIGNAL_PREFIX

from ._routing import parse_field_path

__all__ = [
    "DEFAULT_TOLERANCE",
    "MAX_HEADER_CHARS",
    "MAX_SIGNATURES",
    "MAX_TOLERANCE",
    "MIN_SECRET_BYTES",
    "SCHEMES",
    "Scheme",
    "WebhookRoute",
    "parse_route",
    "sign",
    "verify",
]

Scheme = Literal["stripe", "github", "standard", "hmac-sha256"]
"""How a sender signs: Stripe's ``Stripe-Signature``, GitHub's ``X-Hub-Signature-256``, the
Standard Webhooks ``webhook-*`` headers, or a generic ``X-Signature`` + ``X-Timestamp``."""

SCHEMES: tuple[Scheme, ...] = typing.get_args(Scheme)

DEFAULT_TOLERANCE: Final = 300.0
"""Seconds a signed timestamp may differ from the gateway's clock (Stripe's and the Standard
Webhooks libraries' default)."""

MAX_TOLERANCE: Final = 86_400.0
"""A day: a wider window is no longer replay protection."""

MAX_HEADER_CHARS: Final = 4096
"""A signature or timestamp header longer than this is refused before it is parsed."""

MAX_SIGNATURES: Final = 16
"""At most this many items in a signature list (Stripe's ``t=``/``v1=`` items, Standard
Webhooks' space-separated signatures): a sender rotating keys sends two or three."""

MIN_SECRET_BYTES: Final = 16
"""A shorter key is guessable offline from one captured request."""

MAX_SECRET_BYTES: Final = 1024
MAX_ROUTE_CHARS: Final = 16_384
MAX_SECRETS: Final = 2
"""Two while rotating: the old and the new secret both verify until the sender has switched."""

_ROUTE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_TOLERANCE = re.compile(r"tolerance=([0-9]{1,6}(?:\.[0-9]{1,6})?)")
_UNIX_SECONDS = re.compile(r"[0-9]{1,12}")
_HEX_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_PREFIXED_HEX_SHA256 = re.compile(r"sha256=([0-9a-fA-F]{64})")
_BASE64_SHA256 = re.compile(r"[A-Za-z0-9+/]{43}=")
# A Stripe-Signature item: a short key, then printable ASCII without a comma.
_STRIPE_ITEM = re.compile(r"([a-z][a-z0-9_]{0,15})=([\x21-\x2b\x2d-\x7e]{0,512})")
# A Standard Webhooks signature: a version (v1, v1a, ...), a comma, printable ASCII.
_STANDARD_ITEM = re.compile(r"(v[0-9a-z]{1,8}),([\x21-\x7e]{1,512})")
# webhook-id is signed content and may become an idempotency key: printable ASCII, bounded.
_WEBHOOK_ID = re.compile(r"[\x21-\x7e]{1,256}")
_WHSEC = b"whsec_"
_ID_PREFIX = re.compile(r"[A-Za-z0-9_-]{0,64}")
_TARGET_OPTIONS: Final = frozenset({"start", "signal", "id", "prefix"})

_MISSING: Final = "missing_signature"
_INVALID: Final = "invalid_signature"
_STALE: Final = "stale_webhook"


class WebhookRoute(msgspec.Struct, frozen=True):
    """One webhook route: its name in the URL, how its sender signs, and the shared secrets.

    ``secrets`` are the secrets as the sender shows them (for ``standard``, ``whsec_<base64>``
    is decoded to its key; any other value is the key as it is). The first one signs
    (``sign``); each one verifies, so a secret can be rotated without dropping webhooks.
    ``tolerance`` is how far (seconds, either way) a signed timestamp may be from the
    gateway's clock; ``github`` signs no timestamp, so it does not apply there.

    The repr never shows the secrets (routes get logged); encoding a route with msgspec
    would, so do not.
    """

    name: str
    scheme: Scheme
    secrets: tuple[bytes, ...]
    tolerance: float = DEFAULT_TOLERANCE
    start: str | None = None
    """A routed route that starts a run of this agent (``POST /v1/webhooks/{name}``): the
    body is the input, the run id is the body's ``id_field``, so a provider's retries are
    one run."""
    signal: str | None = None
    """A routed route that delivers the body as this signal to the run ``id_field`` names."""
    id_field: str | None = None
    """Where a routed route's body names the run: a JSON pointer or a dotted path."""
    id_prefix: str = ""
    """Put before the field's value to make the run id (``order-`` + ``4711``)."""

    @property
    def routed(self) -> bool:
        """Whether the route starts or signals runs by a body field (no callback token)."""
        return self.start is not None or self.signal is not None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or _ROUTE_NAME.fullmatch(self.name) is None:
            raise ValueError(
                "a webhook route name is 1-64 characters of a-z, 0-9, '_' and '-', "
                "starting with a letter or a digit"
            )
        if self.scheme not in SCHEMES:
            raise ValueError(f"the scheme must be one of {', '.join(SCHEMES)}")
        if not isinstance(self.secrets, tuple) or not 1 <= len(self.secrets) <= MAX_SECRETS:
            raise ValueError("a webhook route has one secret, or two while rotating")
        for number, secret in enumerate(self.secrets, 1):
            if not isinstance(secret, bytes):
                raise ValueError(f"secret {number} is not bytes")
            if len(secret) > MAX_SECRET_BYTES:
                raise ValueError(f"secret {number} is longer than {MAX_SECRET_BYTES} bytes")
            if len(_signing_key(self.scheme, secret, number)) < MIN_SECRET_BYTES:
                raise ValueError(f"secret {number} is shorter than {MIN_SECRET_BYTES} bytes")
        tolerance = self.tolerance
        if (
            isinstance(tolerance, bool)
            or not isinstance(tolerance, int | float)
            or not 0 < tolerance <= MAX_TOLERANCE
        ):
            raise ValueError(f"the tolerance must be more than 0 and at most {MAX_TOLERANCE:g} s")
        self._check_target()

    def _check_target(self) -> None:
        if self.start is not None and self.signal is not None:
            raise ValueError("a routed webhook either starts a run or signals one, not both")
        if not self.routed:
            if self.id_field is not None or self.id_prefix:
                raise ValueError("id= and prefix= need start=AGENT or signal=NAME")
            return
        try:
            if self.start is not None:
                validate_token(self.start, "agent name")
            if self.signal is not None:
                validate_signal_name(self.signal)
                if self.signal.startswith(RESERVED_SIGNAL_PREFIX):
                    raise ValueError(
                        f"signal names starting with {RESERVED_SIGNAL_PREFIX!r} are reserved"
                    )
        except InvalidName as e:
            raise ValueError(e.message) from None
        if self.id_field is None:
            raise ValueError("a routed webhook needs id=PATH: the body field naming the run")
        parse_field_path(self.id_field)
        if _ID_PREFIX.fullmatch(self.id_prefix) is None:
            raise ValueError("prefix= is at most 64 characters of A-Z a-z 0-9 _ -")

    def __repr__(self) -> str:
        target = ""
        if self.routed:
            what = f"start={self.start!r}" if self.start else f"signal={self.signal!r}"
            target = f", {what}, id_field={self.id_field!r}, id_prefix={self.id_prefix!r}"
        return (
            f"WebhookRoute({self.name!r}, scheme={self.scheme!r}, "
            f"secrets=<{len(self.secrets)} hidden>, tolerance={self.tolerance!r}{target})"
        )

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        # msgspec's own would list every field, secrets included.
        shown: list[tuple[str, Any]] = [
            ("name", self.name),
            ("scheme", self.scheme),
            ("tolerance", self.tolerance),
        ]
        for key in ("start", "signal", "id_field", "id_prefix"):
            if getattr(self, key):
                shown.append((key, getattr(self, key)))
        return shown


def _signing_key(scheme: Scheme, secret: bytes, number: int = 1) -> bytes:
    """The HMAC key a secret stands for: only Standard Webhooks encodes its key (``whsec_``
    and base64); Stripe's ``whsec_...`` secrets are keys as they are."""
    if scheme != "standard" or not secret.startswith(_WHSEC):
        return secret
    try:
        return base64.b64decode(secret[len(_WHSEC) :], validate=True)
    except binascii.Error:
        raise ValueError(f"secret {number} starts with whsec_ but is not base64 after it") from None


def _mac(key: bytes, message: bytes) -> bytes:
    """The one place an HMAC is computed (tests check nothing reaches it early)."""
    return hmac.digest(key, message, hashlib.sha256)


# --- verifying ------------------------------------------------------------------------------


def verify(route: WebhookRoute, headers: Mapping[str, str], body: bytes, now: float) -> None:
    """Accept the request as ``route``'s sender's, or raise ``WebhookRejected``.

    ``headers`` may be any mapping of the request's headers, names in any case (a multi-valued
    one such as Starlette's ``Headers`` is read through ``items()``, so a signature header
    given twice is refused rather than silently one of the two). ``now`` is the gateway's
    clock, unix seconds.

    Raises:
        WebhookRejected: ``missing_signature`` when a header the scheme needs is absent or
            empty; ``invalid_signature`` when a header is malformed or too long, or no
            signature matches any of the route's secrets; ``stale_webhook`` when the signed
            timestamp is malformed or further than ``route.tolerance`` from ``now``.
    """
    if route.scheme == "stripe":
        _verify_stripe(route, headers, body, now)
    elif route.scheme == "github":
        _verify_github(route, headers, body)
    elif route.scheme == "standard":
        _verify_standard(route, headers, body, now)
    else:
        _verify_generic(route, headers, body, now)


def _verify_stripe(
    route: WebhookRoute, headers: Mapping[str, str], body: bytes, now: float
) -> None:
    (value,) = _collect(headers, {"stripe-signature": _INVALID}).values()
    items = value.split(",", MAX_SIGNATURES)
    if len(items) > MAX_SIGNATURES:
        raise WebhookRejected(_INVALID, f"Stripe-Signature has more than {MAX_SIGNATURES} items")
    timestamp: str | None = None
    candidates: list[bytes] = []
    for item in items:
        match = _STRIPE_ITEM.fullmatch(item.strip(" \t"))
        if match is None:
            raise WebhookRejected(_INVALID, "Stripe-Signature is not a list of key=value items")
        key, text = match.groups()
        if key == "t":
            if timestamp is not None:
                raise WebhookRejected(_INVALID, "Stripe-Signature has more than one t=")
            timestamp = text
        elif key == "v1":
            if _HEX_SHA256.fullmatch(text) is None:
                raise WebhookRejected(_INVALID, "a v1 signature is not 64 hex digits")
            candidates.append(bytes.fromhex(text))
        # v0 (test mode's) and unknown schemes are ignored, as Stripe's own libraries do.
    if timestamp is None:
        raise WebhookRejected(_INVALID, "Stripe-Signature has no t= timestamp")
    if not candidates:
        raise WebhookRejected(_INVALID, "Stripe-Signature has no v1 signature")
    _check_timestamp(timestamp, now, route.tolerance)
    _match(route, candidates, timestamp.encode() + b"." + body)


def _verify_github(route: WebhookRoute, headers: Mapping[str, str], body: bytes) -> None:
    (value,) = _collect(headers, {"x-hub-signature-256": _INVALID}).values()
    match = _PREFIXED_HEX_SHA256.fullmatch(value)
    if match is None:
        raise WebhookRejected(_INVALID, "X-Hub-Signature-256 is not sha256=<64 hex digits>")
    _match(route, [bytes.fromhex(match[1])], body)


def _verify_standard(
    route: WebhookRoute, headers: Mapping[str, str], body: bytes, now: float
) -> None:
    found = _collect(
        headers,
        {"webhook-id": _INVALID, "webhook-timestamp": _STALE, "webhook-signature": _INVALID},
    )
    webhook_id = found["webhook-id"]
    if _WEBHOOK_ID.fullmatch(webhook_id) is None:
        raise WebhookRejected(_INVALID, "webhook-id is not 1-256 printable ASCII characters")
    items = found["webhook-signature"].split(" ", MAX_SIGNATURES)
    if len(items) > MAX_SIGNATURES:
        raise WebhookRejected(_INVALID, f"webhook-signature has more than {MAX_SIGNATURES} items")
    candidates: list[bytes] = []
    for item in items:
        match = _STANDARD_ITEM.fullmatch(item)
        if match is None:
            raise WebhookRejected(
                _INVALID, "webhook-signature is not a space-separated list of v1,<base64>"
            )
        version, text = match.groups()
        if version == "v1":
            if _BASE64_SHA256.fullmatch(text) is None:
                raise WebhookRejected(_INVALID, "a v1 signature is not 32 bytes of base64")
            candidates.append(base64.b64decode(text))
        # Other versions (v1a: asymmetric) are not ours to check, as the spec allows.
    if not candidates:
        raise WebhookRejected(_INVALID, "webhook-signature has no v1 signature")
    timestamp = found["webhook-timestamp"]
    _check_timestamp(timestamp, now, route.tolerance)
    _match(route, candidates, f"{webhook_id}.{timestamp}.".encode() + body)


def _verify_generic(
    route: WebhookRoute, headers: Mapping[str, str], body: bytes, now: float
) -> None:
    found = _collect(headers, {"x-signature": _INVALID, "x-timestamp": _STALE})
    match = _PREFIXED_HEX_SHA256.fullmatch(found["x-signature"])
    if match is None:
        raise WebhookRejected(_INVALID, "X-Signature is not sha256=<64 hex digits>")
    timestamp = found["x-timestamp"]
    _check_timestamp(timestamp, now, route.tolerance)
    _match(route, [bytes.fromhex(match[1])], timestamp.encode() + b"." + body)


def _collect(headers: Mapping[str, str], wanted: Mapping[str, WebhookRejectCode]) -> dict[str, str]:
    """The scheme's headers (lower-case names to values, stripped), each present once and
    bounded; ``wanted`` says which code an oversized one is refused with."""
    found: dict[str, str] = {}
    seen: set[str] = set()
    for key, value in headers.items():
        if not isinstance(key, str) or not isinstance(value, str):
            continue
        name = key.lower()
        if name not in wanted:
            continue
        if name in seen:
            raise WebhookRejected(_INVALID, f"header {name} is given more than once")
        seen.add(name)
        if len(value) > MAX_HEADER_CHARS:
            raise WebhookRejected(
                wanted[name], f"header {name} is longer than {MAX_HEADER_CHARS} characters"
            )
        value = value.strip(" \t")
        if value:
            found[name] = value
    missing = [name for name in wanted if name not in found]
    if missing:
        raise WebhookRejected(_MISSING, f"the request has no {' or '.join(missing)} header")
    return found


def _check_timestamp(text: str, now: float, tolerance: float) -> None:
    if _UNIX_SECONDS.fullmatch(text) is None:
        raise WebhookRejected(_STALE, "the signed timestamp is not a number of unix seconds")
    skew = now - int(text)
    # Written so that a NaN clock refuses rather than accepts.
    if not abs(skew) <= tolerance:
        when = "older than" if skew > 0 else "ahead of"
        raise WebhookRejected(
            _STALE,
            f"the signed timestamp is {abs(skew):.0f} s {when} the gateway's clock; "
            f"the route accepts {tolerance:g} s either way",
        )


def _match(route: WebhookRoute, candidates: list[bytes], message: bytes) -> None:
    for number, secret in enumerate(route.secrets, 1):
        expected = _mac(_signing_key(route.scheme, secret, number), message)
        for candidate in candidates:
            if hmac.compare_digest(expected, candidate):
                return
    raise WebhookRejected(_INVALID, "no signature matches the route's secret")


# --- signing --------------------------------------------------------------------------------


def sign(
    route: WebhookRoute, body: bytes, now: float, *, webhook_id: str = "msg_1"
) -> dict[str, str]:
    """The headers ``route``'s sender would add to ``body`` at ``now`` (unix seconds), signed
    with the route's first secret: for tests, examples and benchmark clients.

    ``webhook_id`` is the Standard Webhooks message id (unused by the other schemes).
    """
    if not math.isfinite(now) or now < 0:
        raise ValueError("now must be unix seconds")
    timestamp = str(math.floor(now))
    key = _signing_key(route.scheme, route.secrets[0])
    if route.scheme == "github":
        return {"X-Hub-Signature-256": f"sha256={_mac(key, body).hex()}"}
    if route.scheme == "standard":
        if _WEBHOOK_ID.fullmatch(webhook_id) is None:
            raise ValueError("webhook_id must be 1-256 printable ASCII characters")
        mac = _mac(key, f"{webhook_id}.{timestamp}.".encode() + body)
        return {
            "webhook-id": webhook_id,
            "webhook-timestamp": timestamp,
            "webhook-signature": f"v1,{base64.b64encode(mac).decode()}",
        }
    hex_mac = _mac(key, f"{timestamp}.".encode() + body).hex()
    if route.scheme == "stripe":
        return {"Stripe-Signature": f"t={timestamp},v1={hex_mac}"}
    return {"X-Signature": f"sha256={hex_mac}", "X-Timestamp": timestamp}


# --- configuring ----------------------------------------------------------------------------

_ROUTE_FORM: Final = (
    "NAME=SCHEME:SECRET[,SECRET2][;tolerance=SECONDS][;start=AGENT|;signal=NAME;id=PATH"
    "[;prefix=TEXT]]"
)


def parse_route(text: str, environ: Mapping[str, str] = os.environ) -> WebhookRoute:
    """A route from its command-line form, ``NAME=SCHEME:SECRET[,SECRET2][;tolerance=SECONDS]``,
    and for a routed route ``;start=AGENT;id=PATH`` or ``;signal=NAME;id=PATH``, optionally
    ``;prefix=TEXT`` (``_routing.py``).

    Each SECRET is ``env:VAR`` (the variable's value), ``file:PATH`` (the file's first line,
    stripped) or the secret itself (which cannot contain ``,`` or ``;``, and shows in the
    process list: prefer the other two). Errors name the route, never a secret.

    Raises:
        ValueError: the text is malformed, a secret cannot be read, is shorter than
            ``MIN_SECRET_BYTES``, or the tolerance is out of range.
    """
    if len(text) > MAX_ROUTE_CHARS:
        raise ValueError(f"a webhook route is at most {MAX_ROUTE_CHARS} characters")
    name, equals, rest = text.partition("=")
    if not equals:
        raise ValueError(f"a webhook route is {_ROUTE_FORM}: no '=' after the name")
    if _ROUTE_NAME.fullmatch(name) is None:
        # Not echoed: a route written without its name begins with its secret.
        raise ValueError(
            f"a webhook route is {_ROUTE_FORM}, its NAME 1-64 characters of a-z, 0-9, '_' "
            "and '-', starting with a letter or a digit"
        )
    scheme, colon, rest = rest.partition(":")
    if not colon or scheme not in SCHEMES:
        raise ValueError(
            f"webhook route {name!r}: the scheme (before ':') must be one of {', '.join(SCHEMES)}"
        )
    secrets_text, *options = rest.split(";")
    tolerance = DEFAULT_TOLERANCE
    target: dict[str, str] = {}
    for option in options:
        key, _, value = option.partition("=")
        if key in _TARGET_OPTIONS:
            if key in target:
                raise ValueError(f"webhook route {name!r}: {key}= is given twice")
            target[key] = value
            continue
        match = _TOLERANCE.fullmatch(option)
        if match is None:
            raise ValueError(
                f"webhook route {name!r}: after the secrets only ';tolerance=SECONDS', "
                "';start=AGENT', ';signal=NAME', ';id=PATH' and ';prefix=TEXT' are understood "
                "(a literal secret cannot contain ';')"
            )
        if scheme == "github":
            raise ValueError(
                f"webhook route {name!r}: github signs no timestamp, so a tolerance does not apply"
            )
        if "tolerance" in target:
            raise ValueError(f"webhook route {name!r}: tolerance= is given twice")
        target["tolerance"] = match[1]
        tolerance = float(match[1])
    parts = secrets_text.split(",", MAX_SECRETS)
    if len(parts) > MAX_SECRETS:
        raise ValueError(
            f"webhook route {name!r}: one secret, or two while rotating "
            "(a literal secret cannot contain ',')"
        )
    try:
        secrets = tuple(
            _resolve_secret(part, number, environ) for number, part in enumerate(parts, 1)
        )
        return WebhookRoute(
            name=name,
            scheme=scheme,
            secrets=secrets,
            tolerance=tolerance,
            start=target.get("start"),
            signal=target.get("signal"),
            id_field=target.get("id"),
            id_prefix=target.get("prefix", ""),
        )
    except ValueError as error:
        raise ValueError(f"webhook route {name!r}: {error}") from None


def _resolve_secret(text: str, number: int, environ: Mapping[str, str]) -> bytes:
    if text.startswith("env:"):
        variable = text[len("env:") :]
        if _ENV_NAME.fullmatch(variable) is None:
            raise ValueError(f"secret {number}: env: needs a variable name (A-Z, 0-9, _)")
        value = environ.get(variable)
        if value is None:
            raise ValueError(f"secret {number}: environment variable {variable} is not set")
        secret = value.strip().encode("utf-8", "surrogateescape")
        if not secret:
            raise ValueError(f"secret {number}: environment variable {variable} is empty")
        return secret
    if text.startswith("file:"):
        path = text[len("file:") :]
        if not path:
            raise ValueError(f"secret {number}: file: needs a path")
        try:
            with open(path, "rb") as file:
                line = file.readline(MAX_SECRET_BYTES + 2)
        except OSError as error:
            raise ValueError(
                f"secret {number}: cannot read {path}: {error.strerror or type(error).__name__}"
            ) from None
        secret = line.strip()
        if not secret:
            raise ValueError(f"secret {number}: the first line of {path} is empty")
        return secret
    if not text:
        raise ValueError(f"secret {number} is empty")
    return text.encode("utf-8", "surrogateescape")
