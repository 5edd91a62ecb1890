"""Keyed starts over HTTP (decision 0047): ``Sojourn-Singleton-Key`` attaches to the key's
live run; ``Sojourn-Debounce`` with ``Sojourn-Debounce-Key`` starts one run per burst; bad
headers are refused with a typed problem and nothing is published."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest_asyncio

from sojourn.actors import Client, Worker
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from tests.actors.gateway.conftest import Files, running_worker
from tests.actors.gateway.test_gateway import problem
from tests.apps.keyed import gate, latest


@pytest_asyncio.fixture
async def worker(
    nats_server: EmbeddedServer, settings: Settings, files: Files
) -> AsyncIterator[Worker]:
    w = await running_worker(nats_server, settings, files, [gate, latest])
    try:
        yield w
    finally:
        await w.stop()


async def test_singleton_and_debounced_starts_over_http(
    http: httpx.AsyncClient, worker: Worker, client: Client
) -> None:
    single = {"Sojourn-Singleton-Key": "tenant-7"}
    first = await http.post("/v1/agents/gate/runs", json="a", headers=single)
    assert first.status_code == 201, first.text
    run_id = first.json()["run_id"]
    again = await http.post("/v1/agents/gate/runs", json="b", headers=single)
    assert again.status_code == 200, again.text
    assert again.json() == {
        "run_id": run_id,
        "created": False,
        "queued": False,
        "attached": True,
        "debounced": False,
    }
    # UTF-8 keys travel as their bytes.
    utf8 = [(b"Sojourn-Singleton-Key", "clé".encode())]
    other = await http.post("/v1/agents/gate/runs", json="c", headers=utf8)
    assert other.status_code == 201 and other.json()["run_id"] != run_id

    burst = {"Sojourn-Debounce": "1s", "Sojourn-Debounce-Key": "k"}
    answers = [await http.post("/v1/agents/latest/runs", json=i, headers=burst) for i in range(5)]
    assert {a.status_code for a in answers} == {202}
    assert len({a.json()["run_id"] for a in answers}) == 1
    assert all(a.json()["debounced"] for a in answers)
    assert await client.result(answers[0].json()["run_id"], timeout=60) == 4


async def test_bad_keyed_headers_are_problems(
    http: httpx.AsyncClient, worker: Worker, client: Client
) -> None:
    cases: list[tuple[dict[str, str | bytes], str]] = [
        ({"Sojourn-Singleton-Key": ""}, "invalid_key"),
        ({"Sojourn-Singleton-Key": "k" * 300}, "invalid_key"),
        ({"Sojourn-Singleton-Key": b"\xff\xfe"}, "invalid_key"),
        ({"Sojourn-Debounce": "-1s", "Sojourn-Debounce-Key": "k"}, "invalid_debounce"),
        ({"Sojourn-Debounce": "999d", "Sojourn-Debounce-Key": "k"}, "invalid_debounce"),
        ({"Sojourn-Debounce": "1s"}, "invalid_debounce"),
        ({"Sojourn-Debounce-Key": "k"}, "invalid_debounce"),
        ({"Sojourn-Debounce": "1s", "Sojourn-Debounce-Key": ""}, "invalid_key"),
        (
            {"Sojourn-Debounce": "1s", "Sojourn-Debounce-Key": "k", "Idempotency-Key": "r1"},
            "invalid_debounce",
        ),
        (
            {"Sojourn-Debounce": "1s", "Sojourn-Debounce-Key": "k", "Sojourn-Debounce-Inputs": "x"},
            "invalid_debounce",
        ),
    ]
    for headers, code in cases:
        raw = {k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in headers.items()}
        r = await http.post("/v1/agents/latest/runs", json=1, headers=raw)
        problem(r, code)
    # The intake's refusal reaches the caller typed too: the input does not fit.
    r = await http.post(
        "/v1/agents/latest/runs",
        json="not an int",
        headers={"Sojourn-Debounce": "1s", "Sojourn-Debounce-Key": "k"},
    )
    problem(r, "invalid_input")
