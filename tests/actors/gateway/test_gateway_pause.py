"""``POST /v1/runs/{id}/{pause,unpause}`` and ``POST /v1/agents/{agent}/{pause,unpause}``:
the operator's pause over HTTP, admin tokens only, recorded as sent by the caller."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest_asyncio

from sojourn.actors import Client, Worker
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.events import PauseRequested
from tests.actors.gateway.conftest import (
    ADMIN_TOKEN,
    CLIENT_TOKEN,
    Files,
    GatewayProc,
    running_worker,
)
from tests.actors.gateway.test_gateway import problem
from tests.apps import http_agents
from tests.conftest import wait_for


@pytest_asyncio.fixture
async def worker(
    nats_server: EmbeddedServer, settings: Settings, files: Files
) -> AsyncIterator[Worker]:
    w = await running_worker(nats_server, settings, files, [http_agents.echo_wait])
    try:
        yield w
    finally:
        await w.stop()


async def test_pause_and_unpause_over_http(
    worker: Worker, gateway: GatewayProc, client: Client
) -> None:
    as_client = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
    as_admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as h:
        run_id = (await h.post("/v1/agents/echo-wait/runs", json=1, headers=as_client)).json()[
            "run_id"
        ]
        # A client token may not pause, a run or an agent; nothing is held.
        problem(await h.post(f"/v1/runs/{run_id}/pause", headers=as_client), "forbidden")
        problem(await h.post("/v1/agents/echo-wait/pause", headers=as_client), "forbidden")
        assert await client.agent_holds() == []

        r = await h.post(f"/v1/runs/{run_id}/pause", json={"reason": "look"}, headers=as_admin)
        assert r.status_code == 202 and r.json() == {"run_id": run_id, "requested": "pause"}

        async def paused() -> bool:
            events = [e for d in await client.history(run_id) for e in d.events]
            return any(isinstance(e, PauseRequested) for e in events)

        await wait_for(paused, 30, what="the pause recorded")
        events = [e for d in await client.history(run_id) for e in d.events]
        pause = next(e for e in events if isinstance(e, PauseRequested))
        assert pause.reason == "look"
        r = await h.post(f"/v1/runs/{run_id}/unpause", headers=as_admin)
        assert r.status_code == 202, r.text

        r = await h.post("/v1/agents/echo-wait/pause", json={"reason": "deploy"}, headers=as_admin)
        assert r.status_code == 200 and r.json() == {
            "agent": "echo-wait",
            "paused": True,
            "resumed": 0,
        }
        holds = await client.agent_holds()
        assert [(x.agent, x.reason) for x in holds] == [("echo-wait", "deploy")]
        r = await h.post("/v1/agents/echo-wait/unpause", headers=as_admin)
        assert r.status_code == 200 and r.json()["paused"] is False
        assert await client.agent_holds() == []

        bad: list[tuple[str, Any]] = [
            ("/v1/agents/echo-wait/freeze", {}),
            ("/v1/agents/no.such/pause", {}),
            ("/v1/agents/echo-wait/pause", {"reason": "x" * 5000}),
            ("/v1/agents/echo-wait/pause", {"by": "mallory"}),
            (f"/v1/runs/{run_id}/freeze", {}),
        ]
        for path, body in bad:
            r = await h.post(path, json=body, headers=as_admin)
            assert r.status_code in (400, 404, 422), (path, r.status_code, r.text)
        assert await client.agent_holds() == []
