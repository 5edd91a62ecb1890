"""Priority and fairness over HTTP (decision 0049): ``Sojourn-Priority`` puts the start on its
lane and the run records it; ``Sojourn-Fairness-Key``/``-Weight`` are recorded; bad headers are
refused with a typed problem and nothing is published."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest_asyncio

from sojourn.actors import Client, Worker
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.events import RunStarted
from sojourn.schemas.fairness import Fairness
from tests.actors.gateway.conftest import Files, running_worker
from tests.actors.gateway.test_gateway import problem
from tests.apps.laned import laned


@pytest_asyncio.fixture
async def worker(
    nats_server: EmbeddedServer, settings: Settings, files: Files
) -> AsyncIterator[Worker]:
    w = await running_worker(nats_server, settings, files, [laned])
    try:
        yield w
    finally:
        await w.stop()


async def test_a_priority_and_a_fairness_key_over_http(
    http: httpx.AsyncClient, worker: Worker, client: Client
) -> None:
    r = await http.post(
        "/v1/agents/laned/runs",
        json=0.0,
        headers={
            "Sojourn-Priority": "1",
            "Sojourn-Fairness-Key": "tenant:acme",
            "Sojourn-Fairness-Weight": "7",
            "Idempotency-Key": "h1",
        },
    )
    assert r.status_code == 201, r.text
    assert await client.result("h1", timeout=30) == 0.0
    first = (await client.history("h1"))[0].events[0]
    assert isinstance(first, RunStarted)
    assert first.priority == 1 and first.fairness == Fairness(key="tenant:acme", weight=7)


async def test_bad_priority_and_fairness_headers_are_problems(
    http: httpx.AsyncClient, worker: Worker, client: Client
) -> None:
    for bad in ("0", "6", "1.0", "1 2", "01", "-1", "\u00b9", "p1", "", "99999999999999999999"):
        r = await http.post(
            "/v1/agents/laned/runs", json=0.0, headers={b"Sojourn-Priority": bad.encode()}
        )
        problem(r, "invalid_priority")
    k, w = "Sojourn-Fairness-Key", "Sojourn-Fairness-Weight"
    cases: list[dict[str, str | bytes]] = [
        {k: "a b"},
        {k: "x" * 129},
        {k: b"\xc3\xa9"},  # not ASCII: refused, never decoded into something else
        {w: "2"},
        {k: "a", w: "0"},
        {k: "a", w: "1001"},
        {k: "a", w: "2.5"},
        {k: "a", w: "\u00b2"},
        {k: "", w: "3"},
    ]
    for case in cases:
        raw = {h.encode(): v if isinstance(v, bytes) else v.encode() for h, v in case.items()}
        r = await http.post("/v1/agents/laned/runs", json=0.0, headers=raw)
        problem(r, "invalid_fairness")
    ok = await http.post(
        "/v1/agents/laned/runs",
        json=0.0,
        headers={"Sojourn-Priority": "5", "Idempotency-Key": "ok"},
    )
    assert ok.status_code == 201
    assert await client.result("ok", timeout=30) == 0.0
    assert (await client.state("ok")).priority == 5
