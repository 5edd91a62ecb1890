"""Updates under authentication (decision 0042): a client with the client role's least
privilege sends updates and gets answers; the history records the broker's user as who sent
them (verified); nobody can send an update as somebody else."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from sojourn.actors import Client, Worker
from sojourn.broker import Names
from sojourn.schemas.auth import ROLES, Role
from sojourn.schemas.codec import encode, to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import PermissionDenied
from sojourn.schemas.events import UpdateCompleted, UpdateRequested
from sojourn.schemas.updates import UpdateBody
from tests.apps.updates import cart
from tests.conftest import wait_for
from tests.deployments import authenticated_server

PREFIX = "updauth"
SETTINGS = Settings(prefix=PREFIX, lease_ttl=2.0)
NAMES = Names(PREFIX)


async def test_updates_with_least_privilege(processes: None, tmp_path: Path) -> None:
    passwords: dict[str, str] = {role: secrets.token_urlsafe(18) for role in ROLES}
    users: dict[str, Role] = {role: role for role in ROLES}
    async with authenticated_server(tmp_path / "nats", users, passwords, PREFIX) as server:
        worker = Worker([cart], nats=server.url_for("worker"), settings=SETTINGS)
        await worker.start()
        client = await Client.connect(server.url_for("client"), settings=SETTINGS)
        try:
            run_id = await client.start("cart", "auth", run_id="cart-auth", wait=True)

            async def parked() -> bool:
                return (await client.state(run_id)).status == "waiting"

            await wait_for(parked, 60, what="the run to wait")
            answer = await client.update(run_id, "add", "milk", update_id="u1", timeout=60)
            assert answer == {"count": 1, "items": ["milk"]}

            body = encode(UpdateBody(update_id="forged", payload=to_raw("x")))
            for subject in (NAMES.update(run_id, "add", "admin"), NAMES.update(run_id, "add")):
                with pytest.raises(PermissionDenied):
                    await client.broker.publish(subject, body, timeout=60)

            events = [e for d in await client.history(run_id) for e in d.events]
            requested = [e for e in events if isinstance(e, UpdateRequested)]
            assert [(e.update_id, e.sent_by, e.sender_verified) for e in requested] == [
                ("u1", "client", True)
            ]
            completed = [e for e in events if isinstance(e, UpdateCompleted)]
            assert [(e.update_id, e.sent_by) for e in completed] == [("u1", "client")]
            await client.signal(run_id, "checkout")
            assert await client.result(run_id, timeout=60) == ["milk"]
        finally:
            await client.close()
            await worker.stop()
