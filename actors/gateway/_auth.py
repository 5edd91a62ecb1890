"""Who may call the gateway: bearer tokens with the NATS users' roles, and which actions need
the admin role.

The gateway itself talks to NATS as one ``client`` user; its HTTP callers are told apart by
bearer tokens from a file (``TOKEN ROLE`` per line). A token is looked up by its SHA-256
digest, so a request's token is never compared byte by byte with a stored one, and the file's
tokens are not kept in memory as they are. Callback and webhook URLs need no bearer token:
their own signed token is the credential (``_callbacks``, ``_webhooks``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

from sojourn.schemas.gateway import (
    GATEWAY_ACTIONS,
    GATEWAY_ROLES,
    GatewayAction,
    GatewayRole,
)

__all__ = ["BearerTokens", "Policy", "parse_actions"]

_TOKEN: Final = re.compile(r"[A-Za-z0-9._~+/=-]{16,512}")
"""RFC 6750's token68 characters; at least 16 of them (a guessable token is no credential)."""

_BEARER: Final = re.compile(r"Bearer ([A-Za-z0-9._~+/=-]{1,512})", re.IGNORECASE)

TOKENS_MAX: Final = 10_000


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class BearerTokens:
    """The bearer tokens the gateway accepts, each with its role."""

    def __init__(self, tokens: Mapping[str, GatewayRole]) -> None:
        for token, role in tokens.items():
            if not _TOKEN.fullmatch(token):
                raise ValueError(
                    "a bearer token is 16 to 512 characters of A-Z a-z 0-9 . _ ~ + / = -"
                )
            if role not in GATEWAY_ROLES:
                raise ValueError(f"unknown role {role!r}: use one of {', '.join(GATEWAY_ROLES)}")
        self._roles = {_digest(t): r for t, r in tokens.items()}

    def __len__(self) -> int:
        return len(self._roles)

    def __repr__(self) -> str:
        return f"BearerTokens({len(self._roles)} tokens)"

    @classmethod
    def parse(cls, text: str, *, source: str = "tokens") -> BearerTokens:
        """One ``TOKEN ROLE`` per line (``#`` comments and blank lines allowed).

        Raises:
            ValueError: a malformed line (named by number, never quoting the token).
        """
        tokens: dict[str, GatewayRole] = {}
        for number, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            fields = line.split()
            if len(fields) != 2:
                raise ValueError(f"{source} line {number}: expected TOKEN ROLE")
            token, role = fields
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
            if token in tokens:
                raise ValueError(f"{source} line {number}: the same token twice")
            if len(tokens) >= TOKENS_MAX:
                raise ValueError(f"{source}: more than {TOKENS_MAX} tokens")
            tokens[token] = role  # checked against GATEWAY_ROLES above
        if not tokens:
            raise ValueError(f"{source}: no tokens (one TOKEN ROLE per line)")
        return cls(tokens)

    @classmethod
    def load(cls, path: str | Path) -> BearerTokens:
        """``parse`` of a file.

        Raises:
            OSError: the file cannot be read.
            ValueError: a malformed line.
        """
        return cls.parse(Path(path).read_text(encoding="utf-8"), source=str(path))

    def role_of(self, authorization: str | None) -> GatewayRole | None:
        """The role of an ``Authorization: Bearer TOKEN`` header; ``None`` when there is no
        header, it is malformed, or the token is not one of these."""
        if authorization is None or len(authorization) > 600:
            return None
        m = _BEARER.fullmatch(authorization.strip())
        if m is None:
            return None
        return self._roles.get(_digest(m.group(1)))


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
        return role == "admin" or action not in self.admin_only
