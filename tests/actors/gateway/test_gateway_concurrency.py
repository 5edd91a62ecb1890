"""A concurrency key over HTTP (decision 0048): ``Sojourn-Concurrency-Key`` with
``Sojourn-Concurrency-Limit`` queues the runs beyond the limit, whose status says where they
stand; bad headers are refused with a typed problem and nothing is published."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest_asyncio

from sojourn.actors import Client, Worker
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from tests.actors.gateway.conftest import Files, running_worker
from tests.actors.gateway.test_gateway import problem
from tests.apps.concurrency import keyed_fast, keyed_wait
from tests.conftest import wait_for


@pytest_asyncio.fixture
async def worker(
    nats_server: EmbeddedServer, settings: Settings, files: Files
) -> AsyncIterator[Worker]:
    w = await running_worker(nats_server, settings, files, [keyed_wait, keyed_fast])
    try:
        yield w
    finally:
        await w.stop()


async def test_a_concurrency_key_over_http(
    http: httpx.AsyncClient, worker: Worker, client: Client
) -> None:
    key = [(b"Sojourn-Concurrency-Key", "clé".encode()), (b"Sojourn-Concurrency-Limit", b"1")]
    ids = []
    for n in range(3):
        r = await http.post(
            "/v1/agents/keyed_wait/runs",
            json=f"t{n}",
            headers=[*key, (b"Idempotency-Key", f"h{n}".encode())],
        )
        assert r.status_code == 201, r.text
        ids.append(r.json()["run_id"])

    async def first_waits() -> bool:
        return await client.status(ids[0]) == "waiting"

    await wait_for(first_waits, timeout=30, what="the first run to hold the slot")
    status = await http.get(f"/v1/runs/{ids[2]}")
    assert status.status_code == 200
    body = status.json()
    assert body["status"] == "pending" and body["detail"] == "queued on key clé, position 2"
    assert body["queue"] == {"key": "clé", "position": 2}
    for rid in ids:

        async def waiting(rid: str = rid) -> bool:
            return await client.status(rid) == "waiting"

        await wait_for(waiting, timeout=30, what=f"{rid} to hold the slot")
        await client.signal(rid, "go")
        await client.result(rid, timeout=30)


async def test_bad_concurrency_headers_are_problems(
    http: httpx.AsyncClient, worker: Worker, client: Client
) -> None:
    k, n = "Sojourn-Concurrency-Key", "Sojourn-Concurrency-Limit"
    cases: list[dict[str, str | bytes]] = [
        {k: "a"},
        {n: "2"},
        {k: "", n: "2"},
        {k: "x" * 300, n: "2"},
        {k: b"\xff\xfe", n: "2"},
        {k: "a", n: "0"},
        {k: "a", n: "-1"},
        {k: "a", n: "1001"},
        {k: "a", n: "99999999999999999999"},
        {k: "a", n: "1.5"},
        {k: "a", n: "²"},
        {k: "a", n: "2", "Sojourn-Singleton-Key": "s"},
    ]
    for headers in cases:
        raw = {h.encode(): v if isinstance(v, bytes) else v.encode() for h, v in headers.items()}
        r = await http.post("/v1/agents/keyed_fast/runs", json=1, headers=raw)
        problem(r, "invalid_concurrency")
    # The intake's refusal reaches the caller typed too: the input does not fit.
    r = await http.post("/v1/agents/keyed_fast/runs", json="x", headers={k: "a", n: "2"})
    problem(r, "invalid_input")
    ok = await http.post("/v1/agents/keyed_fast/runs", json=5, headers={k: "a", n: "2"})
    assert ok.status_code == 201
    assert await client.result(ok.json()["run_id"], timeout=30) == 5
