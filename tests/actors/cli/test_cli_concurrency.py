"""``sojourn start --concurrency-key/--concurrency-limit``, ``sojourn status`` of a queued run
and ``sojourn queue`` (decision 0048), as real subprocesses against the session's
nats-server."""

from __future__ import annotations

import json

import pytest

from sojourn.actors import Client, Worker
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from tests.actors.cli.test_cli import deployment, sojourn
from tests.apps.concurrency import keyed_wait
from tests.conftest import wait_for

pytestmark = pytest.mark.usefixtures("processes")  # the sojourn CLI in processes of its own


async def test_cli_concurrency_key_status_and_queue(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    dep = deployment(nats_server, settings)
    key = ("--concurrency-key", "tenant-9", "--concurrency-limit", "1")
    async with Worker([keyed_wait], nats=nats_server.url, settings=settings):
        for n in range(3):
            res = await sojourn(
                "start", "keyed_wait", "--input", f'"t{n}"', "--run-id", f"q{n}", *key, *dep
            )
            assert res.rc == 0 and "accepted: new run" in res.out, res

        async def first_waits() -> bool:
            return await client.status("q0") == "waiting"

        await wait_for(first_waits, timeout=30, what="q0 to hold the slot")
        status = await sojourn("status", "q2", *dep)
        assert status.rc == 0 and "pending" in status.out, status
        assert "queued on key tenant-9, position 2" in status.out, status
        js = await sojourn("status", "q1", "--json", *dep)
        body = json.loads(js.out)
        assert (
            body["status"] == "pending" and body["detail"] == "queued on key tenant-9, position 1"
        )
        assert body["queue"] == {"key": "tenant-9", "position": 1}
        listing = await sojourn("queue", "tenant-9", "--agent", "keyed_wait", *dep)
        assert listing.rc == 0 and "1 of 1 slots held, 2 queued" in listing.out, listing
        assert listing.out.index("q1") < listing.out.index("q2")
        as_json = json.loads(
            (await sojourn("queue", "tenant-9", "--agent", "keyed_wait", "--json", *dep)).out
        )
        assert [q["run_id"] for q in as_json["queued"]] == ["q1", "q2"]
        lone = await sojourn(
            "start", "keyed_wait", "--input", '"x"', "--concurrency-key", "k", *dep
        )
        assert lone.rc == 2 and "--concurrency-limit" in lone.err, lone
        bad = await sojourn(
            "start", "keyed_wait", "--input", '"x"', *key[:2], "--concurrency-limit", "0", *dep
        )
        assert bad.rc == 2 and "--concurrency-limit" in bad.err, bad
        for rid in ("q0", "q1", "q2"):

            async def waiting(rid: str = rid) -> bool:
                return await client.status(rid) == "waiting"

            await wait_for(waiting, timeout=30, what=f"{rid} to hold the slot")
            await client.signal(rid, "go")
            assert await client.result(rid, timeout=30) == f"t{rid[1]}"
