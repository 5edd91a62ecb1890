"""The HTTP gateway (issue 15): a real ``sojourn gateway`` process, a real nats-server, httpx.

Starts with an ``Idempotency-Key``, status, history and signals that equal the CLI's; bearer
tokens and the admin-only policy; problem documents for everything refused; the OpenAPI
document."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio

from sojourn.actors import Agent, Client, Worker
from sojourn.broker import EmbeddedServer, Names
from sojourn.projections.listing import ListingService
from sojourn.projections.projector import Projector
from sojourn.projections.sqlite import SqliteModel
from sojourn.schemas.config import Settings
from sojourn.schemas.gateway import HTTP_STATUS, PROBLEM_TYPE
from tests.actors.gateway.conftest import (
    ADMIN_TOKEN,
    CLIENT_TOKEN,
    Files,
    GatewayProc,
    running_worker,
    start_gateway,
)
from tests.apps import http_agents
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for

AGENTS: list[Agent[Any, Any]] = [
    http_agents.echo_wait,
    http_agents.callback_wait,
    http_agents.chunky,
]


@pytest_asyncio.fixture
async def worker(
    nats_server: EmbeddedServer, settings: Settings, files: Files
) -> AsyncIterator[Worker]:
    w = await running_worker(nats_server, settings, files, AGENTS)
    try:
        yield w
    finally:
        await w.stop()


def problem(r: httpx.Response, code: str) -> dict[str, Any]:
    """The response is the problem document of ``code``, with that code's status."""
    assert r.headers["content-type"] == "application/problem+json", r.text
    body: dict[str, Any] = r.json()
    assert body["code"] == code, body
    assert r.status_code == HTTP_STATUS[code] == body["status"], body
    assert body["type"] == PROBLEM_TYPE + code
    assert body["title"] and body["detail"]
    return body


def cli(nats_server: EmbeddedServer, settings: Settings, *args: str) -> Any:
    done = subprocess.run(
        [
            PYTHON,
            "-m",
            "sojourn.actors.cli",
            *args,
            "--nats",
            nats_server.url,
            "--prefix",
            settings.prefix,
            "--json",
        ],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_start_twice_with_an_idempotency_key_is_one_run_and_http_equals_the_cli(
    http: httpx.AsyncClient,
    worker: Worker,
    client: Client,
    nats_server: EmbeddedServer,
    settings: Settings,
) -> None:
    key = {"Idempotency-Key": "order-4711"}
    first = await http.post("/v1/agents/echo-wait/runs", json={"n": 1}, headers=key)
    assert first.status_code == 201, first.text
    assert first.json() == {"run_id": "order-4711", "created": True, "queued": False}
    assert first.headers["location"] == "/v1/runs/order-4711"
    again = await http.post("/v1/agents/echo-wait/runs", json={"n": 2}, headers=key)
    assert again.status_code == 200, again.text
    assert again.json() == {"run_id": "order-4711", "created": False, "queued": False}

    async def waiting() -> bool:
        r = await http.get("/v1/runs/order-4711")
        return r.status_code == 200 and r.json()["status"] == "waiting"

    await wait_for(waiting, 60, what="the run waiting on go")
    sig = await http.post(
        "/v1/runs/order-4711/signals/go", json={"ok": True}, headers={"Idempotency-Key": "s-1"}
    )
    assert sig.status_code == 202, sig.text
    assert sig.json() == {"run_id": "order-4711", "signal": "go", "signal_id": "s-1"}
    output = await client.result("order-4711", timeout=60)
    assert output == {"input": {"n": 1}, "go": {"ok": True}}  # the second start changed nothing

    # The same signal id again is the same signal: nothing new in the history.
    before = await http.get("/v1/runs/order-4711/history")
    repeat = await http.post(
        "/v1/runs/order-4711/signals/go", json={"ok": False}, headers={"Idempotency-Key": "s-1"}
    )
    assert repeat.status_code == 202, repeat.text
    after = await http.get("/v1/runs/order-4711/history")
    assert after.json() == before.json()

    status = (await http.get("/v1/runs/order-4711")).json()
    shown = cli(nats_server, settings, "status", "order-4711")
    # The liveness judgement says when it was made: the one moment the two may differ in.
    assert status["liveness"].pop("checked_at") <= shown["liveness"].pop("checked_at")
    assert status == shown
    assert status["status"] == "completed" and status["output"] == output
    assert after.json() == cli(nats_server, settings, "history", "order-4711")
    starts = [e for d in after.json() for e in d["events"] if e["type"] == "run.started.v1"]
    assert len(starts) == 1


async def test_every_endpoint_but_callbacks_answers_401_without_a_bearer_token(
    gateway: GatewayProc,
) -> None:
    routes = [
        ("POST", "/v1/agents/echo-wait/runs"),
        ("GET", "/v1/runs"),
        ("GET", "/v1/runs/r1"),
        ("GET", "/v1/runs/r1/history"),
        ("POST", "/v1/runs/r1/signals/go"),
        ("POST", "/v1/runs/r1/cancel"),
        ("GET", "/v1/runs/r1/events"),
        ("GET", "/v1/runs/r1/stream"),
    ]
    bad = [
        {},
        {"Authorization": "Bearer not-a-token-we-know-of"},
        {"Authorization": f"Basic {CLIENT_TOKEN}"},
        {"Authorization": f"Bearer {CLIENT_TOKEN}x"},
        {"Authorization": f"Bearer {CLIENT_TOKEN[:-1]}"},
        {"Authorization": "Bearer " + "A" * 5000},
    ]
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as anon:
        for method, path in routes:
            for headers in bad:
                r = await anon.request(method, path, headers=headers, json={})
                problem(r, "unauthorized")
                assert r.headers["www-authenticate"].startswith("Bearer")
        # Callback URLs need no bearer token: their own token is checked (and refused here).
        r = await anon.post("/v1/callbacks/sjc1.k1.abc.def", json={})
        problem(r, "invalid_token")
        assert (await anon.get("/healthz")).status_code == 200
        assert (await anon.get("/v1/openapi.json")).status_code == 200


async def test_a_client_token_cannot_cancel_when_admin_only_says_so(
    nats_server: EmbeddedServer, settings: Settings, files: Files, worker: Worker
) -> None:
    g = await start_gateway(nats_server, settings, files, "--admin-only", "cancel")
    try:
        as_client = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
        as_admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with httpx.AsyncClient(base_url=g.url, timeout=30) as h:
            r = await h.post("/v1/agents/echo-wait/runs", json=1, headers=as_client)
            run_id = r.json()["run_id"]
            problem(await h.post(f"/v1/runs/{run_id}/cancel", headers=as_client), "forbidden")
            r = await h.get(f"/v1/runs/{run_id}", headers=as_client)
            assert not r.json()["cancel_requested"]  # the refused cancel touched nothing
            r = await h.post(f"/v1/runs/{run_id}/cancel", json={"reason": "x"}, headers=as_admin)
            assert r.status_code == 202, r.text

            async def cancelled() -> bool:
                r = await h.get(f"/v1/runs/{run_id}", headers=as_client)
                return bool(r.json()["status"] == "cancelled")

            await wait_for(cancelled, 60, what="the run cancelled")
    finally:
        g.stop()


async def test_refusals_are_problem_documents(
    http: httpx.AsyncClient, worker: Worker, gateway: GatewayProc
) -> None:
    problem(await http.get("/v1/runs/no-such-run"), "unknown_run")
    problem(await http.get("/v1/runs/no-such-run/history"), "unknown_run")
    problem(await http.get("/v1/runs/bad.id"), "invalid_run_id")
    problem(await http.get("/v1/nothing-here"), "not_found")
    problem(await http.delete("/v1/runs/r1"), "method_not_allowed")
    problem(await http.post("/v1/agents/nobody/runs", json=1), "unknown_agent")
    problem(await http.post("/v1/agents/bad.agent/runs", json=1), "unknown_agent")
    problem(
        await http.post("/v1/agents/echo-wait/runs", json=1, headers={"Idempotency-Key": "a b"}),
        "invalid_run_id",
    )
    problem(
        await http.post(
            "/v1/agents/echo-wait/runs",
            json=1,
            headers={"Idempotency-Key": "weekly-at20261201T000000Z"},  # a schedule's run id
        ),
        "invalid_run_id",
    )
    problem(
        await http.post(
            "/v1/agents/echo-wait/runs",
            content=b"{not json",
            headers={"Content-Type": "application/json"},
        ),
        "invalid_json",
    )
    problem(
        await http.post(
            "/v1/agents/echo-wait/runs", content=b"<x/>", headers={"Content-Type": "text/xml"}
        ),
        "unsupported_media_type",
    )
    big = b'"' + b"x" * (1 << 20) + b'"'
    problem(await http.post("/v1/agents/echo-wait/runs", content=big), "payload_too_large")
    r = await http.post("/v1/agents/echo-wait/runs", json={"v": 1})
    run_id = r.json()["run_id"]
    problem(await http.post(f"/v1/runs/{run_id}/signals/sojourn-child.x", json=1), "forbidden")
    problem(await http.post(f"/v1/runs/{run_id}/signals/a..b", json=1), "invalid_trigger")
    problem(
        await http.post(
            f"/v1/runs/{run_id}/signals/go", json=1, headers={"Idempotency-Key": "x" * 300}
        ),
        "invalid_header",
    )
    problem(
        await http.get(f"/v1/runs/{run_id}/stream", headers={"Last-Event-ID": "1" * 40}),
        "invalid_header",
    )
    problem(await http.get(f"/v1/runs/{run_id}/stream?after=-1"), "invalid_header")
    problem(await http.post(f"/v1/runs/{run_id}/cancel", json={"why": 1}), "invalid_trigger")
    problem(await http.get("/v1/runs?status=sleeping"), "invalid_query")
    problem(await http.get("/v1/runs?limit=0"), "invalid_query")
    problem(await http.get("/v1/runs?colour=red"), "invalid_query")
    # The run is untouched by all of that: still waiting for go.
    status = (await http.get(f"/v1/runs/{run_id}")).json()
    assert status["status"] in ("pending", "running", "waiting")
    assert status["buffered_signals"] == []
    # A signal to an ended run is refused as the intake refuses it.
    await http.post(f"/v1/runs/{run_id}/signals/go", json="done")

    async def completed() -> bool:
        return bool((await http.get(f"/v1/runs/{run_id}")).json()["status"] == "completed")

    await wait_for(completed, 60, what="the run completed")
    problem(await http.post(f"/v1/runs/{run_id}/signals/go", json=2), "run_ended")


async def test_hostile_json_bodies_are_refused_with_their_reason(
    http: httpx.AsyncClient, worker: Worker, gateway: GatewayProc
) -> None:
    """The gateway reads a body as the intake does (one gate, ``schemas.guard``): whatever the
    bytes, a problem naming why, and the gateway carries on."""
    json_type = {"Content-Type": "application/json"}
    for body, code in [
        (b"\xff\xfe{", "invalid_encoding"),
        (b'{"v": "\\ud800"}', "invalid_encoding"),
        (b"[" * 100_000 + b"]" * 100_000, "too_deep"),
        (b"[" * 65 + b"]" * 65, "too_deep"),
        (b'{"v": 1, "v": 2}', "duplicate_key"),
        (b'{"v": 1e400}', "out_of_range"),
        (b'{"v": 99999999999999999999999}', "out_of_range"),
        (b'{"v": NaN}', "invalid_json"),
    ]:
        r = await http.post("/v1/agents/echo-wait/runs", content=body, headers=json_type)
        problem(r, code)
    ok = await http.post("/v1/agents/echo-wait/runs", content=b"[" * 64 + b"]" * 64)
    assert ok.status_code == 201, ok.text
    run_id = ok.json()["run_id"]
    deep = b'{"a":' * 65 + b"1" + b"}" * 65
    problem(await http.post(f"/v1/runs/{run_id}/signals/go", content=deep), "too_deep")


async def test_the_openapi_document_names_every_route_and_resolves_every_ref(
    gateway: GatewayProc,
) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as h:
        doc = (await h.get("/v1/openapi.json")).json()
    printed = await asyncio.to_thread(
        subprocess.run,
        [PYTHON, "-m", "sojourn.actors.cli", "gateway", "--openapi"],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(printed.stdout) == doc
    assert doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) == {
        "/v1/agents/{agent}/runs",
        "/v1/runs",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/history",
        "/v1/runs/{run_id}/steps",
        "/v1/runs/{run_id}/signals/{name}",
        "/v1/runs/{run_id}/updates/{name}",
        "/v1/runs/{run_id}/cancel",
        "/v1/runs/{run_id}/fork",
        "/v1/runs/{run_id}/terminate",
        "/v1/runs/{run_id}/resume",
        "/v1/runs/{run_id}/budget",
        "/v1/runs/{run_id}/pause",
        "/v1/runs/{run_id}/unpause",
        "/v1/agents/{agent}/{verb}",
        "/v1/schedules/{name}/{verb}",
        "/v1/runs/{run_id}/events",
        "/v1/runs/{run_id}/stream",
        "/v1/callbacks/{token}",
        "/v1/webhooks/{route}/{token}",
    }
    schemas = doc["components"]["schemas"]

    def refs(node: Any) -> list[str]:
        if isinstance(node, dict):
            found = [node["$ref"]] if "$ref" in node else []
            return found + [r for v in node.values() for r in refs(v)]
        if isinstance(node, list):
            return [r for v in node for r in refs(v)]
        return []

    all_refs = refs(doc)
    assert all_refs
    for ref in all_refs:
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas, ref
    for name in ("Problem", "StartAnswer", "SignalAnswer", "CallbackAnswer", "RunView"):
        assert name in schemas


async def test_the_listing_over_http_is_the_read_sides(
    http: httpx.AsyncClient,
    worker: Worker,
    client: Client,
    nats_server: EmbeddedServer,
    settings: Settings,
    tmp_path: Path,
) -> None:
    # No projector yet: the read side is unavailable, said as such.
    problem(await http.get("/v1/runs"), "unavailable")
    names = Names(settings.prefix)
    model = await SqliteModel.open(tmp_path / "m.sqlite3", events_stream=names.events_stream)
    projector = Projector(nats=nats_server.url, settings=settings, sink=model, interval=0.2)
    await projector.start()
    service = ListingService(client.broker, names, model)
    await service.start()
    try:
        ids = []
        for i in range(3):
            r = await http.post(
                "/v1/agents/echo-wait/runs", json=i, headers={"Idempotency-Key": f"l{i}"}
            )
            ids.append(r.json()["run_id"])
        await http.post("/v1/runs/l0/signals/go", json=None)

        async def listed() -> bool:
            r = await http.get("/v1/runs?agent=echo-wait&status=completed")
            return r.status_code == 200 and [v["run_id"] for v in r.json()["runs"]] == ["l0"]

        await wait_for(listed, 60, what="the completed run listed")
        r = await http.get("/v1/runs?agent=echo-wait&status=waiting,pending,running&limit=1")
        body = r.json()
        assert len(body["runs"]) == 1 and body["next"]
        page2 = await http.get(f"/v1/runs?agent=echo-wait&limit=1&after={body['next']}")
        assert (
            page2.status_code == 200
            and page2.json()["runs"][0]["run_id"] != body["runs"][0]["run_id"]
        )
        page = await client.runs(agent="echo-wait")
        everything = (await http.get("/v1/runs?agent=echo-wait")).json()["runs"]
        assert {v["run_id"] for v in everything} == {v.run_id for v in page.runs} == set(ids)
    finally:
        await service.stop()
        await projector.stop()
        await model.close()


async def test_a_broker_outage_is_503_and_the_gateway_carries_on_after_it(
    own_server: EmbeddedServer, settings: Settings, files: Files
) -> None:
    """The nats-server SIGKILLed under a running gateway: requests are answered ``unavailable``
    (never hang, never 500) and, once the server is back on its store, served again."""
    g = await start_gateway(own_server, settings, files)
    worker = await running_worker(own_server, settings, files, AGENTS)
    try:
        headers = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
        async with httpx.AsyncClient(base_url=g.url, headers=headers, timeout=60) as h:
            r = await h.post("/v1/agents/echo-wait/runs", json=1, headers={"Idempotency-Key": "o1"})
            assert r.status_code == 201, r.text
            own_server.kill()
            down = await h.post(
                "/v1/agents/echo-wait/runs", json=2, headers={"Idempotency-Key": "o2"}
            )
            problem(down, "unavailable")
            problem(await h.get("/v1/runs/o1"), "unavailable")
            await own_server.start()

            async def served() -> bool:
                r = await h.post(
                    "/v1/runs/o1/signals/go", json="back", headers={"Idempotency-Key": "g1"}
                )
                return r.status_code == 202

            await wait_for(served, 90, interval=0.5, what="the gateway serving again")

            async def completed() -> bool:
                r = await h.get("/v1/runs/o1")
                return r.status_code == 200 and r.json()["status"] == "completed"

            await wait_for(completed, 90, what="the run completed after the outage")
            assert (await h.get("/v1/runs/o1")).json()["output"] == {"input": 1, "go": "back"}
    finally:
        await worker.stop()
        g.stop()


async def test_signals_and_cancels_for_a_run_nobody_knows_are_404_at_once(
    http: httpx.AsyncClient,
) -> None:
    problem(await http.post("/v1/runs/ghost/signals/go", json=1), "unknown_run")
    problem(await http.post("/v1/runs/ghost/cancel"), "unknown_run")
    problem(await http.get("/v1/runs/ghost/stream"), "unknown_run")
    problem(await http.get("/v1/runs/ghost/events"), "unknown_run")


async def test_a_cancel_for_a_run_that_ended_says_so_and_writes_nothing(
    http: httpx.AsyncClient, worker: Worker, client: Client
) -> None:
    """202 "cancel requested" for a run that is over would be untrue (the CLI says "already
    ended: nothing to cancel"): 409 run_ended, and the history is what it was."""
    assert (
        await http.post("/v1/agents/echo-wait/runs", json=7, headers={"Idempotency-Key": "e1"})
    ).status_code == 201
    await client.signal("e1", "go", "now")
    assert await client.result("e1", timeout=60) == {"input": 7, "go": "now"}
    before = (await http.get("/v1/runs/e1/history")).json()
    body = problem(await http.post("/v1/runs/e1/cancel", json={"reason": "late"}), "run_ended")
    assert body["run_id"] == "e1" and "completed" in body["detail"]
    assert (await http.get("/v1/runs/e1/history")).json() == before
    assert (await http.get("/v1/runs/e1")).json()["status"] == "completed"
