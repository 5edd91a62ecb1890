"""Callback URLs and webhooks through a real gateway process (issue 15, Proof): the onboarding
example resumed by a POST to its callback URL after its worker was SIGKILLed and restarted; the
same POST five times is one signal; an expired or tampered token is refused (401/410) and
touches nothing; a webhook with a wrong HMAC or a stale timestamp is refused, a right one wakes
the run. Every refusal is kept in the dead-letter stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest_asyncio

from sojourn.actors import Agent, Client, Worker
from sojourn.actors.gateway import parse_route
from sojourn.actors.gateway._webhooks import sign
from sojourn.broker import EmbeddedServer
from sojourn.schemas.codec import decode_dead_letter, from_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.events import SignalReceived, ValueRecorded
from sojourn.schemas.wire import DeadLetter
from tests.actors.gateway.conftest import Files, GatewayProc, running_worker, start_gateway
from tests.actors.gateway.test_gateway import problem
from tests.apps import http_agents
from tests.conftest import wait_for
from tests.procs import WorkerProc

AGENTS: list[Agent[Any, Any]] = [http_agents.callback_wait]


@pytest_asyncio.fixture
async def worker(
    nats_server: EmbeddedServer, settings: Settings, files: Files
) -> AsyncIterator[Worker]:
    w = await running_worker(nats_server, settings, files, AGENTS)
    try:
        yield w
    finally:
        await w.stop()


async def token_of(client: Client, run_id: str) -> str:
    """The callback token the run recorded (``ctx.callback`` is journaled)."""

    async def recorded() -> bool:
        return any(
            isinstance(e, ValueRecorded) and e.kind == "callback"
            for d in await client.history(run_id)
            for e in d.events
        )

    await wait_for(recorded, 60, what="the callback token recorded")
    for d in await client.history(run_id):
        for e in d.events:
            if isinstance(e, ValueRecorded) and e.kind == "callback":
                return str(from_raw(e.value, str))
    raise AssertionError("unreachable")


async def signals(client: Client, run_id: str, name: str) -> list[SignalReceived]:
    return [
        e
        for d in await client.history(run_id)
        for e in d.events
        if isinstance(e, SignalReceived) and e.name == name
    ]


async def http_records(client: Client) -> list[DeadLetter]:
    """Every dead-letter record the gateway kept (subject ``<prefix>.dlq.http``)."""
    names, broker = client.names, client.broker
    out: list[DeadLetter] = []
    seq = 1
    while True:
        m = await broker.direct_get_next(names.dlq_stream, names.dlq("http"), seq)
        if m is None:
            return out
        out.append(decode_dead_letter(m.data))
        seq = m.seq + 1


def tampered(token: str) -> list[str]:
    """The token with one character changed in each of its parts."""
    out = []
    for i in (2, token.index(".", 5) + 3, len(token) - 2):
        c = token[i]
        out.append(token[:i] + ("A" if c != "A" else "B") + token[i + 1 :])
    return out


async def test_the_same_callback_post_five_times_is_one_signal(
    gateway: GatewayProc,
    files: Files,
    worker: Worker,
    client: Client,
) -> None:
    run_id = await client.start("callback-wait", 3600.0)
    token = await token_of(client, run_id)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as anon:
        answers = await asyncio.gather(
            *(anon.post(f"/v1/callbacks/{token}", json={"by": "ada"}) for _ in range(5))
        )
        assert [r.status_code for r in answers] == [200] * 5, [r.text for r in answers]
        assert len({r.content for r in answers}) == 1
        body = answers[0].json()
        assert body["delivered"] is True and body["signal"] == "docs.signed"
        result = await client.result(run_id, timeout=60)
        assert result == {"first": {"by": "ada"}, "second": None}
        assert len(await signals(client, run_id, "docs.signed")) == 1
        # After the run ended, a repeat is still answered as the first was.
        late = await anon.post(f"/v1/callbacks/{token}", json={"by": "eve"})
        assert late.status_code == 200 and late.content == answers[0].content
        assert len(await signals(client, run_id, "docs.signed")) == 1


async def test_an_expired_or_tampered_token_is_refused_and_touches_nothing(
    gateway: GatewayProc,
    files: Files,
    worker: Worker,
    client: Client,
) -> None:
    run_id = await client.start("callback-wait", 3600.0)
    token = await token_of(client, run_id)
    before = await client.history(run_id)
    expired = files.callback_keys.issue(run_id, "docs.signed", 60, now=time.time() - 120)
    other_keys = Files(files.tokens, files.keys.with_name("other"))
    other_keys.keys.write_text("k1 " + "z" * 40 + "\n")
    forged = other_keys.callback_keys.issue(run_id, "docs.signed", 60, now=time.time())
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as anon:
        problem(await anon.post(f"/v1/callbacks/{expired}", json=1), "token_expired")
        problem(await anon.post(f"/v1/callbacks/{forged}", json=1), "invalid_token")
        for bad in tampered(token):
            problem(await anon.post(f"/v1/callbacks/{bad}", json=1), "invalid_token")
        problem(await anon.post("/v1/callbacks/" + "x" * 3000, json=1), "invalid_token")
        # A good token with a body the gateway cannot take is refused too, untouched.
        problem(
            await anon.post(
                f"/v1/callbacks/{token}",
                content=b"\x00\xff",
                headers={"Content-Type": "application/octet-stream"},
            ),
            "unsupported_media_type",
        )
        problem(
            await anon.post(f"/v1/callbacks/{token}", content=b"x" * (1 << 20 + 1)),
            "payload_too_large",
        )
    assert await client.history(run_id) == before
    records = await http_records(client)
    codes = [r.code for r in records]
    assert codes.count("token_expired") == 1 and codes.count("invalid_token") == 5
    assert "unsupported_media_type" in codes and "payload_too_large" in codes
    for r in records:
        assert r.kind == "http" and r.subject.startswith("POST /v1/callbacks/")
        assert token not in r.subject and expired not in r.subject  # never the credential
        assert "authorization" not in {k.lower() for k in r.headers}


async def test_a_callback_for_an_ended_run_is_run_ended(
    gateway: GatewayProc,
    files: Files,
    worker: Worker,
    client: Client,
) -> None:
    run_id = await client.start("callback-wait", 3600.0)
    token = await token_of(client, run_id)
    await client.cancel(run_id)

    async def cancelled() -> bool:
        return await client.status(run_id) == "cancelled"

    await wait_for(cancelled, 60, what="the run cancelled")
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as anon:
        for _ in range(2):  # the repeat, inside the dedup window, answers the same
            body = problem(await anon.post(f"/v1/callbacks/{token}", json=1), "run_ended")
            assert body["run_id"] == run_id


async def test_a_form_body_is_the_signal_payload(
    gateway: GatewayProc,
    files: Files,
    worker: Worker,
    client: Client,
) -> None:
    run_id = await client.start("callback-wait", 3600.0)
    token = await token_of(client, run_id)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as anon:
        r = await anon.post(
            f"/v1/callbacks/{token}",
            content=b"status=signed&tag=a&tag=b",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert r.status_code == 200, r.text
    result = await client.result(run_id, timeout=60)
    assert result["first"] == {"status": "signed", "tag": ["a", "b"]}


async def test_a_webhook_with_a_wrong_hmac_or_a_stale_timestamp_is_refused_a_right_one_wakes(
    nats_server: EmbeddedServer,
    settings: Settings,
    files: Files,
    worker: Worker,
    client: Client,
) -> None:
    secret = "whsec_" + "s3cr3t" * 5
    g = await start_gateway(
        nats_server,
        settings,
        files,
        "--webhook",
        "esign=stripe:env:ESIGN_SECRET",
        "--webhook",
        "ci=github:env:CI_SECRET",
        ESIGN_SECRET=secret,
        CI_SECRET="github-" + "x" * 20,
    )
    try:
        route = parse_route("esign=stripe:" + secret)
        wrong = parse_route("esign=stripe:" + "whsec_" + "w" * 30)
        run_id = await client.start("callback-wait", 3600.0)
        token = await token_of(client, run_id)
        body = msgspec.json.encode({"type": "envelope.completed"})
        url = f"/v1/webhooks/esign/{token}"
        json_type = {"Content-Type": "application/json"}
        async with httpx.AsyncClient(base_url=g.url, timeout=30) as anon:
            now = time.time()
            bad = await anon.post(
                url, content=body, headers={**json_type, **sign(wrong, body, now)}
            )
            problem(bad, "invalid_signature")
            stale = sign(route, body, now - 3600)
            problem(
                await anon.post(url, content=body, headers={**json_type, **stale}), "stale_webhook"
            )
            problem(await anon.post(url, content=body, headers=json_type), "missing_signature")
            other = sign(route, body + b" ", now)  # signed for another body
            problem(
                await anon.post(url, content=body, headers={**json_type, **other}),
                "invalid_signature",
            )
            problem(await anon.post(f"/v1/webhooks/nope/{token}", content=body), "unknown_webhook")
            # The run has not been touched: it still waits.
            assert await signals(client, run_id, "docs.signed") == []
            good = await anon.post(
                url, content=body, headers={**json_type, **sign(route, body, now)}
            )
            assert good.status_code == 200, good.text
        result = await client.result(run_id, timeout=60)
        assert result["first"] == {"type": "envelope.completed"}
        codes = [r.code for r in await http_records(client)]
        for code in ("invalid_signature", "stale_webhook", "missing_signature", "unknown_webhook"):
            assert code in codes
    finally:
        g.stop()


async def test_the_onboarding_example_resumes_from_its_callback_url_after_a_worker_sigkill(
    nats_server: EmbeddedServer,
    settings: Settings,
    files: Files,
    client: Client,
    tmp_path: Path,
) -> None:
    g = await start_gateway(nats_server, settings, files)
    outbox = tmp_path / "outbox"

    def onboarding_worker() -> WorkerProc:
        return WorkerProc(
            nats_server.url,
            settings.prefix,
            "examples.onboarding",
            SOJOURN_CALLBACK_KEYS=str(files.keys),
            SOJOURN_ONBOARDING_OUTBOX=str(outbox),
            SOJOURN_GATEWAY_URL=g.url,
        )

    proc = await onboarding_worker().ready()
    procs = [proc]
    try:
        hire = {"name": "Ada", "email": "ada@example.com", "docs_deadline": 3600, "esign": True}
        run_id = await client.start("onboarding", hire)

        async def welcomed() -> bool:
            return any(outbox.glob("welcome-*.txt"))

        await wait_for(welcomed, 60, what="the welcome packet")
        packet = next(outbox.glob("welcome-*.txt")).read_text()
        link = packet.split("Sign here: ", 1)[1].split()[0]
        assert link.startswith(f"{g.url}/v1/callbacks/sjc1.")

        async def waiting() -> bool:
            return await client.status(run_id) == "waiting"

        await wait_for(waiting, 60, what="the run waiting for docs.signed")
        proc.kill()
        proc = await onboarding_worker().ready()
        procs.append(proc)
        async with httpx.AsyncClient(timeout=30) as anon:
            answers = [await anon.post(link, json={"by": "ada@example.com"}) for _ in range(5)]
        assert [r.status_code for r in answers] == [200] * 5, [r.text for r in answers]
        assert len({r.content for r in answers}) == 1
        decision = {"approve": True, "by": "manager@example.com"}
        await client.signal(run_id, "approval.laptop", decision)
        result = await client.result(run_id, timeout=120)
        assert result["signed_by"] == "ada@example.com" and result["escalated"] is False
        assert len(await signals(client, run_id, "docs.signed")) == 1
        welcomes = [p for p in outbox.glob("welcome-*.txt")]
        assert len(welcomes) == 1  # the SIGKILL repeated no effect
    finally:
        for p in procs:
            p.stop()
        g.stop()
