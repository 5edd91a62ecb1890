"""Deployments tests stand up: an embedded nats-server with users and least-privilege
permissions, and a worker that is stopped however its test ends."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sojourn.actors import Agent, Worker
from sojourn.broker import EmbeddedServer
from sojourn.broker.auth import AuthUser
from sojourn.schemas.auth import Role
from sojourn.schemas.config import Settings


def passwords(users: Mapping[str, Role]) -> dict[str, str]:
    """A fresh password per user name."""
    return {name: secrets.token_urlsafe(18) for name in users}


@contextlib.asynccontextmanager
async def authenticated_server(
    store_dir: Path, users: Mapping[str, Role], secrets_: Mapping[str, str], prefix: str
) -> AsyncIterator[EmbeddedServer]:
    """A nats-server on a free port whose only users are ``users`` (name -> role), each with
    its role's permissions for ``prefix`` (``render_accounts``); ``url_for(name)`` connects."""
    auth = [AuthUser(name, secrets_[name], role) for name, role in users.items()]
    srv = EmbeddedServer(store_dir=store_dir, port=0, auth=auth, auth_prefix=prefix)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


@contextlib.asynccontextmanager
async def serving(
    url: str, agents: Sequence[Agent[Any, Any]], settings: Settings
) -> AsyncIterator[Worker]:
    """A started worker serving ``agents``."""
    w = Worker(list(agents), nats=url, settings=settings)
    await w.start()
    try:
        yield w
    finally:
        await w.stop()
