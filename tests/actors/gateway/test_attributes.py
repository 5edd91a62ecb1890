"""Search attributes end to end (issue 31): given at start through ``Client.start``, the
gateway's ``Sojourn-Attributes`` header and ``sojourn start --attr``; upserted by the run
(``ctx.set_attributes``, a key removed with ``None``); carried in the run's view and listed by
attribute and status through ``Client.runs``, ``GET /v1/runs?attr.k=v`` and ``sojourn runs
--attr``. Hostile attributes are refused with ``invalid_attributes`` (by the client, the
gateway and the intake) and nothing is stored."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from sojourn.actors import Agent, Client, Context, Worker, agent
from sojourn.broker import EmbeddedServer, Names
from sojourn.projections.listing import ListingService
from sojourn.projections.projector import Projector
from sojourn.projections.sqlite import SqliteModel
from sojourn.schemas.attributes import InvalidAttributes
from sojourn.schemas.codec import encode, to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.wire import IntakeError, StartTrigger
from tests.actors.gateway.conftest import Files, running_worker
from tests.actors.gateway.test_gateway import cli, problem
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for


@agent("ticketed")
async def ticketed(ctx: Context, n: int) -> int:
    """Tags itself while it waits, then marks itself done and drops ``priority``."""
    ctx.set_attributes({"stage": "triage", "priority": n})
    await ctx.wait_for("go")
    ctx.set_attributes({"stage": "done", "priority": None})
    return n


AGENTS: list[Agent[Any, Any]] = [ticketed]


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
async def read_side(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> AsyncIterator[SqliteModel]:
    names = Names(settings.prefix)
    model = await SqliteModel.open(tmp_path / "m.sqlite3", events_stream=names.events_stream)
    projector = Projector(nats=nats_server.url, settings=settings, sink=model, interval=0.2)
    await projector.start()
    service = ListingService(client.broker, names, model)
    await service.start()
    try:
        yield model
    finally:
        await service.stop()
        await projector.stop()
        await model.close()


def cli_start(nats_server: EmbeddedServer, settings: Settings, *args: str) -> None:
    where = ["--nats", nats_server.url, "--prefix", settings.prefix]
    done = subprocess.run(
        [PYTHON, "-m", "sojourn.actors.cli", "start", *args, *where],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


async def ids(client: Client, **filters: Any) -> set[str]:
    return {v.run_id for v in (await client.runs(**filters)).runs}


async def test_attributes_given_at_start_and_upserted_are_listed_by_client_http_and_cli(
    http: httpx.AsyncClient,
    worker: Worker,
    client: Client,
    read_side: SqliteModel,
    nats_server: EmbeddedServer,
    settings: Settings,
) -> None:
    await client.start("ticketed", 1, run_id="t1", attributes={"customer": "c42", "vip": True})
    r = await http.post(
        "/v1/agents/ticketed/runs",
        json=2,
        headers={
            "Idempotency-Key": "t2",
            "Sojourn-Attributes": '{"customer": "c42", "vip": false}',
        },
    )
    assert r.status_code in (201, 202), r.text
    await asyncio.to_thread(  # in a thread: the worker and the read side run in this loop
        cli_start,
        nats_server, settings, "ticketed", "--input", "3", "--run-id", "t3",
        "--attr", "customer=c7", "--attr", "vip:=true",
    )  # fmt: skip

    async def tagged() -> bool:
        return await ids(client, attributes={"stage": "triage"}, status="waiting") == {
            "t1",
            "t2",
            "t3",
        }

    await wait_for(tagged, 60, what="three waiting runs tagged by their code")
    view = await client.view("t1")
    assert view is not None
    assert view.attributes == {"customer": "c42", "vip": True, "stage": "triage", "priority": 1}
    assert await ids(client, attributes={"customer": "c42"}, status="waiting") == {"t1", "t2"}
    assert await ids(client, attributes={"customer": "c42", "vip": True}) == {"t1"}
    assert await ids(client, attributes={"priority": 3}) == {"t3"}
    assert await ids(client, attributes={"customer": "c42"}, status="completed") == set()

    got = await http.get("/v1/runs?attr.customer=c42&attr.vip=true&status=waiting")
    assert got.status_code == 200, got.text
    assert [v["run_id"] for v in got.json()["runs"]] == ["t1"]
    assert got.json()["runs"][0]["attributes"]["customer"] == "c42"
    problem(await http.get("/v1/runs?attr.Bad-Key=1"), "invalid_query")

    listed = await asyncio.to_thread(
        cli, nats_server, settings, "runs", "--attr", "vip=true", "--status", "waiting"
    )
    assert {v["run_id"] for v in listed} == {"t1", "t3"}

    await client.signal("t1", "go")

    async def done() -> bool:
        return await ids(client, attributes={"stage": "done"}, status="completed") == {"t1"}

    await wait_for(done, 60, what="t1 listed done")
    view = await client.view("t1")
    assert view is not None
    assert view.attributes == {"customer": "c42", "vip": True, "stage": "done"}
    assert await ids(client, attributes={"priority": 1}) == set()


async def test_hostile_attributes_are_refused_and_nothing_is_stored(
    http: httpx.AsyncClient, worker: Worker, client: Client
) -> None:
    bad: list[dict[str, Any]] = [
        {f"k{i}": i for i in range(33)},
        {"Bad-Key": 1},
        {"": 1},
        {"note": "x" * 257},
        {"n": 1 << 64},
        {"f": float("nan")},
        {"l": [1, 2]},
        {"d": {"a": 1}},
    ]
    for attributes in bad:
        with pytest.raises(InvalidAttributes):
            await client.start("ticketed", 1, run_id="h0", attributes=attributes)
    for header in ('{"Bad-Key": 1}', "[1]", "{not json", '{"note": "' + "x" * 300 + '"}'):
        r = await http.post(
            "/v1/agents/ticketed/runs",
            json=1,
            headers={"Idempotency-Key": "h1", "Sojourn-Attributes": header},
        )
        problem(r, "invalid_attributes")
    # Past the client's checks, straight to the inbox: the intake refuses it.
    for i, attributes in enumerate(({"Bad-Key": 1}, {f"k{i}": i for i in range(40)})):
        body = encode(
            StartTrigger(input=to_raw(1), run_id=f"h{i + 2}", attributes=attributes)  # type: ignore[arg-type]
        )
        reply = await client._publish_answered(  # the raw path, as any NATS client could
            client.names.start("ticketed", None, f"h{i + 2}"), body, {}, 30.0
        )
        assert isinstance(reply, IntakeError) and reply.error.code == "invalid_attributes"
    for run_id in ("h0", "h1", "h2", "h3"):
        assert await client.history(run_id) == []
