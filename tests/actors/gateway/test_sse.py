"""Server-sent events through a real gateway (issue 15, Proof): a client that disconnects in
the middle of a token stream and resumes with ``Last-Event-ID`` receives exactly the missing
chunks; the views stream ends with the run's end."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest_asyncio

from sojourn.actors import Agent, Client, Worker
from sojourn.broker import EmbeddedServer
from sojourn.projections.projector import Projector
from sojourn.schemas.config import Settings
from tests.actors.gateway.conftest import CLIENT_TOKEN, Files, running_worker, start_gateway
from tests.actors.gateway.test_gateway import problem
from tests.apps import http_agents
from tests.conftest import wait_for

AGENTS: list[Agent[Any, Any]] = [http_agents.chunky, http_agents.echo_wait]


@pytest_asyncio.fixture
async def worker(
    nats_server: EmbeddedServer, settings: Settings, files: Files
) -> AsyncIterator[Worker]:
    w = await running_worker(nats_server, settings, files, AGENTS)
    try:
        yield w
    finally:
        await w.stop()


@pytest_asyncio.fixture
async def projector(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Projector]:
    p = Projector(nats=nats_server.url, settings=settings)
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


async def events(
    http: httpx.AsyncClient, path: str, *, headers: dict[str, str] | None = None, stop: int = 0
) -> list[tuple[str, str | None, Any]]:
    """``(event, id, data)`` of the stream at ``path``, until ``event: end`` or, with
    ``stop``, after that many events (then the connection is dropped)."""
    out: list[tuple[str, str | None, Any]] = []
    async with http.stream("GET", path, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        event, event_id, data = "", None, ""
        async for line in r.aiter_lines():
            if line.startswith(":"):
                continue  # a comment: the greeting, or a keepalive
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: "):
                data = line[6:]
            elif line == "" and event:
                out.append((event, event_id, json.loads(data)))
                if event == "end" or (stop and len(out) == stop):
                    return out
                event, event_id, data = "", None, ""
    raise AssertionError(f"the stream closed without an end event: {out}")


async def test_a_client_resumes_a_token_stream_with_last_event_id_and_misses_nothing(
    http: httpx.AsyncClient, worker: Worker, client: Client
) -> None:
    r = await http.post("/v1/agents/chunky/runs", json=10)
    run_id = r.json()["run_id"]
    first = await events(http, f"/v1/runs/{run_id}/stream", stop=4)
    assert [e[0] for e in first] == ["chunk"] * 4
    last_id = first[-1][1]
    assert last_id is not None

    async def waiting() -> bool:
        return await client.status(run_id) == "waiting"

    await wait_for(waiting, 60, what="the run waiting for finish")
    finish = await http.post(f"/v1/runs/{run_id}/signals/finish", json=None)
    assert finish.status_code == 202, finish.text
    rest = await events(http, f"/v1/runs/{run_id}/stream", headers={"Last-Event-ID": last_id})
    assert rest[-1][0] == "end"
    chunks = first + rest[:-1]
    texts = [c[2]["text"] for c in chunks]
    assert texts == [f"a{i} " for i in range(10)] + [f"b{i} " for i in range(10)]
    offsets = [int(c[1]) for c in chunks if c[1] is not None]
    assert offsets == sorted(set(offsets)) and len(offsets) == 20
    # ?after= is the same resume point for a client that keeps the offset itself.
    again = await events(http, f"/v1/runs/{run_id}/stream?after={offsets[14]}")
    assert [c[2]["text"] for c in again[:-1]] == [f"b{i} " for i in range(5, 10)]


async def test_the_views_stream_follows_the_run_to_its_end_and_resumes_after_an_id(
    http: httpx.AsyncClient, worker: Worker, client: Client, projector: Projector
) -> None:
    r = await http.post("/v1/agents/echo-wait/runs", json="x")
    run_id = r.json()["run_id"]

    async def waiting() -> bool:
        return await client.status(run_id) == "waiting"

    await wait_for(waiting, 60, what="the run waiting")
    first = await events(http, f"/v1/runs/{run_id}/events", stop=1)
    assert first[0][0] == "view" and first[0][2]["run_id"] == run_id
    await http.post(f"/v1/runs/{run_id}/signals/go", json=1)
    views = await events(http, f"/v1/runs/{run_id}/events")
    assert views[-1][0] == "end"
    assert views[-2][2]["status"] == "completed"
    # A view without an id is the pending one (the start stored, no history yet), and comes
    # first; every view after it carries its last_seq, the resume point.
    ids = [v[1] for v in views[:-1]]
    unnumbered = [v[2]["status"] for v in views[:-1] if v[1] is None]
    assert unnumbered in ([], ["pending"]) and ids[len(unnumbered) :].count(None) == 0
    seen = ids[len(unnumbered)]
    assert seen is not None
    resumed = await events(http, f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": seen})
    assert all(v[1] is not None and int(v[1]) > int(seen) for v in resumed[:-1])
    assert resumed[-2][2]["status"] == "completed"


async def test_streams_over_the_limit_are_503_and_counted(
    nats_server: EmbeddedServer, settings: Settings, files: Files, worker: Worker
) -> None:
    g = await start_gateway(
        nats_server, settings, files, "--max-streams", "1", "--metrics-port", "0"
    )
    try:
        metrics_url = next(
            line.split()[1].decode() for line in g.lines if line.startswith(b"metrics: ")
        )
        headers = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
        async with httpx.AsyncClient(base_url=g.url, headers=headers, timeout=30) as http:
            r = await http.post("/v1/agents/echo-wait/runs", json=1)
            run_id = r.json()["run_id"]
            async with http.stream("GET", f"/v1/runs/{run_id}/stream") as first:
                assert first.status_code == 200
                async for line in first.aiter_lines():
                    assert line.startswith(":")  # the greeting: the stream is open
                    break
                over = await http.get(f"/v1/runs/{run_id}/stream")
                problem(over, "unavailable")
                assert over.headers["retry-after"] == "5"
            await http.post(f"/v1/runs/{run_id}/signals/go", json=None)

            async def freed() -> bool:  # the first stream closed: room for one again
                async with http.stream("GET", f"/v1/runs/{run_id}/stream") as again:
                    return again.status_code == 200

            await wait_for(freed, 60, what="the stream's slot freed")
            text = (await http.get(metrics_url)).text
            assert 'sojourn_gateway_requests_total{route="stream",status="503"} 1.0' in text
            assert 'sojourn_gateway_requests_total{route="start",status="201"} 1.0' in text
            ready = await http.get(metrics_url.replace("/metrics", "/readyz"))
            assert ready.status_code == 200, ready.text
    finally:
        g.stop()


async def test_a_stopping_gateway_ends_its_streams_cleanly(
    nats_server: EmbeddedServer, settings: Settings, files: Files, worker: Worker
) -> None:
    """SIGTERM with streams open: each ends at once without ``event: end`` (the run goes on;
    the client reconnects elsewhere with ``Last-Event-ID``), the process exits 0, and nothing
    is logged as an error."""
    g = await start_gateway(nats_server, settings, files)
    try:
        headers = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
        async with httpx.AsyncClient(base_url=g.url, headers=headers, timeout=60) as http:
            r = await http.post("/v1/agents/echo-wait/runs", json=1)
            run_id = r.json()["run_id"]
            async with http.stream("GET", f"/v1/runs/{run_id}/stream") as s:
                lines = s.aiter_lines()
                assert (await anext(lines)).startswith(":")
                g.proc.terminate()
                rest = [line async for line in lines]
            assert "event: end" not in rest and ": closing" in rest, rest
        rc = await asyncio.to_thread(g.proc.wait, 60)
        assert g.proc.stdout is not None
        log = b"".join(g.lines) + await asyncio.to_thread(g.proc.stdout.read)
        assert rc == 0, log
        assert b"Exception in ASGI application" not in log and b"Traceback" not in log, log
    finally:
        g.stop()
