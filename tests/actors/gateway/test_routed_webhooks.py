"""Routed webhooks through a real gateway process (issue 31, Proof): a signed webhook delivered
three times (the provider's retries) starts one run; a routed one wakes the right run by its
body's order id; a wrong signature touches nothing (the inbox and the events stream stay as
they were). Hostile bodies (no field, a field that is no run id, not JSON) are refused with
their problem code, and write nothing either."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest_asyncio

from sojourn.actors import Agent, Client, Context, Worker, agent
from sojourn.actors.gateway import parse_route
from sojourn.actors.gateway._webhooks import sign
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.events import RunStarted, SignalReceived
from tests.actors.gateway.conftest import Files, GatewayProc, running_worker, start_gateway
from tests.actors.gateway.test_callbacks import http_records
from tests.actors.gateway.test_gateway import problem
from tests.conftest import wait_for

ORDERS_SECRET = "whsec_" + "orders-secret" * 3
SHIP_SECRET = "ship-secret-" + "y" * 20
ORDERS = f"orders=stripe:{ORDERS_SECRET};start=order-flow;id=/data/object/id;prefix=order-"
SHIPPING = f"shipping=hmac-sha256:{SHIP_SECRET};signal=shipment.update;id=order.id;prefix=order-"
JSON = {"Content-Type": "application/json"}


@agent("order-flow")
async def order_flow(ctx: Context, event: dict[str, Any]) -> dict[str, Any]:
    """A run per order: started by the provider's webhook, woken by the shipper's."""
    shipped = await ctx.wait_for("shipment.update")
    return {"order": event["data"]["object"]["id"], "shipped": shipped}


AGENTS: list[Agent[Any, Any]] = [order_flow]


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
async def gateway(
    nats_server: EmbeddedServer, settings: Settings, files: Files
) -> AsyncIterator[GatewayProc]:
    g = await start_gateway(
        nats_server,
        settings,
        files,
        "--webhook",
        ORDERS.replace(ORDERS_SECRET, "env:ORDERS_SECRET"),
        "--webhook",
        SHIPPING.replace(SHIP_SECRET, "env:SHIP_SECRET"),
        ORDERS_SECRET=ORDERS_SECRET,
        SHIP_SECRET=SHIP_SECRET,
    )
    try:
        yield g
    finally:
        g.stop()


async def last_seqs(client: Client) -> tuple[int, int]:
    """The inbox's and the events stream's last sequences."""
    names = client.names
    out = []
    for stream in (names.inbox_stream, names.events_stream):
        info = await client.broker.api(f"$JS.API.STREAM.INFO.{stream}")
        out.append(int(info["state"]["last_seq"]))
    return out[0], out[1]


async def run_subjects(client: Client) -> set[str]:
    """The run ids with a history in the events stream."""
    names = client.names
    info = await client.broker.api(
        f"$JS.API.STREAM.INFO.{names.events_stream}",
        {"subjects_filter": f"{settings_prefix(client)}.ev.>"},
    )
    return {s.rsplit(".", 1)[1] for s in (info["state"].get("subjects") or {})}


def settings_prefix(client: Client) -> str:
    return client.settings.prefix


def order_event(order: str, kind: str = "checkout.session.completed") -> bytes:
    return msgspec.json.encode(
        {"id": f"evt_{order}", "type": kind, "data": {"object": {"id": order}}}
    )


async def test_a_signed_webhook_delivered_three_times_starts_one_run_and_a_routed_one_wakes_it(
    gateway: GatewayProc, worker: Worker, client: Client
) -> None:
    orders, shipping = parse_route(ORDERS), parse_route(SHIPPING)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as anon:
        bodies = {o: order_event(o) for o in ("A1", "B2")}
        for order, body in bodies.items():
            answers = []
            for _ in range(3):  # the provider retries: each delivery signed anew
                r = await anon.post(
                    "/v1/webhooks/orders",
                    content=body,
                    headers={**JSON, **sign(orders, body, time.time())},
                )
                assert r.status_code in (200, 201, 202), r.text
                answers.append(r.json())
            assert {a["run_id"] for a in answers} == {f"order-{order}"}
            assert [a["created"] for a in answers][1:] == [False, False]
        assert await run_subjects(client) == {"order-A1", "order-B2"}
        for order in bodies:
            history = await client.history(f"order-{order}")
            started = [e for d in history for e in d.events if isinstance(e, RunStarted)]
            assert len(started) == 1

        async def waiting(run_id: str) -> bool:
            return await client.status(run_id) == "waiting"

        await wait_for(lambda: waiting("order-B2"), 60, what="order B2 waiting")
        await wait_for(lambda: waiting("order-A1"), 60, what="order A1 waiting")
        # The shipper's webhook names the order in its body: B2's run wakes, A1's does not.
        update = msgspec.json.encode({"order": {"id": "B2"}, "carrier": "dhl"})
        for _ in range(2):  # a retry is the same signal
            r = await anon.post(
                "/v1/webhooks/shipping",
                content=update,
                headers={**JSON, **sign(shipping, update, time.time())},
            )
            assert r.status_code == 202, r.text
            assert r.json()["run_id"] == "order-B2"
    result = await client.result("order-B2", timeout=60)
    assert result == {"order": "B2", "shipped": {"order": {"id": "B2"}, "carrier": "dhl"}}
    assert await client.status("order-A1") == "waiting"
    received = [
        e
        for d in await client.history("order-B2")
        for e in d.events
        if isinstance(e, SignalReceived)
    ]
    assert len(received) == 1


async def test_a_wrong_signature_or_a_hostile_body_touches_nothing(
    gateway: GatewayProc, worker: Worker, client: Client
) -> None:
    orders, shipping = parse_route(ORDERS), parse_route(SHIPPING)
    wrong = parse_route(ORDERS.replace(ORDERS_SECRET, "whsec_" + "w" * 30))
    body = order_event("C3")
    before = await last_seqs(client)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as anon:
        now = time.time()
        problem(
            await anon.post(
                "/v1/webhooks/orders", content=body, headers={**JSON, **sign(wrong, body, now)}
            ),
            "invalid_signature",
        )
        problem(
            await anon.post(
                "/v1/webhooks/orders",
                content=body,
                headers={**JSON, **sign(orders, body, now - 3600)},
            ),
            "stale_webhook",
        )
        problem(
            await anon.post("/v1/webhooks/orders", content=body, headers=JSON),
            "missing_signature",
        )
        problem(await anon.post("/v1/webhooks/nope", content=body), "unknown_webhook")

        async def signed(route_name: str, content: bytes) -> httpx.Response:
            route = orders if route_name == "orders" else shipping
            headers = {**JSON, **sign(route, content, time.time())}
            return await anon.post(f"/v1/webhooks/{route_name}", content=content, headers=headers)

        # Verified, but hostile: each refused with its code, nothing written.
        no_field = msgspec.json.encode({"data": {"object": {}}})
        problem(await signed("orders", no_field), "missing_field")
        problem(await signed("orders", b"[1, 2, 3]"), "missing_field")
        problem(await signed("orders", b""), "missing_field")
        problem(await signed("orders", order_event("not a run id!")), "invalid_run_id")
        problem(await signed("orders", order_event("x-c1")), "invalid_run_id")  # a child's form
        flag = msgspec.json.encode({"data": {"object": {"id": True}}})
        problem(await signed("orders", flag), "missing_field")
        problem(
            await signed("orders", b'{"data": {"object": {"id": "a", "id": "b"}}}'), "duplicate_key"
        )
        problem(await signed("orders", b"{not json"), "invalid_json")
        assert await last_seqs(client) == before
        # A verified signal for an order no run has is refused by the intake (it reached the
        # inbox, and nothing else).
        unknown = msgspec.json.encode({"order": {"id": 7}})
        problem(await signed("shipping", unknown), "unknown_run")
    assert (await last_seqs(client))[1] == before[1]
    codes = [r.code for r in await http_records(client)]
    for code in ("invalid_signature", "stale_webhook", "missing_signature", "missing_field"):
        assert code in codes
