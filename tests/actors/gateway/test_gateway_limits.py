"""The shared rate limits over HTTP (decision 0046): read with any token, set, block and
unblock with an admin token only; bad names and bodies are problems, and change nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest_asyncio

from sojourn.actors import Client, Limit, Worker
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from tests.actors.gateway.conftest import (
    ADMIN_TOKEN,
    CLIENT_TOKEN,
    Files,
    GatewayProc,
    running_worker,
)
from tests.actors.gateway.test_gateway import problem
from tests.apps.limited import limited


@pytest_asyncio.fixture
async def worker(
    nats_server: EmbeddedServer, settings: Settings, files: Files
) -> AsyncIterator[Worker]:
    w = await running_worker(nats_server, settings, files, [limited])
    try:
        yield w
    finally:
        await w.stop()


async def test_limits_over_http(worker: Worker, gateway: GatewayProc, client: Client) -> None:
    as_client = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
    as_admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as h:
        listed = (await h.get("/v1/limits", headers=as_client)).json()
        assert [(r["name"], r["limit"]["requests"]) for r in listed] == [("api", "600/min")]
        one = await h.get("/v1/limits/api", headers=as_client)
        assert one.status_code == 200 and one.json()["declared"] is True
        problem(await h.get("/v1/limits/ghost", headers=as_client), "unknown_limit")
        problem(await h.get("/v1/limits/bad%20name", headers=as_client), "invalid_limit")
        # only an admin token changes a limit; a client token changes nothing
        problem(
            await h.post("/v1/limits/api", json={"requests": "1/s"}, headers=as_client),
            "forbidden",
        )
        problem(
            await h.post("/v1/limits/api/block", json={"seconds": 5}, headers=as_client),
            "forbidden",
        )
        r = await h.post("/v1/limits/api", json={"requests": "30/s", "burst": 2}, headers=as_admin)
        assert r.status_code == 200, r.text
        assert r.json()["limit"] == {"requests": "30/s", "tokens": None, "burst": 2}
        assert r.json()["declared"] is False and r.json()["set_by"]
        r = await h.post("/v1/limits/api/block", json={"seconds": 20}, headers=as_admin)
        assert r.status_code == 200 and r.json()["blocks"] == 1
        r = await h.post("/v1/limits/api/unblock", headers=as_admin)
        assert r.status_code == 200 and r.json()["blocked_until"] == 0
        for path, body, code in [
            ("/v1/limits/api", {"requests": "many"}, "invalid_limit"),
            ("/v1/limits/api", {}, "invalid_limit"),
            ("/v1/limits/api", None, "invalid_limit"),
            ("/v1/limits/api", {"requests": "1/s", "x": 1}, "invalid_limit"),
            ("/v1/limits/api/block", {"seconds": -1}, "invalid_limit"),
            ("/v1/limits/api/block", {"seconds": 1e9}, "invalid_limit"),
            ("/v1/limits/api/block", {"seconds": "soon"}, "invalid_limit"),
            ("/v1/limits/api/block", None, "invalid_limit"),
            ("/v1/limits/api/melt", {}, "not_found"),
            ("/v1/limits/ghost/block", {"seconds": 5}, "unknown_limit"),
        ]:
            problem(await h.post(path, json=body, headers=as_admin), code)
        r = await h.post(
            "/v1/limits/api",
            content=b"[" * 10000,
            headers={**as_admin, "Content-Type": "application/json"},
        )
        assert r.status_code == 400
    record = await client.limit("api")
    assert record is not None and record.limit == Limit(requests="30/s", burst=2)
    assert await client.limit("ghost") is None
