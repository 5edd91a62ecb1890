"""The roles of a sojourn deployment's NATS users: one vocabulary for the broker's permission
rendering (``sojourn.broker.auth``), ``sojourn dev --auth`` and the docs (docs/operations.md,
"Security").

- ``client``: starts, signals and cancels runs in its own name (and, for an HTTP gateway, in
  the names of its callers it is given: ``AuthUser.speaks_for``), reads runs and their health.
- ``worker``: executes runs: writes their histories, wakes, timers, leases, heartbeats, dead
  letters; consumes the inbox and the wakes; may create streams, never delete or purge history.
- ``watchdog``: reads histories, leases and health; publishes wakes and its claims.
- ``admin``: everything (stream administration, resume, in-doubt decisions).
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = ["ROLES", "SENDER_PATTERN", "Role"]

Role = Literal["client", "worker", "watchdog", "admin"]
"""What a NATS user of a sojourn deployment may do (see the module docstring)."""

ROLES: Final[tuple[Role, ...]] = ("client", "worker", "watchdog", "admin")
"""Every role, least privileged first (``sojourn dev --auth`` makes one user of each)."""

SENDER_PATTERN: Final = r"[A-Za-z0-9_-]{1,128}"
"""A user name, and any name a message is sent as: one NATS subject token, the ``<sender>`` of
``<prefix>.as.<sender>...`` (the rule of every name token, ``sojourn.schemas.names.TOKEN_PATTERN``;
a test keeps the two equal). The gateway's callers are named by it too."""
