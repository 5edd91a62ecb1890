"""The gateway speaks for each caller (issue 25): what a bearer token starts, signals and
cancels is recorded as the name its tokens file gives it, not as the gateway.

A real ``sojourn gateway`` process and a real nats-server: first on the session's server
(no authentication: the name is the gateway's claim), then on a server with users
(``AuthUser.speaks_for``), where the broker lets the gateway's user send as exactly the names
of its tokens file: a raw publish as another name is refused, and a caller whose name the
gateway's user was not given is a 500 that records nothing.
"""

from __future__ import annotations

import asyncio
import secrets
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from sojourn.actors import Agent, Client, Context, RunCancelledError, Worker, agent
from sojourn.actors.agents.callbacks import generate_key_file_text
from sojourn.broker import Broker, EmbeddedServer, Names
from sojourn.broker.auth import AuthUser
from sojourn.schemas.codec import from_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import PermissionDenied
from sojourn.schemas.events import (
    CancelRequested,
    RunEvent,
    RunStarted,
    SignalReceived,
    ValueRecorded,
)
from tests.actors.gateway.conftest import Files, GatewayProc, start_gateway
from tests.actors.gateway.test_callbacks import token_of
from tests.actors.gateway.test_gateway import problem
from tests.apps import http_agents
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for

pytestmark = pytest.mark.usefixtures("processes")  # gateways, servers of their own, the CLI


@agent("gw_approval")
async def gw_approval(ctx: Context) -> dict[str, Any]:
    d = await ctx.approval("deploy", approvers=["alice"], timeout=3600)
    return {"approved": d.approved, "by": d.by, "verified": d.verified}


AGENTS: list[Agent[Any, Any]] = [http_agents.echo_wait, http_agents.callback_wait, gw_approval]
DEADLINE = 60.0

ALICE = "alice-token-" + "a" * 20
BOB = "bob-token-" + "b" * 20
CAROL = "carol-token-" + "c" * 20
NAMELESS = "nameless-token-" + "n" * 20


def tokens_text(*extra: str) -> str:
    """alice (client) and bob (admin) by name, a token of the older form without one."""
    lines = [
        "# TOKEN ROLE NAME",
        f"{ALICE} client alice",
        f"{BOB} admin bob",
        f"{NAMELESS} client",
        *extra,
    ]
    return "\n".join(lines) + "\n"


def as_(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def events_of(client: Client, run_id: str) -> list[RunEvent]:
    return [e for d in await client.history(run_id) for e in d.events]


async def started_by(client: Client, run_id: str) -> str | None:
    (start,) = [e for e in await events_of(client, run_id) if isinstance(e, RunStarted)]
    return start.trigger.sent_by


async def senders(client: Client, run_id: str) -> list[tuple[str, str | None]]:
    return [
        (e.name, e.sent_by)
        for e in await events_of(client, run_id)
        if isinstance(e, SignalReceived)
    ]


async def cancellers(client: Client, run_id: str) -> list[str | None]:
    return [e.by for e in await events_of(client, run_id) if isinstance(e, CancelRequested)]


async def waiting(client: Client, run_id: str) -> None:
    async def check() -> bool:
        try:
            return await client.status(run_id) == "waiting"
        except Exception:
            return False

    await wait_for(check, DEADLINE, what=f"run {run_id} waiting")


async def start(http: httpx.AsyncClient, token: str, agent: str, run_id: str, value: Any) -> None:
    r = await http.post(
        f"/v1/agents/{agent}/runs", json=value, headers={**as_(token), "Idempotency-Key": run_id}
    )
    assert r.status_code == 201, r.text


async def the_callers_flow(http: httpx.AsyncClient, client: Client) -> None:
    """alice starts a run and bob signals it; bob starts one and alice cancels it; the
    nameless token starts a run; a callback delivers to a run alice started. Returns once
    every outcome is recorded; the caller checks who each is recorded as."""
    await start(http, ALICE, "echo-wait", "by-alice", {"n": 1})
    await start(http, BOB, "echo-wait", "by-bob", {"n": 2})
    await start(http, NAMELESS, "echo-wait", "by-nameless", {"n": 3})
    await start(http, ALICE, "callback-wait", "called-back", 3600)
    await waiting(client, "by-alice")
    r = await http.post("/v1/runs/by-alice/signals/go", json={"ok": 1}, headers=as_(BOB))
    assert r.status_code == 202, r.text
    assert await client.result("by-alice", timeout=DEADLINE) == {
        "input": {"n": 1},
        "go": {"ok": 1},
    }
    r = await http.post("/v1/runs/by-bob/cancel", json={"reason": "no"}, headers=as_(ALICE))
    assert r.status_code == 202, r.text
    with pytest.raises(RunCancelledError):
        await client.result("by-bob", timeout=DEADLINE)
    token = await token_of(client, "called-back")
    assert (await http.post(f"/v1/callbacks/{token}", json={"signed": True})).status_code == 200
    assert (await client.result("called-back", timeout=DEADLINE))["first"] == {"signed": True}


# --- no authentication: the session's server ---------------------------------------------------


async def history_lines(nats_server: EmbeddedServer, settings: Settings, run_id: str) -> list[str]:
    """``sojourn history RUN``'s lines (text, as people read it)."""
    args = ["history", run_id, "--nats", nats_server.url, "--prefix", settings.prefix]
    done = await asyncio.to_thread(
        subprocess.run,
        [PYTHON, "-m", "sojourn.actors.cli", *args],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.fixture
def named(tmp_path: Path) -> Files:
    tokens = tmp_path / "tokens"
    tokens.write_text(tokens_text())
    keys = tmp_path / "keys"
    keys.write_text(generate_key_file_text("k1"))
    return Files(tokens, keys)


async def test_each_callers_starts_signals_and_cancels_are_recorded_as_its_name(
    nats_server: EmbeddedServer, settings: Settings, named: Files, client: Client
) -> None:
    worker = Worker(
        AGENTS, nats=nats_server.url, settings=settings, callback_keys=named.callback_keys
    )
    await worker.start()
    gateway = await start_gateway(nats_server, settings, named)
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
            await the_callers_flow(http, client)
            assert await started_by(client, "by-alice") == "alice"
            assert await started_by(client, "by-bob") == "bob"
            assert await senders(client, "by-alice") == [("go", "bob")]
            assert await cancellers(client, "by-bob") == ["alice"]
            # No authentication: the gateway itself (a nameless token, a callback) is nobody.
            assert await started_by(client, "by-nameless") is None
            assert await senders(client, "called-back") == [("docs.signed", None)]

            # The same over HTTP and in the CLI's history.
            history = (await http.get("/v1/runs/by-alice/history", headers=as_(BOB))).json()
            events = [e for d in history for e in d["events"]]
            assert events[0]["trigger"]["sent_by"] == "alice"
            assert [e["sent_by"] for e in events if e["type"] == "signal.received.v1"] == ["bob"]
        lines = await history_lines(nats_server, settings, "by-alice")
        assert any("RunStarted" in x and "by=alice" in x for x in lines), lines
        assert any("SignalReceived" in x and "sent_by=bob" in x for x in lines), lines
        lines = await history_lines(nats_server, settings, "by-bob")
        assert any("RunStarted" in x and "by=bob" in x for x in lines), lines
        assert any("CancelRequested" in x and "by=alice" in x for x in lines), lines
    finally:
        gateway.stop()
        await worker.stop()


# --- authentication: the gateway's user speaks for exactly its tokens' names --------------------

PREFIX = "gwcallers"
SETTINGS = Settings(prefix=PREFIX, lease_ttl=2.0)
NAMES = Names(PREFIX)
PASSWORDS = {u: secrets.token_urlsafe(18) for u in ("gw", "worker", "admin", "client")}


@dataclass
class Deployment:
    server: EmbeddedServer
    files: Files
    gateway: GatewayProc
    client: Client  # the admin's: reads everything


@pytest_asyncio.fixture(scope="module")
async def deployment(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Deployment]:
    root = tmp_path_factory.mktemp("gateway-callers")
    users = [
        # The gateway's user: a client speaking for the names of its tokens file, not carol's
        # (whose token was added to the file without telling the broker).
        AuthUser("gw", PASSWORDS["gw"], "client", speaks_for=("alice", "bob")),
        AuthUser("worker", PASSWORDS["worker"], "worker"),
        AuthUser("admin", PASSWORDS["admin"], "admin"),
        AuthUser("client", PASSWORDS["client"], "client"),
    ]
    server = EmbeddedServer(store_dir=root / "nats", port=0, auth=users, auth_prefix=PREFIX)
    await server.start()
    files = Files(root / "tokens", root / "keys")
    files.tokens.write_text(tokens_text(f"{CAROL} client carol"))
    files.keys.write_text(generate_key_file_text("k1"))
    worker = Worker(
        AGENTS,
        nats=server.url_for("worker"),
        settings=SETTINGS,
        callback_keys=files.callback_keys,
    )
    gateway: GatewayProc | None = None
    client: Client | None = None
    try:
        await worker.start()  # creates the streams: the gateway's client role may not
        gateway = await GatewayProc(
            [
                "--nats",
                server.url_for("gw"),
                "--prefix",
                PREFIX,
                "--tokens",
                str(files.tokens),
                "--callback-keys",
                str(files.keys),
            ]
        ).ready()
        client = await Client.connect(server.url_for("admin"), settings=SETTINGS)
        yield Deployment(server, files, gateway, client)
    finally:
        if client is not None:
            await client.close()
        if gateway is not None:
            gateway.stop()
        await worker.stop()
        await server.stop()


async def test_under_authentication_each_caller_is_recorded_and_callbacks_as_the_gateway(
    deployment: Deployment,
) -> None:
    d, client = deployment, deployment.client
    printed = b"".join(d.gateway.lines).decode()
    assert "sends as its callers: alice, bob, carol" in printed
    assert "--speaks-for gw=NAME" in printed
    async with httpx.AsyncClient(base_url=d.gateway.url, timeout=30) as http:
        await the_callers_flow(http, client)
    assert await started_by(client, "by-alice") == "alice"
    assert await started_by(client, "by-bob") == "bob"
    assert await senders(client, "by-alice") == [("go", "bob")]
    assert await cancellers(client, "by-bob") == ["alice"]
    # A token without a name and a callback are the gateway's own user, authenticated.
    assert await started_by(client, "by-nameless") == "gw"
    assert await senders(client, "called-back") == [("docs.signed", "gw")]


async def test_the_broker_lets_the_gateways_user_send_as_its_callers_and_no_one_else(
    deployment: Deployment,
) -> None:
    d = deployment
    gw = await Broker.connect(d.server.url_for("gw"), name="test gw")
    plain = await Broker.connect(d.server.url_for("client"), name="test client")
    try:
        for name in ("alice", "bob", "gw"):  # stored (the intake dead-letters: no such run)
            ack = await gw.publish(NAMES.cancel("nobody-run", name), b"{}", timeout=DEADLINE)
            assert ack.seq > 0
        for subject in (
            NAMES.signal("nobody-run", "go", "carol"),  # carol: in the file, not the broker's
            NAMES.start("echo-wait", "carol"),
            NAMES.cancel("nobody-run", "client"),  # another user
            NAMES.signal("nobody-run", "go"),  # the anonymous form
            NAMES.resume("nobody-run", "alice"),  # control subjects are never a caller's
            NAMES.spawn("echo-wait", "alice"),
            NAMES.child_end("nobody-run", "x", "alice"),
        ):
            with pytest.raises(PermissionDenied):
                await gw.publish(subject, b"{}", timeout=DEADLINE)
        # speaks_for is the gateway user's: another client still speaks only for itself.
        with pytest.raises(PermissionDenied):
            await plain.publish(NAMES.cancel("nobody-run", "alice"), b"{}", timeout=DEADLINE)
    finally:
        await gw.close()
        await plain.close()


async def test_a_caller_the_gateways_user_may_not_speak_for_is_refused_and_recorded_nowhere(
    deployment: Deployment,
) -> None:
    d, client = deployment, deployment.client
    async with httpx.AsyncClient(base_url=d.gateway.url, timeout=30) as http:
        r = await http.post(
            "/v1/agents/echo-wait/runs",
            json=1,
            headers={**as_(CAROL), "Idempotency-Key": "by-carol"},
        )
        body = problem(r, "internal")
        assert "carol" not in body["detail"]
        await start(http, ALICE, "echo-wait", "carol-target", 1)
        await waiting(client, "carol-target")
        problem(
            await http.post("/v1/runs/carol-target/signals/go", json=1, headers=as_(CAROL)),
            "internal",
        )
        problem(await http.post("/v1/runs/carol-target/cancel", headers=as_(CAROL)), "internal")
    assert await client.history("by-carol") == [] and await client.pending("by-carol") is None
    assert await senders(client, "carol-target") == []
    assert await cancellers(client, "carol-target") == []
    assert await client.status("carol-target") == "waiting"
    # The gateway's log says what to fix.
    output = d.gateway.proc.stdout
    assert output is not None

    async def said() -> bool:
        line = await asyncio.wait_for(asyncio.to_thread(output.readline), DEADLINE)
        d.gateway.lines.append(line)
        return b"carol" in line and b"--speaks-for" in line

    await wait_for(said, DEADLINE, interval=0, what="the gateway's log naming the fix")


async def test_an_approval_over_http_is_decided_by_the_callers_token_not_its_claim(
    deployment: Deployment,
) -> None:
    """bob's token (an admin, but not the approver asked) claims to be alice: refused and
    recorded with bob's name, the run still waiting. alice's token claims to be bob: the
    approval is alice's, because the broker let the gateway send it only as alice."""
    client = deployment.client
    async with httpx.AsyncClient(base_url=deployment.gateway.url, timeout=30) as http:
        await start(http, ALICE, "gw_approval", "deploy-1", None)
        await waiting(client, "deploy-1")
        forged = await http.post(
            "/v1/runs/deploy-1/signals/approval.deploy",
            json={"approve": True, "by": "alice"},
            headers=as_(BOB),
        )
        assert forged.status_code == 202, forged.text

        async def refusals() -> list[Any]:
            return [
                from_raw(e.value)
                for e in await events_of(client, "deploy-1")
                if isinstance(e, ValueRecorded) and e.kind == "refusal"
            ]

        async def refused() -> bool:
            return bool(await refusals())

        await wait_for(refused, DEADLINE, what="bob's decision refused")
        (refusal,) = await refusals()
        assert refusal["by"] == "bob" and refusal["approval"] == "deploy", refusal
        assert await client.status("deploy-1") == "waiting"
        mine = await http.post(
            "/v1/runs/deploy-1/signals/approval.deploy",
            json={"approve": True, "by": "bob"},
            headers=as_(ALICE),
        )
        assert mine.status_code == 202, mine.text
    output = await client.result("deploy-1", timeout=DEADLINE)
    assert output == {"approved": True, "by": "alice", "verified": True}
