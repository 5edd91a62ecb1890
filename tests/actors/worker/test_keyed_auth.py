"""Keyed starts (decision 0047) on a deployment with authentication: a worker with worker
credentials writes the keys' records and the bursts' fires and consumes ``debounce-<agent>``;
a client with client credentials starts, attaches and debounces, and may not write a record or
a fire itself."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from sojourn.actors import Client, Worker
from sojourn.broker import EmbeddedServer, Names
from sojourn.broker.flow import FlowStore
from sojourn.schemas.auth import ROLES, Role
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import PermissionDenied
from sojourn.schemas.flow import key_token
from tests.apps.keyed import gate, latest
from tests.deployments import authenticated_server

PREFIX = "keyedauth"
SETTINGS = Settings(prefix=PREFIX, lease_ttl=2.0)
NAMES = Names(PREFIX)
PASSWORDS: dict[str, str] = {role: secrets.token_urlsafe(18) for role in ROLES}


@pytest_asyncio.fixture
async def server(
    processes: None, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[EmbeddedServer]:
    users: dict[str, Role] = {role: role for role in ROLES}
    async with authenticated_server(
        tmp_path_factory.mktemp("nats-keyed"), users, PASSWORDS, PREFIX
    ) as srv:
        yield srv


async def test_keyed_starts_with_least_privilege(server: EmbeddedServer) -> None:
    worker = Worker([gate, latest], nats=server.url_for("worker"), settings=SETTINGS)
    await worker.start()
    client = await Client.connect(server.url_for("client"), settings=SETTINGS)
    try:
        first = await client.trigger("gate", "a", singleton_key="k", timeout=30)
        again = await client.trigger("gate", "b", singleton_key="k", timeout=30)
        assert first.created and again.attached and again.run_id == first.run_id
        burst = [
            await client.trigger("latest", i, debounce=0.5, debounce_key="k", timeout=30)
            for i in range(3)
        ]
        assert len({r.run_id for r in burst}) == 1
        assert await client.result(burst[0].run_id, timeout=60) == 2
        token = key_token("k")
        for kind in ("single", "burst", "timer", "fire"):
            with pytest.raises(PermissionDenied):
                await client.broker.publish(FlowStore.subject(NAMES, kind, "gate", token), b"{}")
    finally:
        await client.close()
        await worker.stop()
