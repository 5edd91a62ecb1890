"""Who may call the gateway: bearer tokens with the NATS users' roles and their callers'
names, and which actions need the admin role.

The gateway itself talks to NATS as one ``client`` user; its HTTP callers are told apart by
bearer tokens from a file (``TOKEN ROLE NAME`` per line). What a caller starts, signals and
cancels is sent as its ``NAME`` (``<prefix>.as.<NAME>...``), so the history records the
caller, not the gateway; under authentication the gateway's NATS user must be allowed to speak
for exactly those names (``AuthUser.speaks_for``, docs/decisions/0029). A line without a name
(``TOKEN ROLE``, the older form) is a caller the history records as the gateway's own user.

A token is looked up by its SHA-256 digest, so a request's token is never compared byte by
byte with a stored one, and the file's tokens are not kept in memory as they are. Callback and
webhook URLs need no bearer token: their own signed token is the credential
(``agents/callbacks.py``, ``_webhooks.py``), and what they deliver is sent as the gateway's own
user.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from sojourn.schemas.auth import SENDER_PATTERN
from sojourn.schemas.gateway import (
    ADMIN_ACTIONS,
    GATEWAY_ACTIONS,
    GATEWAY_ROLES,
    GatewayAction,
    GatewayRole,
)

__all__ = ["BearerTokens", "Caller", "Policy", "parse_actions"]

_TOKEN: Final = re.compile(r"[A-Za-z0-9._~+/=-]{16,512}")
"""RFC 6750's token68 characters; at least 16 of them (a guessable token is no credential)."""

_BEARER: Final = re.compile(r"Bearer ([A-Za-z0-9._~+/=-]{1,512})", re.IGNORECASE)

_NAME: Final = re.compile(SENDER_PATTERN)
"""A caller's name: one subject token, the ``<sender>`` its messages are sent as."""

TOKENS_MAX: Final = 10_000


_NAME_RULE: Final = "1 to 128 characters of A-Z a-z 0-9 _ -"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a bearer token is: its role, and the name what it sends is recorded as (``None``:
    a token without a name, sent as the gateway's own NATS user)."""

    role: GatewayRole
    name: str | None = None


class BearerTokens:
    """The bearer tokens the gateway accepts, each with its role and its caller's name."""

    def __init__(self, tokens: Mapping[str, GatewayRole | Caller]) -> None:
        callers: dict[bytes, Caller] = {}
        for token, given in tokens.items():
            caller = given if isinstance(given, Caller) else Caller(given)
            if not _TOKEN.fullmatch(token):
                raise ValueError(
                    "a bearer token is 16 to 512 characters of A-Z a-z 0-9 . _ ~ + / = -"
                )
            if caller.role not in GATEWAY_ROLES:
                raise ValueError(
                    f"unknown role {str(caller.role)[:32]!r}: use one of {', '.join(GATEWAY_ROLES)}"
                )
            if caller.name is not None and not _NAME.fullmatch(caller.name):
                raise ValueError(f"a caller's name is {_NAME_RULE}")
            callers[_digest(token)] = caller
        self._callers = callers

    def __len__(self) -> int:
        return len(self._callers)

    def __repr__(self) -> str:
        return f"BearerTokens({len(self._callers)} tokens)"

    @property
    def names(self) -> frozenset[str]:
        """The callers' names: what the gateway's NATS user must be allowed to speak for."""
        return frozenset(c.name for c in self._callers.values() if c.name is not None)

    @property
    def unnamed(self) -> int:
        """Tokens without a name (``TOKEN ROLE``): sent as the gateway's own user."""
        return sum(1 for c in self._callers.values() if c.name is None)

    @classmethod
    def parse(cls, text: str, *, source: str = "tokens") -> BearerTokens:
        """One ``TOKEN ROLE NAME`` per line (``#`` comments and blank lines allowed). ``NAME``
        is who the history records as the sender of what the token starts, signals and
        cancels; a line ``TOKEN ROLE`` without one is recorded as the gateway's own user.
        Several tokens may share a name (a rotation, a client and an admin token).

        Raises:
            ValueError: a malformed line (named by number, never quoting the token).
        """
        tokens: dict[str, Caller] = {}
        named: dict[str, int] = {}  # a name and the first line that gives it
        for number, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            fields = line.split()
            if len(fields) not in (2, 3):
                raise ValueError(f"{source} line {number}: expected TOKEN ROLE NAME")
            token, role = fields[:2]
            name = fields[2] if len(fields) == 3 else None
            if not _TOKEN.fullmatch(token):
                raise ValueError(
                    f"{source} line {number}: a token is 16 to 512 characters of "
                    "A-Z a-z 0-9 . _ ~ + / = -"
                )
            if role not in GATEWAY_ROLES:
                raise ValueError(
                    f"{source} line {number}: role {role[:32]!r} is not one of "
                    f"{', '.join(GATEWAY_ROLES)}"
                )
            if name is not None and not _NAME.fullmatch(name):
                # The name is not quoted either: a misplaced field may be a token.
                raise ValueError(f"{source} line {number}: a name is {_NAME_RULE}")
            if token in tokens:
                raise ValueError(f"{source} line {number}: the same token twice")
            if len(tokens) >= TOKENS_MAX:
                raise ValueError(f"{source}: more than {TOKENS_MAX} tokens")
            tokens[token] = Caller(role, name)  # checked against GATEWAY_ROLES above
            if name is not None:
                named.setdefault(name, number)
        if not tokens:
            raise ValueError(f"{source}: no tokens (one TOKEN ROLE NAME per line)")
        leaked = sorted(number for name, number in named.items() if name in tokens)
        if leaked:
            # A token pasted in the NAME column would be sent as a subject token and recorded
            # in every history its caller touches.
            raise ValueError(
                f"{source} line {leaked[0]}: the name is one of the file's tokens (a name is "
                "recorded in histories; a token must never be)"
            )
        return cls(tokens)

    @classmethod
    def load(cls, path: str | Path) -> BearerTokens:
        """``parse`` of a file.

        Raises:
            OSError: the file cannot be read.
            ValueError: a malformed line.
        """
        return cls.parse(Path(path).read_text(encoding="utf-8"), source=str(path))

    def digests(self) -> list[bytes]:
        """The SHA-256 digests of the tokens (what a session cookie refers to, under a key)."""
        return list(self._callers)

    def digest_of(self, token: str) -> bytes | None:
        """The digest of ``token`` if it is one of these (a sign-in), else ``None``."""
        if not _TOKEN.fullmatch(token):
            return None
        digest = _digest(token)
        return digest if digest in self._callers else None

    def by_digest(self, digest: bytes) -> Caller | None:
        return self._callers.get(digest)

    def caller_of(self, authorization: str | None) -> Caller | None:
        """Who sent an ``Authorization: Bearer TOKEN`` header; ``None`` when there is no
        header, it is malformed, or the token is not one of these."""
        if authorization is None or len(authorization) > 600:
            return None
        m = _BEARER.fullmatch(authorization.strip())
        if m is None:
            return None
        return self._callers.get(_digest(m.group(1)))

    def role_of(self, authorization: str | None) -> GatewayRole | None:
        """The role of ``caller_of``, ``None`` for no known token."""
        caller = self.caller_of(authorization)
        return None if caller is None else caller.role


def parse_actions(text: str) -> frozenset[GatewayAction]:
    """``cancel,signal`` -> the actions named (for ``--admin-only``).

    Raises:
        ValueError: an unknown action.
    """
    names = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in names if a not in GATEWAY_ACTIONS]
    if bad:
        raise ValueError(f"unknown action {bad[0][:32]!r}: use {', '.join(GATEWAY_ACTIONS)}")
    return frozenset(a for a in GATEWAY_ACTIONS if a in names)


class Policy:
    """Which role each action needs: ``admin`` for the actions in ``admin_only``, else
    either role."""

    def __init__(self, admin_only: Iterable[GatewayAction] = ()) -> None:
        self.admin_only = frozenset(admin_only)

    def allows(self, role: GatewayRole, action: GatewayAction) -> bool:
        if role == "admin":
            return True
        return action not in self.admin_only and action not in ADMIN_ACTIONS
