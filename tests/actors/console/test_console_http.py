"""Browser auth over real HTTP (a ``sojourn gateway`` process, a worker, the read side): a
sign-in sets an HttpOnly, SameSite=Strict cookie; a request with the cookie and without its
CSRF token is refused and changes nothing; the role is the token's; CORS stays closed unless
an origin is named; the console's pages and read models."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

import httpx

from sojourn.actors import Client, Worker
from sojourn.actors.gateway._flow import START_HEADERS
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.events import BudgetChanged, CancelRequested, SignalReceived
from sojourn.schemas.gateway import HTTP_STATUS
from tests.actors.console.conftest import (
    ADMIN_NAME,
    ADMIN_TOKEN,
    CLIENT_NAME,
    CLIENT_TOKEN,
    ReadSide,
)
from tests.actors.gateway.conftest import Files, GatewayProc, start_gateway
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for


def problem(r: httpx.Response, code: str) -> dict[str, Any]:
    assert r.headers["content-type"] == "application/problem+json", r.text
    body: dict[str, Any] = r.json()
    assert body["code"] == code and r.status_code == HTTP_STATUS[code], body
    return body


async def sign_in(h: httpx.AsyncClient, token: str) -> dict[str, Any]:
    r = await h.post("/ui/session", json={"token": token})
    assert r.status_code == 200, r.text
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert token not in cookie and token not in r.text
    body: dict[str, Any] = r.json()
    return body


async def waiting_for_approval(client: Client, h: httpx.AsyncClient, run_id: str) -> None:
    async def waiting() -> bool:
        state = await client.state(run_id)
        return "signal:approval.refund" in state.waiting_on

    await wait_for(waiting, 60, what=f"{run_id} waiting on its approval")


async def test_a_cookie_request_without_its_csrf_token_is_refused_and_changes_nothing(
    anonymous: httpx.AsyncClient, worker: Worker, client: Client
) -> None:
    h = anonymous
    problem(await h.post("/ui/session", json={"token": "x" * 30}), "unauthorized")
    problem(
        await h.post("/ui/session", content=f"token={ADMIN_TOKEN}".encode()),
        "unsupported_media_type",
    )
    me = await sign_in(h, ADMIN_TOKEN)
    assert me["name"] == ADMIN_NAME and me["role"] == "admin" and "operate" in me["actions"]
    who = await h.get("/ui/session")
    assert who.json()["csrf"] == me["csrf"]
    # Reads with the cookie alone work (EventSource can send nothing else).
    started = await h.post(
        "/v1/agents/refunds/runs",
        json=7,
        headers={"Idempotency-Key": "csrf-1", "X-CSRF-Token": me["csrf"]},
    )
    assert started.status_code == 201, started.text
    await waiting_for_approval(client, h, "csrf-1")
    before = await client.history("csrf-1")
    assert (await h.get("/v1/runs/csrf-1")).status_code == 200

    # Every state-changing route, with the cookie and no CSRF token, or a wrong one, or from
    # another site: refused, nothing recorded.
    forged = [
        ("/v1/runs/csrf-1/signals/approval.refund", {"approve": True}),
        ("/v1/runs/csrf-1/cancel", None),
        ("/v1/runs/csrf-1/terminate", None),
        ("/v1/runs/csrf-1/budget", {"usd": 5}),
        ("/v1/agents/refunds/runs", 8),
    ]
    for path, body in forged:
        problem(await h.post(path, json=body), "invalid_csrf")
        problem(await h.post(path, json=body, headers={"X-CSRF-Token": "A" * 32}), "invalid_csrf")
        problem(
            await h.post(
                path,
                json=body,
                headers={"X-CSRF-Token": me["csrf"], "Origin": "https://evil.example"},
            ),
            "invalid_csrf",
        )
    assert await client.history("csrf-1") == before
    assert await client.history("8") == []
    # With the token, the same request goes through, recorded as the token's name.
    ok = await h.post(
        "/v1/runs/csrf-1/signals/approval.refund",
        json={"approve": True, "by": ADMIN_NAME},
        headers={"X-CSRF-Token": me["csrf"]},
    )
    assert ok.status_code == 202, ok.text

    async def completed() -> bool:
        return await client.status("csrf-1") == "completed"

    await wait_for(completed, 60, what="the approved run completed")
    signals = [
        e for d in await client.history("csrf-1") for e in d.events if isinstance(e, SignalReceived)
    ]
    assert [s.sent_by for s in signals] == [ADMIN_NAME]
    # Signed out: the cookie is cleared, and a forged or stale cookie is no session.
    out = await h.post("/ui/session/end", headers={"X-CSRF-Token": me["csrf"]})
    assert out.status_code == 204 and "Max-Age=0" in out.headers["set-cookie"]
    h.cookies.clear()
    h.cookies.set("sojourn_session", "s1.forged")
    problem(await h.get("/v1/runs/csrf-1"), "unauthorized")


async def test_a_client_session_has_the_client_role(
    anonymous: httpx.AsyncClient, worker: Worker, client: Client
) -> None:
    h = anonymous
    me = await sign_in(h, CLIENT_TOKEN)
    assert me["name"] == CLIENT_NAME and me["role"] == "client"
    assert "operate" not in me["actions"] and "signal" in me["actions"]
    csrf = {"X-CSRF-Token": me["csrf"]}
    r = await h.post("/v1/agents/refunds/runs", json=1, headers={**csrf, "Idempotency-Key": "c1"})
    assert r.status_code == 201, r.text
    await waiting_for_approval(client, h, "c1")
    before = await client.history("c1")
    for path, body in [
        ("/v1/runs/c1/terminate", None),
        ("/v1/runs/c1/resume", None),
        ("/v1/runs/c1/budget", {"usd": 1}),
    ]:
        problem(await h.post(path, json=body, headers=csrf), "forbidden")
    assert await client.history("c1") == before
    # The bearer path is unchanged, and wins over a cookie.
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    r = await h.post("/v1/runs/c1/budget", json={"usd": 1}, headers=admin)
    assert r.status_code == 202, r.text
    problem(await h.post("/v1/runs/c1/budget", json={"usd": -1}, headers=admin), "invalid_trigger")
    problem(await h.post("/v1/runs/c1/budget", json={}, headers=admin), "invalid_trigger")
    problem(
        await h.post("/v1/runs/c1/budget", json={"usd": 1, "x": 2}, headers=admin),
        "invalid_trigger",
    )
    problem(await h.post("/v1/schedules/nope/pause", headers=admin), "unknown_schedule")
    r = await h.post("/v1/runs/c1/terminate", json={"reason": "enough"}, headers=admin)
    assert r.status_code == 202, r.text

    async def cancelled() -> bool:
        return await client.status("c1") == "cancelled"

    await wait_for(cancelled, 60, what="the terminated run cancelled")
    asked = [
        e for d in await client.history("c1") for e in d.events if isinstance(e, CancelRequested)
    ]
    assert [(e.by, e.terminate) for e in asked] == [(ADMIN_NAME, True)]
    changed = [
        e for d in await client.history("c1") for e in d.events if isinstance(e, BudgetChanged)
    ]
    assert [(e.by, e.budget.usd) for e in changed] == [(ADMIN_NAME, 1.0)]
    problem(await h.post("/v1/runs/c1/terminate", headers=admin), "run_ended")


async def test_cors_is_closed_by_default_and_open_to_named_origins(
    gateway: GatewayProc, nats_server: EmbeddedServer, settings: Settings, files: Files
) -> None:
    bearer = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as h:
        r = await h.get("/v1/runs/x", headers={**bearer, "Origin": "https://app.example.com"})
        assert not any(k.lower().startswith("access-control-") for k in r.headers)
        pre = await h.options(
            "/v1/runs/x",
            headers={
                "Origin": "https://app.example.com",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization",
            },
        )
        assert not any(k.lower().startswith("access-control-") for k in pre.headers)
    opened = await start_gateway(
        nats_server, settings, files, "--cors-origin", "https://app.example.com"
    )
    try:
        async with httpx.AsyncClient(base_url=opened.url, timeout=30) as h:
            r = await h.get("/v1/runs/x", headers={**bearer, "Origin": "https://app.example.com"})
            assert r.headers["access-control-allow-origin"] == "https://app.example.com"
            assert "access-control-allow-credentials" not in r.headers
            other = await h.get("/v1/runs/x", headers={**bearer, "Origin": "https://evil.example"})
            assert "access-control-allow-origin" not in other.headers
            pre = await h.options(
                "/v1/runs/x",
                headers={
                    "Origin": "https://app.example.com",
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "authorization,content-type",
                },
            )
            assert pre.status_code == 200
            assert pre.headers["access-control-allow-origin"] == "https://app.example.com"
            # every header a start may carry may be sent from there too
            asked = "authorization,content-type,idempotency-key,traceparent," + ",".join(
                h.lower() for h in START_HEADERS
            )
            pre = await h.options(
                "/v1/agents/a/runs",
                headers={
                    "Origin": "https://app.example.com",
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": asked,
                },
            )
            assert pre.status_code == 200, pre.text
            allowed = {
                x.strip().lower() for x in pre.headers["access-control-allow-headers"].split(",")
            }
            assert set(asked.split(",")) <= allowed, allowed
    finally:
        opened.stop()


async def test_the_console_pages_and_its_read_models(
    gateway: GatewayProc,
    anonymous: httpx.AsyncClient,
    worker: Worker,
    client: Client,
    read_side: ReadSide,
) -> None:
    h = anonymous
    told = await asyncio.to_thread(
        subprocess.run,
        [PYTHON, "-m", "sojourn.actors.cli", "console", "--url", gateway.url],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert told.returncode == 0 and f"console: {gateway.url}/ui/" in told.stdout, told
    page = await h.get("/ui/")
    assert page.status_code == 200 and "/ui/static/app.js" in page.text
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    for asset in ("app.js", "app.css", "vendor/htm-preact-standalone.js"):
        assert (await h.get(f"/ui/static/{asset}")).status_code == 200
    problem(await h.get("/ui/static/../_app.py"), "not_found")
    problem(await h.get("/ui/api/approvals"), "unauthorized")
    me = await sign_in(h, CLIENT_TOKEN)
    csrf = {"X-CSRF-Token": me["csrf"]}
    for i in (1, 2):
        r = await h.post(
            "/v1/agents/refunds/runs", json=i, headers={**csrf, "Idempotency-Key": f"inbox-{i}"}
        )
        assert r.status_code == 201, r.text
        await waiting_for_approval(client, h, f"inbox-{i}")

    async def both_in_the_inbox() -> bool:
        r = await h.get("/ui/api/approvals")
        return r.status_code == 200 and [a["run_id"] for a in r.json()["approvals"]] == [
            "inbox-1",
            "inbox-2",
        ]

    await wait_for(both_in_the_inbox, 60, what="both runs in the approvals inbox, oldest first")
    inbox = (await h.get("/ui/api/approvals")).json()["approvals"]
    assert inbox[0]["approval"] == "refund" and inbox[0]["deadline"] > inbox[0]["waiting_since"]

    t = (await h.get("/ui/api/runs/inbox-1/timeline")).json()
    assert t["status"] == "waiting" and "signal:approval.refund" in t["waiting_on"]
    steps = [i for i in t["items"] if i["kind"] == "step"]
    assert [s["name"] for s in steps] == ["look_up", "llm:scripted-large"]
    assert all(s["attempts"][0]["outcome"] == "completed" for s in steps)
    assert steps[0]["attempts"][0]["duration"] >= 0.05
    llm = steps[1]
    assert llm["step_kind"] == "llm" and llm["usage"]["usd"] > 0.01
    assert llm["usage"]["input_tokens"] > 0 and llm["usage"]["output_tokens"] > 0
    spend = {s["limit"]: s for s in t["spend"]}
    assert spend["usd"]["used"] == llm["usage"]["usd"] and spend["steps"]["used"] == 2
    assert [i["kind"] for i in t["items"]][-1] == "wait"
    problem(await h.get("/ui/api/runs/nope/timeline"), "unknown_run")
    problem(await h.get("/ui/api/runs/a.b/timeline"), "invalid_run_id")
    # Listing filters: liveness and since.
    r = await h.get("/v1/runs?agent=refunds&liveness=waiting&since=0")
    assert r.status_code == 200 and {v["run_id"] for v in r.json()["runs"]} <= {
        "inbox-1",
        "inbox-2",
    }
    problem(await h.get("/v1/runs?liveness=sleepy"), "invalid_query")
    problem(await h.get("/v1/runs?since=yesterday"), "invalid_query")
    for path in ("/ui/api/workers", "/ui/api/schedules", "/ui/api/dead-letters"):
        r = await h.get(path)
        assert r.status_code == 200, (path, r.text)
    workers = (await h.get("/ui/api/workers")).json()["workers"]
    assert any("refunds" in w["agents"] for w in workers)
