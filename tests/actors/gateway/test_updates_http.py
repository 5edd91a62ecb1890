"""``POST /v1/runs/{id}/updates/{name}`` (decision 0042) through a real ``sojourn gateway``
process: the run's answer, the same answer for the same ``Idempotency-Key`` (applied once),
and a problem document for each refusal; and ``sojourn update`` on the command line."""

from __future__ import annotations

import asyncio
import json
import subprocess

import httpx

from sojourn.actors import Client, Worker
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.events import UpdateCompleted
from tests.actors.gateway.conftest import Files, running_worker
from tests.actors.gateway.test_gateway import problem
from tests.apps import updates as apps
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for


async def test_updates_over_http_and_the_cli(
    http: httpx.AsyncClient,
    client: Client,
    nats_server: EmbeddedServer,
    settings: Settings,
    files: Files,
) -> None:
    worker: Worker = await running_worker(nats_server, settings, files, [apps.cart])
    try:
        run_id = await client.start("cart", "http", run_id="cart-http", wait=True)

        async def parked() -> bool:
            return (await client.state(run_id)).status == "waiting"

        await wait_for(parked, 60, what="the run to wait")
        key = {"Idempotency-Key": "add-milk"}
        answers = [
            await http.post(f"/v1/runs/{run_id}/updates/add", json="milk", headers=key)
            for _ in range(3)
        ]
        for r in answers:
            assert r.status_code == 200, r.text
            assert r.json() == {
                "run_id": run_id,
                "update_id": "add-milk",
                "name": "add",
                "ok": True,
                "answer": {"count": 1, "items": ["milk"]},
                "code": None,
                "message": "",
            }
        history = await client.history(run_id)
        done = [e for d in history for e in d.events if isinstance(e, UpdateCompleted)]
        assert [e.update_id for e in done] == ["add-milk"]  # three requests, applied once
        assert done[0].sent_by is None  # the client token has no name: the gateway's user

        problem(await http.post(f"/v1/runs/{run_id}/updates/add", json=""), "update_rejected")
        problem(await http.post(f"/v1/runs/{run_id}/updates/nosuch", json=1), "unknown_update")
        problem(await http.post(f"/v1/runs/{run_id}/updates/explode"), "update_failed")
        problem(
            await http.post(
                f"/v1/runs/{run_id}/updates/add", json="x", headers={"Idempotency-Key": "a b"}
            ),
            "invalid_header",
        )
        problem(
            await http.post(
                f"/v1/runs/{run_id}/updates/add",
                content=b"{not json",
                headers={"Content-Type": "application/json"},
            ),
            "invalid_json",
        )

        # The CLI: the same update, the same answer; a new one applied on the same state.
        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [
                    PYTHON,
                    "-m",
                    "sojourn.actors.cli",
                    "update",
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

        same = await asyncio.to_thread(
            cli, run_id, "add", "--payload", '"milk"', "--id", "add-milk"
        )
        assert same.returncode == 0, same.stderr
        assert json.loads(same.stdout)["answer"] == {"count": 1, "items": ["milk"]}
        plan = await asyncio.to_thread(cli, run_id, "plan")
        assert plan.returncode == 0, plan.stderr
        assert json.loads(plan.stdout)["answer"] == "2 items for http"  # milk and boom
        refused = await asyncio.to_thread(cli, run_id, "add", "--payload", '""')
        assert refused.returncode == 1, refused.stdout
        assert json.loads(refused.stdout)["code"] == "rejected"

        await client.signal(run_id, "checkout")
        assert await client.result(run_id, timeout=60) == ["milk", "boom"]
        problem(await http.post(f"/v1/runs/{run_id}/updates/add", json="late"), "run_ended")
        problem(await http.post("/v1/runs/nobody/updates/add", json="x"), "unknown_run")
    finally:
        await worker.stop()
