"""``POST /v1/runs/{id}/fork`` (decision 0041): a real ``sojourn gateway`` process, a real
nats-server and worker. A fork takes the ``start`` action (``--admin-only start`` keeps it from
client tokens), is recorded as sent by the caller's name (never a body field), is one fork per
``Idempotency-Key``, and is refused with problem documents."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from sojourn.actors import Client, Worker
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.events import ForkOrigin, RunStarted, SignalReceived
from tests.actors.gateway.conftest import Files, running_worker, start_gateway
from tests.actors.gateway.test_gateway import problem
from tests.actors.gateway.test_gateway_callers import ALICE, BOB, as_, waiting
from tests.apps import http_agents

pytestmark = pytest.mark.usefixtures("processes")

DEADLINE = 60.0


@pytest_asyncio.fixture
async def worker(
    nats_server: EmbeddedServer, settings: Settings, files: Files
) -> AsyncIterator[Worker]:
    w = await running_worker(nats_server, settings, files, [http_agents.echo_wait])
    try:
        yield w
    finally:
        await w.stop()


async def test_a_fork_over_http_is_a_start_of_the_callers_own(
    nats_server: EmbeddedServer, settings: Settings, files: Files, worker: Worker, client: Client
) -> None:
    files.tokens.write_text(f"{ALICE} client alice\n{BOB} admin bob\n")
    gw = await start_gateway(nats_server, settings, files, "--admin-only", "start")
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            r = await http.post(
                "/v1/agents/echo-wait/runs",
                json={"n": 1},
                headers={**as_(BOB), "Idempotency-Key": "orig"},
            )
            assert r.status_code == 201, r.text
            await waiting(client, "orig")
            body = {"from_step": 0, "signal": "go", "payload": {"ok": 1}, "by": "mallory"}
            key = {"Idempotency-Key": "orig-f"}
            # A body that claims an identity is refused: who forks is the bearer token.
            problem(
                await http.post("/v1/runs/orig/fork", json=body, headers=as_(BOB)),
                "invalid_trigger",
            )
            del body["by"]
            # Forking is starting: a client token may not when starts are admin-only.
            problem(
                await http.post("/v1/runs/orig/fork", json=body, headers=as_(ALICE)), "forbidden"
            )
            problem(await http.post("/v1/runs/orig/fork", json=body), "unauthorized")
            made = await http.post("/v1/runs/orig/fork", json=body, headers={**as_(BOB), **key})
            assert made.status_code == 201, made.text
            assert made.json() == {"run_id": "orig-f", "created": True, "queued": False}
            assert made.headers["location"] == "/v1/runs/orig-f"
            again = await http.post("/v1/runs/orig/fork", json=body, headers={**as_(BOB), **key})
            assert again.status_code == 200, again.text
            assert again.json()["created"] is False
            assert await client.result("orig-f", timeout=DEADLINE) == {
                "input": {"n": 1},
                "go": {"ok": 1},
            }
            shown = (await http.get("/v1/runs/orig-f", headers=as_(BOB))).json()
            assert shown["forked_from"] == {"run_id": "orig", "position": 0}
            assert (await client.status("orig")) == "waiting"  # the original goes on

            for path, asked, code in [
                ("/v1/runs/nobody/fork", {"from_step": 0}, "unknown_run"),
                ("/v1/runs/orig/fork", {"from_step": 5}, "invalid_fork"),
                ("/v1/runs/orig/fork", {"from_failure": True}, "invalid_fork"),
                ("/v1/runs/orig/fork", {}, "invalid_fork"),
                ("/v1/runs/orig/fork", {"from_step": -1}, "invalid_fork"),
                ("/v1/runs/orig/fork", {"from_step": 0, "payload": 1}, "invalid_trigger"),
            ]:
                problem(await http.post(path, json=asked, headers=as_(BOB)), code)
    finally:
        gw.stop()
    head = (await client.history("orig-f"))[0].events
    started = head[0]
    assert isinstance(started, RunStarted)
    assert started.trigger.sent_by == "bob"
    assert started.forked_from == ForkOrigin(run_id="orig", position=0, copied=0)
    assert isinstance(head[-1], SignalReceived) and head[-1].sent_by == "bob"
