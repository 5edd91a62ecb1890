"""The console in a real browser (headless Chromium, Debian's, driven by Selenium) against a
real gateway process, worker, projector and nats-server: sign in, find the run waiting on an
approval in the inbox, open its timeline (steps with durations, the model call's cost),
approve it and see it complete on the same page without a reload; a client-role session is
offered no admin-only action. The screenshots in docs/img are taken here, so they stay true."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import msgspec
import pytest

from sojourn.actors import Client, Worker
from sojourn.broker import EmbeddedServer
from sojourn.schemas import events as ev
from sojourn.schemas.config import Settings
from tests.actors.console import agents
from tests.actors.console.conftest import (
    ADMIN_TOKEN,
    CLIENT_TOKEN,
    Browser,
    ReadSide,
)
from tests.actors.gateway.conftest import Files, GatewayProc, running_worker
from tests.conftest import ROOT, wait_for
from tests.procs import WorkerProc

IMG = ROOT / "docs" / "img"

pytestmark = pytest.mark.timeout(240)


def css(selector: str) -> tuple[str, str]:
    return ("css selector", selector)


async def start(
    h: httpx.AsyncClient, client: Client, run_id: str, order: int, **headers: str
) -> None:
    headers["Idempotency-Key"] = run_id
    r = await h.post("/v1/agents/refunds/runs", json=order, headers=headers)
    assert r.status_code in (201, 202), r.text

    async def waiting() -> bool:
        return "signal:approval.refund" in (await client.state(run_id)).waiting_on

    await wait_for(waiting, 60, what=f"{run_id} waiting on its approval")


async def sign_in(b: Browser, token: str) -> None:
    await b.run(b.driver.get, b.base + "/ui/")
    field = await b.wait("the sign-in form", lambda d: d.find_element(*css("input[name=token]")))
    await b.run(field.send_keys, token)
    await b.click("form[data-test=signin] button")
    await b.wait("the signed-in header", lambda d: d.find_elements(*css("[data-test=who]")))


def listed(selector: str) -> Callable[[Any], Any]:
    def found(d: Any) -> Any:
        return d.find_elements(*css(selector))

    return found


def usd(v: float) -> str:
    """The console's money format (app.js ``usd``)."""
    return f"${v:.6f}" if v < 0.01 else f"${v:.4f}"


async def test_approve_a_run_from_the_inbox_and_watch_it_complete(
    gateway: GatewayProc,
    worker: Worker,
    client: Client,
    read_side: ReadSide,
    chromium: Any,
) -> None:
    bearer = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=bearer, timeout=30) as h:
        await start(h, client, "refund-4711", 4711)
        how = {
            "Sojourn-Priority": "2",
            "Sojourn-Fairness-Key": "tenant:acme",
            "Sojourn-Attributes": '{"customer": 4712, "tier": "gold"}',
        }
        await start(h, client, "refund-4712", 4712, **how)
        timeline = (await h.get("/ui/api/runs/refund-4711/timeline")).json()
    llm = next(i for i in timeline["items"] if i.get("step_kind") == "llm")
    cost = usd(llm["usage"]["usd"])

    b: Browser = chromium(gateway.url)
    await sign_in(b, ADMIN_TOKEN)
    # The approvals inbox lists the waiting runs, oldest first; a link opens the timeline.
    await b.click("a[data-nav=approvals]")
    rows = "table[data-test=approvals] tbody tr[data-run-id]"
    await b.wait(
        "both runs in the approvals inbox",
        lambda d: (
            [e.get_attribute("data-run-id") for e in d.find_elements(*css(rows))]
            == ["refund-4711", "refund-4712"]
        ),
    )
    await b.click("table[data-test=approvals] tr[data-run-id=refund-4711] a")
    await b.wait(
        "the two steps on the timeline",
        lambda d: len(d.find_elements(*css("li[data-kind=step]"))) == 2,
    )
    steps = await b.texts("li[data-kind=step]")
    assert "look_up" in steps[0] and "llm:scripted-large" in steps[1], steps
    durations = await b.texts("li[data-kind=step] [data-test=duration]")
    assert len(durations) == 2 and all(d.endswith(("ms", " s")) for d in durations), durations
    assert await b.text("li[data-kind=step] [data-test=cost]") == cost
    await b.wait("the admin's actions", lambda d: d.find_elements(*css("[data-test=terminate]")))
    await b.run(b.driver.execute_script, "window.__sameDocument = 'yes'")
    # The heading names the status once: the liveness badge only when it says more.
    assert (await b.texts("h1 .badge")) == ["waiting"], await b.texts("h1 .badge")
    IMG.mkdir(parents=True, exist_ok=True)
    await b.run(b.driver.save_screenshot, str(IMG / "console-run.png"))

    # Approve, confirm, and see the run complete here, live.
    await b.click("[data-test=approve]")
    await b.click("[data-test=confirm-yes]")
    assert "Approved" in await b.text("[data-test=result]")
    await b.wait(
        "the run completed on the open page",
        lambda d: d.find_elements(*css("[data-test=run-status] [data-status=completed]")),
        timeout=90,
    )
    assert await b.run(b.driver.execute_script, "return window.__sameDocument") == "yes"
    await b.wait(
        "the paying step on the timeline",
        lambda d: len(d.find_elements(*css("li[data-kind=step]"))) == 3,
    )
    # The signal's sender is the session's token's name.
    assert "ada" in await b.text("li[data-kind=signal] [data-test=sender]")
    assert (await client.state("refund-4711")).status == "completed"

    # The runs listing, live: the completed run shows so without a reload.
    await b.click("a[data-nav=runs]")
    for run_id, status in (("refund-4711", "completed"), ("refund-4712", "waiting")):
        row = f"table[data-test=runs] tr[data-run-id={run_id}] [data-status={status}]"
        await b.wait(f"{run_id} {status} in the listing", listed(row))
    # A run of another priority than the default is tagged so in the listing...
    tag = "table[data-test=runs] tr[data-run-id=refund-4712] [data-test=priority]"
    assert await b.text(tag) == "p2"
    assert not await b.run(
        b.driver.find_elements, *css("tr[data-run-id=refund-4711] [data-test=priority]")
    )
    await b.run(b.driver.save_screenshot, str(IMG / "console-runs.png"))
    # ...and its page says how it was started: priority, fairness key, search attributes.
    await b.click("table[data-test=runs] tr[data-run-id=refund-4712] a")
    await b.wait("its facts", lambda d: d.find_elements(*css("dd[data-test=attributes]")))
    assert await b.text("dd[data-test=priority]") == "2 (urgent) · fairness key tenant:acme"
    assert await b.texts("dd[data-test=attributes] .tag") == ["customer=4712", "tier=gold"]


async def test_a_client_session_is_offered_no_admin_only_action(
    gateway: GatewayProc,
    worker: Worker,
    client: Client,
    read_side: ReadSide,
    chromium: Any,
) -> None:
    bearer = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=bearer, timeout=30) as h:
        await start(h, client, "refund-c", 1)
    b: Browser = chromium(gateway.url)
    await sign_in(b, CLIENT_TOKEN)
    await b.run(b.driver.get, b.base + "/ui/#/run/refund-c")
    await b.wait("the approve action", lambda d: d.find_elements(*css("[data-test=approve]")))
    await b.wait("the cancel action", lambda d: d.find_elements(*css("[data-test=cancel]")))
    for admin_only in ("terminate", "resume", "budget"):
        assert await b.run(b.driver.find_elements, *css(f"[data-test={admin_only}]")) == []
    assert "client" in await b.text("[data-test=who]")

    # Three days of waiting are one compressed row, not drawn to scale.
    t0 = time.time() - 4 * 86_400
    raw = msgspec.Raw(b"null")
    await client.store.append(
        "idle-1",
        [
            ev.RunStarted(run_id="idle-1", agent="contracts", input=raw, at=t0),
            ev.WaitStarted(
                position=0, key="signal:docs.signed", signals=("docs.signed",), at=t0 + 1,
                deadline=t0 + 14 * 86_400,
            ),
        ],
        expected_seq=0,
        writer="test",
    )  # fmt: skip
    seq = (await client.history("idle-1"))[-1].seq
    await client.store.append(
        "idle-1",
        [
            ev.SignalReceived(name="docs.signed", payload=raw, signal_id="s1", sent_by="esign",
                              at=t0 + 3 * 86_400 + 2),
            ev.WaitCompleted(position=0, key="signal:docs.signed", outcome="signal",
                             payload=raw, signal="docs.signed", signal_id="s1",
                             sent_by="esign", at=t0 + 3 * 86_400 + 2),
            ev.RunCompleted(output=raw, at=t0 + 3 * 86_400 + 3),
        ],
        expected_seq=seq,
        writer="test",
    )  # fmt: skip
    await b.run(b.driver.get, b.base + "/ui/#/run/idle-1")
    gap = await b.text("li[data-test=gap]")
    assert "⋯ 3 d 0 h waiting for docs.signed (compressed)" in gap, gap
    assert len(await b.texts("li[data-test=gap]")) == 1
    assert "esign" in await b.text("li[data-kind=signal] [data-test=sender]")


async def test_an_open_timeline_shows_a_worker_sigkilled_mid_step_and_the_restart_live(
    gateway: GatewayProc,
    nats_server: EmbeddedServer,
    settings: Settings,
    files: Files,
    client: Client,
    read_side: ReadSide,
    chromium: Any,
) -> None:
    doomed = await WorkerProc(
        nats_server.url, settings.prefix, "tests.actors.console.agents"
    ).ready()
    survivor: Worker | None = None
    try:
        bearer = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with httpx.AsyncClient(base_url=gateway.url, headers=bearer, timeout=30) as h:
            r = await h.post(
                "/v1/agents/crunching/runs", json=20, headers={"Idempotency-Key": "k1"}
            )
            assert r.status_code in (201, 202), r.text

        async def crunching() -> bool:
            op = (await client.state("k1")).op(1)
            return op is not None and op.status == "started"

        await wait_for(crunching, 60, what="the second step under way")
        b: Browser = chromium(gateway.url)
        await sign_in(b, ADMIN_TOKEN)
        await b.run(b.driver.get, b.base + "/ui/#/run/k1")
        await b.wait(
            "the step running on the timeline",
            listed("li[data-kind=step] [data-test=attempt][data-outcome=running]"),
        )
        await b.run(b.driver.execute_script, "window.__sameDocument = 'yes'")
        doomed.kill()
        survivor = await running_worker(nats_server, settings, files, [agents.crunching])
        await b.wait(
            "the lost attempt in doubt on the open page",
            listed("li[data-kind=step] [data-test=attempt][data-outcome=in_doubt]"),
            timeout=90,
        )
        await b.wait(
            "the run completed on the open page",
            listed("[data-test=run-status] [data-status=completed]"),
            timeout=90,
        )
        # prepare's one attempt, then crunch's: the lost one, and the restart elsewhere.
        attempts = await b.texts("li[data-kind=step] [data-test=attempt]")
        assert len(attempts) == 3 and "in doubt" in attempts[1], attempts
        assert attempts[2].startswith("#2") and "restarted on" in attempts[2], attempts
        assert await b.run(b.driver.execute_script, "return window.__sameDocument") == "yes"
        assert await client.result("k1") == 42
    finally:
        doomed.kill()
        if survivor is not None:
            await survivor.stop()
