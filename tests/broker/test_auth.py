"""Least-privilege users and TLS against a real nats-server (docs/operations.md, "Security").

One server per module runs with a user per role (``sojourn.broker.auth``) for one prefix; an
admin sets up the streams. Every refusal is checked twice: the call raises ``PermissionDenied``
(the server never answers a refused request; the broker turns the violation it reports into
the error at once), and the stream it aimed at is unchanged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import stat
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import trustme

from sojourn.broker import Broker, Delivery, EmbeddedServer, Names
from sojourn.broker import headers as h
from sojourn.broker.auth import AuthUser, default_users, permissions_for, render_accounts
from sojourn.broker.connection import ConnectOptions, CredentialsError
from sojourn.broker.timers import schedule_timer
from sojourn.broker.topology import ensure_topology, stream_configs
from sojourn.schemas.auth import ROLES
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import PermissionDenied
from sojourn.schemas.priority import PRIORITIES
from tests.conftest import PYTHON, ROOT, subprocess_env

PREFIX = "authz"
NAMES = Names(PREFIX)
SETTINGS = Settings(prefix=PREFIX, lease_ttl=2.0)
PASSWORDS = {role: secrets.token_urlsafe(18) for role in ROLES}
STREAMS = [cfg["name"] for cfg in stream_configs(NAMES, SETTINGS)]
FAST = 20.0
"""A generous timeout for refused requests: the refusal must come long before it."""


def users() -> list[AuthUser]:
    return [AuthUser(role, PASSWORDS[role], role) for role in ROLES]


@pytest_asyncio.fixture(scope="module")
async def auth_server(
    processes: None, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[EmbeddedServer]:
    server = EmbeddedServer(
        store_dir=tmp_path_factory.mktemp("nats-auth"), port=0, auth=users(), auth_prefix=PREFIX
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _as(server: EmbeddedServer, role: str) -> Broker:
    return await Broker.connect(server.url_for(role), name=f"test {role}")


async def _role(server: EmbeddedServer, role: str) -> AsyncIterator[Broker]:
    """A connection as ``role`` for the module's tests, closed after them."""
    b = await _as(server, role)
    try:
        if role == "admin":
            await ensure_topology(b, NAMES, SETTINGS)
        yield b
    finally:
        await b.close()


@pytest_asyncio.fixture(scope="module")
async def admin(auth_server: EmbeddedServer) -> AsyncIterator[Broker]:
    async for b in _role(auth_server, "admin"):
        yield b


@pytest_asyncio.fixture(scope="module")
async def client(auth_server: EmbeddedServer, admin: Broker) -> AsyncIterator[Broker]:
    async for b in _role(auth_server, "client"):
        yield b


@pytest_asyncio.fixture(scope="module")
async def worker(auth_server: EmbeddedServer, admin: Broker) -> AsyncIterator[Broker]:
    async for b in _role(auth_server, "worker"):
        yield b


@pytest_asyncio.fixture(scope="module")
async def watchdog(auth_server: EmbeddedServer, admin: Broker) -> AsyncIterator[Broker]:
    async for b in _role(auth_server, "watchdog"):
        yield b


async def state_of(admin: Broker, stream: str) -> dict[str, Any]:
    info = await admin.api(f"$JS.API.STREAM.INFO.{stream}")
    return {"messages": info["state"]["messages"], "last_seq": info["state"]["last_seq"]}


async def states(admin: Broker) -> dict[str, dict[str, Any]]:
    return {s: await state_of(admin, s) for s in STREAMS}


async def refused(call: Awaitable[Any], subject: str | None = None) -> PermissionDenied:
    """``call`` raises ``PermissionDenied``, and long before its timeout."""
    t0 = time.monotonic()
    with pytest.raises(PermissionDenied) as info:
        await call
    assert time.monotonic() - t0 < FAST / 2, "refused only by the timeout"
    if subject is not None:
        assert info.value.subject == subject
        assert subject in info.value.message
    return info.value


# --- connecting --------------------------------------------------------------------------------


async def test_anonymous_and_wrong_password_connections_are_refused(
    auth_server: EmbeddedServer,
) -> None:
    with pytest.raises(CredentialsError, match=r"authorization failed at .*check --nats"):
        await Broker.connect(auth_server.url)
    wrong = auth_server.url.replace("nats://", "nats://client:not-the-password@")
    with pytest.raises(CredentialsError, match="authorization failed") as info:
        await Broker.connect(wrong)
    assert "not-the-password" not in info.value.message  # passwords never reach messages


async def test_user_and_redacted_url(client: Broker, auth_server: EmbeddedServer) -> None:
    assert client.user == "client"
    assert PASSWORDS["client"] not in client.url
    assert client.url == auth_server.url.replace("nats://", "nats://client:***@")


async def test_server_config_is_private(auth_server: EmbeddedServer) -> None:
    mode = stat.S_IMODE(auth_server.config_file.stat().st_mode)
    assert mode == 0o600, oct(mode)  # it holds the passwords
    assert PASSWORDS["worker"] in auth_server.config_file.read_text()


# --- client --------------------------------------------------------------------------------------


async def test_client_publishes_its_own_inbox_forms(client: Broker, admin: Broker) -> None:
    inbox = NAMES.inbox_stream
    before = await state_of(admin, inbox)
    await client.publish(NAMES.start("greeter", "client"), b'{"input": null}')
    await client.publish(NAMES.signal("r1", "docs.signed", "client"), b"{}")
    await client.publish(NAMES.cancel("r1", "client"), b"{}")
    after = await state_of(admin, inbox)
    assert after["messages"] == before["messages"] + 3


async def test_client_reads_runs_and_health(client: Broker, admin: Broker) -> None:
    ack = await admin.publish(NAMES.events("read-1"), b"[]")
    assert ack.stream == NAMES.events_stream and not ack.duplicate
    await admin.publish(NAMES.lease("read-1"), b"{}")
    await admin.publish(NAMES.wedge("read-1"), b"{}")
    await admin.publish(NAMES.agent("greeter"), b"{}")
    last = await client.direct_get_last(NAMES.events_stream, NAMES.events("read-1"))
    assert last is not None and last.seq == ack.seq and last.header(h.SEQUENCE) == str(ack.seq)
    assert len(await client.direct_get_range(NAMES.events_stream, NAMES.events("read-1"))) == 1
    nxt = await client.direct_get_next(NAMES.events_stream, NAMES.events("read-1"), 1)
    assert nxt is not None
    assert await client.direct_get_last(NAMES.leases_stream, NAMES.lease("read-1")) is not None
    assert await client.direct_get_last(NAMES.health_stream, NAMES.wedge("read-1")) is not None
    assert await client.direct_get_last(NAMES.agents_stream, NAMES.agent("greeter")) is not None
    for stream in STREAMS:
        assert (await client.api(f"$JS.API.STREAM.INFO.{stream}"))["config"]["name"] == stream
    await client.api("$JS.API.INFO")
    # the client topology check passes without any write
    await ensure_topology(client, NAMES, SETTINGS, consumers=False)


async def test_client_watches_a_run_with_a_core_subscription(client: Broker, admin: Broker) -> None:
    got: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_msg(msg: Delivery) -> None:
        await got.put(msg.data)

    sub = await client.subscribe(NAMES.events("watch-1"), cb=on_msg)
    await client.flush()
    try:
        # Core NATS delivers at most once (a message published while a connection is briefly
        # down is gone): publish again now and then until one arrives, within a long deadline.
        deadline = time.monotonic() + 60
        while True:
            await admin.publish(NAMES.events("watch-1"), b'["x"]')
            try:
                assert await asyncio.wait_for(got.get(), 3) == b'["x"]'
                break
            except TimeoutError:
                assert time.monotonic() < deadline, "the allowed subscription never got a message"
    finally:
        await sub.unsubscribe()
    t0 = time.monotonic()
    denied = await client.subscribe(NAMES.lease("watch-1"))
    deadline = t0 + 30
    while not client.denied(NAMES.lease("watch-1"), since=t0):  # reported after the SUB
        assert time.monotonic() < deadline, "the refused subscription was not reported"
        await client.flush()
    await denied.unsubscribe()


CLIENT_REFUSED = [
    NAMES.events("x"),  # history is written by workers only
    NAMES.resume("x", "client"),  # control subjects: admin only
    NAMES.decide("x", 1, 1, "client"),
    NAMES.child_end("x", "y", "client"),  # worker only
    NAMES.spawn("a", "client"),
    NAMES.signal("x", "s", "admin"),  # another user's name
    NAMES.start("a", "worker"),
    NAMES.cancel("x", "admin"),
    NAMES.start("a"),  # the anonymous forms
    NAMES.signal("x", "s"),
    NAMES.cancel("x"),
    NAMES.wake("x"),
    NAMES.timer("x", "1"),
    NAMES.lease("x"),
    NAMES.worker("w"),
    NAMES.watch("x"),
    NAMES.wedge("x"),
    NAMES.dlq("start"),
    NAMES.agent("a"),
    NAMES.start("a", "worker", "r1"),  # another user's name, with a run id
    NAMES.start("a", None, "r1"),
    NAMES.run_key("x"),  # the read side is written by projectors (workers) only
    NAMES.change("a", "x"),
    NAMES.output("x"),  # output by steps (workers) only
    NAMES.leader("projector"),
]


@pytest.mark.parametrize("subject", CLIENT_REFUSED)
async def test_client_may_not_publish(subject: str, client: Broker, admin: Broker) -> None:
    before = await states(admin)
    await refused(client.publish(subject, b"{}", timeout=FAST), subject)
    assert await states(admin) == before


async def test_client_reads_the_read_side(client: Broker, admin: Broker) -> None:
    """Views, changes, output and a pending start: readable by a client, written by others."""
    view = b'{"run_id": "rs-1", "agent": "a", "status": "running"}'
    await admin.publish(NAMES.run_key("rs-1"), view)
    await admin.publish(NAMES.change("a", "rs-1"), view)
    await admin.publish(NAMES.output("rs-1"), b"{}")
    await client.publish(NAMES.start("a", "client", "rs-2"), b'{"input": null}')
    got = await client.direct_get_last(NAMES.runs_kv_stream, NAMES.run_key("rs-1"))
    assert got is not None and got.data == view
    assert await client.direct_get_last(NAMES.changes_stream, NAMES.change("a", "rs-1"))
    assert await client.direct_get_last(NAMES.output_stream, NAMES.output("rs-1"))
    msgs, _ = await client.direct_get_batch(
        NAMES.inbox_stream, NAMES.pending_starts("rs-2")[1], 1, 1
    )
    assert [m.subject for m in msgs] == [NAMES.start("a", "client", "rs-2")]
    t0 = time.monotonic()
    sub = await client.subscribe(f"{PREFIX}.runs.>")
    await client.flush()
    assert not client.denied(f"{PREFIX}.runs.>", since=t0)
    await sub.unsubscribe()


async def test_client_may_not_consume_the_inbox(client: Broker, admin: Broker) -> None:
    inbox = NAMES.inbox_stream
    await admin.publish(NAMES.start("greeter", "admin"), b'{"input": null}')
    before = await states(admin)
    consumer = await client.pull(inbox, NAMES.intake_consumer)
    try:
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{inbox}.{NAMES.intake_consumer}"
        await refused(consumer.fetch(1, timeout=1.0), subject)
    finally:
        await consumer.close()
    config = {"durable_name": "mine", "ack_policy": "explicit"}
    await refused(client.ensure_consumer(inbox, config))
    for api in (
        f"$JS.API.CONSUMER.DELETE.{inbox}.{NAMES.intake_consumer}",
        f"$JS.API.CONSUMER.INFO.{inbox}.{NAMES.intake_consumer}",
    ):
        await refused(client.api(api, timeout=FAST), api)
    assert await states(admin) == before
    names = await admin.api(f"$JS.API.CONSUMER.NAMES.{inbox}")
    assert sorted(names["consumers"]) == sorted(NAMES.intake_lane_consumer(p) for p in PRIORITIES)


async def test_client_may_not_delete_purge_or_change_streams(client: Broker, admin: Broker) -> None:
    await admin.publish(NAMES.events("keep-1"), b"[]")
    before = await states(admin)
    for stream in STREAMS:
        for api, body in (
            (f"$JS.API.STREAM.DELETE.{stream}", None),
            (f"$JS.API.STREAM.PURGE.{stream}", {}),
            (f"$JS.API.STREAM.MSG.DELETE.{stream}", {"seq": 1}),
            (f"$JS.API.STREAM.CREATE.{stream}", {"name": stream}),
        ):
            await refused(client.api(api, body, timeout=FAST), api)
    cfg = stream_configs(NAMES, SETTINGS)[0]
    api = f"$JS.API.STREAM.UPDATE.{NAMES.events_stream}"
    await refused(client.api(api, {**cfg, "max_age": 1_000_000_000}, timeout=FAST), api)
    assert await states(admin) == before
    info = await admin.api(f"$JS.API.STREAM.INFO.{NAMES.events_stream}")
    assert info["config"]["max_age"] == 0


async def test_credentials_for_another_prefix_are_refused_clearly(client: Broker) -> None:
    other = Names("elsewhere")
    err = await refused(ensure_topology(client, other, Settings(prefix="elsewhere")))
    assert "credentials for prefix 'elsewhere'" in err.message


# --- worker --------------------------------------------------------------------------------------


async def test_worker_starts_against_existing_streams_without_reconfiguring(
    worker: Broker, admin: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="sojourn.broker"):
        await ensure_topology(worker, NAMES, SETTINGS)
    assert not [r for r in caplog.records if "may not update" in r.getMessage()]


async def test_a_worker_answers_and_asks_on_presence_subjects(worker: Broker) -> None:
    """The worker role may subscribe to a presence subject and ask on one (decision 0031);
    the server says "no responders" when nobody answers there."""
    subject = NAMES.presence("w-presence")
    assert await worker.present(subject, 2.0) is False

    async def on_ask(msg: Delivery) -> None:
        await msg.respond(b"")

    since = time.monotonic()
    sub = await worker.subscribe(subject, cb=on_ask)
    await worker.flush()
    assert not worker.denied(subject, since=since)
    assert await worker.present(subject, 2.0) is True
    await sub.unsubscribe()
    await worker.flush()
    assert await worker.present(subject, 2.0) is False


async def test_worker_appends_wakes_and_purges_timers(worker: Broker, admin: Broker) -> None:
    events = await state_of(admin, NAMES.events_stream)
    await worker.publish(NAMES.events("w-1"), b"[]", {h.EXPECTED_LAST_SUBJECT_SEQUENCE: "0"})
    assert (await state_of(admin, NAMES.events_stream))["messages"] == events["messages"] + 1
    await worker.publish(NAMES.wake("w-1"), b"")
    await schedule_timer(worker, NAMES, "w-1", "3", time.time() + 3600, agent=None)
    for subject, body in (
        (NAMES.lease("w-1"), b"{}"),
        (NAMES.worker("w"), b"{}"),
        (NAMES.wedge("w-1"), b"{}"),
        (NAMES.dlq("other"), b"{}"),
        (NAMES.agent("a"), b"{}"),
        (NAMES.start("kid", "worker"), b'{"input": 1}'),
        (NAMES.spawn("kid", "worker"), b'{"input": 1}'),
        (NAMES.cancel("kid", "worker"), b"{}"),
        (NAMES.child_end("w-1", "kid", "worker"), b"{}"),
    ):
        await worker.publish(subject, body)
    purged = await worker.api(
        f"$JS.API.STREAM.PURGE.{NAMES.wake_stream}", {"filter": NAMES.timer("w-1", "*")}
    )
    assert purged["success"] and purged["purged"] == 1
    for stream in STREAMS:
        assert await worker.direct_get_last(stream, f"{PREFIX}.nothing.here") is None


WORKER_REFUSED = [
    NAMES.start("a"),  # anonymous forms
    NAMES.signal("x", "s"),
    NAMES.start("a", "client"),  # another user's name
    NAMES.child_end("x", "y", "admin"),
    NAMES.resume("x", "worker"),  # admin only
    NAMES.decide("x", 1, 1, "worker"),
    NAMES.watch("x"),  # the watchdogs' claims
]


@pytest.mark.parametrize("subject", WORKER_REFUSED)
async def test_worker_may_not_publish(subject: str, worker: Broker, admin: Broker) -> None:
    before = await states(admin)
    await refused(worker.publish(subject, b"{}", timeout=FAST), subject)
    assert await states(admin) == before


async def test_worker_may_not_delete_streams_or_purge_or_update_events(
    worker: Broker, admin: Broker
) -> None:
    await admin.publish(NAMES.events("keep-2"), b"[]")
    before = await states(admin)
    for stream in STREAMS:
        api = f"$JS.API.STREAM.DELETE.{stream}"
        await refused(worker.api(api, timeout=FAST), api)
        api = f"$JS.API.STREAM.MSG.DELETE.{stream}"
        await refused(worker.api(api, {"seq": 1}, timeout=FAST), api)
        if stream not in (NAMES.wake_stream, NAMES.schedules_stream):  # timers are purged
            api = f"$JS.API.STREAM.PURGE.{stream}"
            await refused(worker.api(api, {}, timeout=FAST), api)
    cfg = stream_configs(NAMES, SETTINGS)[0]
    api = f"$JS.API.STREAM.UPDATE.{NAMES.events_stream}"
    await refused(worker.api(api, {**cfg, "max_age": 1_000_000_000}, timeout=FAST), api)
    assert await states(admin) == before
    info = await admin.api(f"$JS.API.STREAM.INFO.{NAMES.events_stream}")
    # Purgeable by retention (the watchdog role); never by a worker, as above.
    assert info["config"]["max_age"] == 0 and info["config"]["deny_purge"] is False


async def test_a_worker_with_other_settings_leaves_the_streams_alone(
    worker: Broker, admin: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """No start rewrites a stream (docs: stream drift): a shorter dedup window than the
    streams' is a tunable difference, logged at INFO, and nothing needs an update right."""
    other = Settings(prefix=PREFIX, lease_ttl=2.0, dedup_window=60.0)
    with caplog.at_level(logging.INFO, logger="sojourn.broker"):
        found = await ensure_topology(worker, NAMES, other)
    assert NAMES.events_stream in {f.stream for f in found if f.state == "drift"}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    for stream in (NAMES.events_stream, NAMES.inbox_stream):
        info = await admin.api(f"$JS.API.STREAM.INFO.{stream}")
        assert info["config"]["duplicate_window"] == 120 * 10**9  # untouched


async def test_schedules_run_end_to_end_with_least_privilege(
    auth_server: EmbeddedServer, worker: Broker, client: Broker, admin: Broker
) -> None:
    """A client adds, triggers, pauses and deletes a schedule; a worker with the worker role
    keeps it and fires it (the broker stores the fires: no role publishes on a fire subject)."""
    from sojourn.actors import Client, Context, Worker, agent

    @agent("authz_tick")
    async def authz_tick(ctx: Context, n: int) -> int:
        return n

    w = Worker([authz_tick], broker=worker, settings=SETTINGS)
    await w.start()
    c = Client(client, SETTINGS)
    try:
        # overlap="allow": this test is about who may do what, and a trigger under the default
        # "skip" is (rightly) skipped while a fire's run is still live, which a loaded machine
        # makes likely: the overlap policies have their own tests in test_schedules.
        record = await c.add_schedule(
            "authz-every", agent="authz_tick", every="1s", input=4, overlap="allow"
        )
        assert record.created_by == "client"

        async def fired() -> bool:
            r = await c.schedule("authz-every")
            return r is not None and r.counts.started >= 1

        for _ in range(600):
            if await fired():
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the schedule never fired under least privilege")
        answer = await c.trigger_schedule("authz-every")
        assert answer.outcome == "started", answer
        assert answer.run_id is not None and await c.result(answer.run_id, timeout=30) == 4
        assert (await c.pause_schedule("authz-every")).paused
        for role_broker in (client, worker):
            await refused(
                role_broker.publish(NAMES.schedule_fire("authz_tick", "authz-every"), b""),
                NAMES.schedule_fire("authz_tick", "authz-every"),
            )
        await refused(
            client.publish(NAMES.schedule_record("authz-every"), b"{}"),
            NAMES.schedule_record("authz-every"),
        )
        assert await c.delete_schedule("authz-every")
    finally:
        await w.stop()


# --- watchdog ------------------------------------------------------------------------------------


async def test_watchdog_reads_and_wakes_only(watchdog: Broker, admin: Broker) -> None:
    await admin.publish(NAMES.events("wd-1"), b"[]")
    assert await watchdog.direct_get_last(NAMES.events_stream, NAMES.events("wd-1")) is not None
    msgs, _ = await watchdog.direct_get_batch(NAMES.events_stream, NAMES.events_all, 1, 10)
    assert msgs
    await watchdog.publish(NAMES.wake("wd-1"), b"", {h.WAKE_REASON: "watchdog:test"})
    await watchdog.publish(NAMES.watch("wd-1"), b"{}")
    await ensure_topology(watchdog, NAMES, SETTINGS, consumers=False)
    before = await states(admin)
    for subject in (
        NAMES.events("wd-1"),
        NAMES.lease("wd-1"),
        NAMES.start("a", "watchdog"),
        NAMES.timer("wd-1", "1"),
    ):
        await refused(watchdog.publish(subject, b"{}", timeout=FAST), subject)
    api = f"$JS.API.STREAM.DELETE.{NAMES.events_stream}"
    await refused(watchdog.api(api, timeout=FAST), api)
    api = f"$JS.API.STREAM.MSG.DELETE.{NAMES.events_stream}"
    await refused(watchdog.api(api, {"seq": 1}, timeout=FAST), api)
    api = f"$JS.API.STREAM.PURGE.{NAMES.inbox_stream}"  # retention purges ended runs only
    await refused(watchdog.api(api, {}, timeout=FAST), api)
    assert await states(admin) == before


# --- a fresh deployment ------------------------------------------------------------------------


async def test_a_fresh_deployment_needs_a_worker_first(processes: None, tmp_path: Path) -> None:
    """Clients and watchdogs cannot create streams; a worker can, and then they start."""
    async with EmbeddedServer(
        store_dir=tmp_path, port=0, auth=users(), auth_prefix=PREFIX
    ) as server:
        c = await _as(server, "client")
        w = await _as(server, "worker")
        try:
            err = await refused(ensure_topology(c, NAMES, SETTINGS, consumers=False))
            assert "does not exist and user 'client' may not create it" in err.message
            assert "start a worker" in err.message
            await ensure_topology(w, NAMES, SETTINGS)  # creates every stream and consumer
            await ensure_topology(w, NAMES, SETTINGS)  # and again: no update needed
            await ensure_topology(c, NAMES, SETTINGS, consumers=False)
            for stream in STREAMS:
                assert await c.stream_config(stream) is not None
        finally:
            await c.close()
            await w.close()


# --- the rendered config -----------------------------------------------------------------------


def test_render_quotes_and_references() -> None:
    text = render_accounts(PREFIX, [*default_users(), AuthUser("plain", 'p"w$x', "client")])
    assert "password: $SOJOURN_CLIENT_PASSWORD\n" in text  # a variable reference: unquoted
    assert 'password: "p\\"w$x"' in text  # anything else: a quoted string
    assert f'"$JS.API.DIRECT.GET.{NAMES.events_stream}"' in text
    with pytest.raises(ValueError, match="two users"):
        render_accounts(PREFIX, [AuthUser("a", "x", "client"), AuthUser("a", "y", "admin")])
    with pytest.raises(ValueError, match="unknown role"):
        AuthUser("a", "x", "root")  # type: ignore[arg-type]


def test_roles_never_include_destructive_or_foreign_subjects() -> None:
    for role in ("client", "worker", "watchdog"):
        perms = permissions_for(NAMES, role, role)
        assert perms is not None
        allowed = " ".join(perms.publish_allow)
        assert "DELETE" not in allowed
        # only the watchdog (retention) may purge history
        assert (f"PURGE.{NAMES.events_stream}" in allowed) == (role == "watchdog")
        assert f"UPDATE.{NAMES.events_stream}" not in allowed
        assert f"{PREFIX}.start.*" not in perms.publish_allow  # no anonymous forms
        assert not [s for s in perms.publish_allow if ".as.*" in s or ".as.>" in s]
        assert "$JS.API.STREAM.DELETE.>" in perms.publish_deny
    assert permissions_for(NAMES, "admin", "admin") is None


# --- TLS -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A test CA, a server certificate for 127.0.0.1 and a client certificate (trustme)."""
    d = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("sojourn-test-client")
    paths = {
        "ca": d / "ca.pem",
        "server_cert": d / "server.pem",
        "server_key": d / "server.key",
        "client_cert": d / "client.pem",
        "client_key": d / "client.key",
    }
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.cert_chain_pems[0].write_to_path(str(paths["server_cert"]))
    server.private_key_pem.write_to_path(str(paths["server_key"]))
    client.cert_chain_pems[0].write_to_path(str(paths["client_cert"]))
    client.private_key_pem.write_to_path(str(paths["client_key"]))
    other = trustme.CA()  # a CA the server does not know
    other.cert_pem.write_to_path(str(d / "other-ca.pem"))
    paths["other_ca"] = d / "other-ca.pem"
    return {k: str(v) for k, v in paths.items()}


@pytest_asyncio.fixture(scope="module")
async def tls_server(
    processes: None, tmp_path_factory: pytest.TempPathFactory, certs: dict[str, str]
) -> AsyncIterator[EmbeddedServer]:
    server = EmbeddedServer(
        store_dir=tmp_path_factory.mktemp("nats-tls"),
        port=0,
        auth=users(),
        auth_prefix=PREFIX,
        tls_cert=certs["server_cert"],
        tls_key=certs["server_key"],
        tls_ca=certs["ca"],
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def tls_options(server: EmbeddedServer, certs: dict[str, str], role: str = "admin") -> Any:
    return ConnectOptions(
        url=server.url_for(role),
        tls_ca=certs["ca"],
        tls_cert=certs["client_cert"],
        tls_key=certs["client_key"],
    )


async def test_tls_with_client_certificates_works(
    tls_server: EmbeddedServer, certs: dict[str, str]
) -> None:
    assert tls_server.url.startswith("tls://127.0.0.1:")
    b = await Broker.connect(tls_options(tls_server, certs))
    try:
        assert b.user == "admin"
        await ensure_topology(b, NAMES, SETTINGS)
        assert (await b.publish(NAMES.events("tls-1"), b"[]")).seq >= 1
    finally:
        await b.close()
    c = await Broker.connect(tls_options(tls_server, certs, "client"))
    try:  # the roles hold over TLS too
        await refused(c.publish(NAMES.events("tls-1"), b"[]", timeout=FAST))
    finally:
        await c.close()


async def test_a_plain_connection_to_the_tls_port_is_refused(
    tls_server: EmbeddedServer, certs: dict[str, str]
) -> None:
    plain = tls_server.url_for("admin").replace("tls://", "nats://")
    with pytest.raises(CredentialsError, match=r"requires TLS.*--tls-ca"):
        await Broker.connect(plain)
    # the right CA but no client certificate: the server verifies clients
    with pytest.raises(CredentialsError, match=r"TLS handshake .* failed.*--tls-cert"):
        await Broker.connect(ConnectOptions(url=plain, tls_ca=certs["ca"]))
    # a CA that did not sign the server's certificate
    with pytest.raises(CredentialsError, match="not accepted"):
        await Broker.connect(
            ConnectOptions(
                url=plain,
                tls_ca=certs["other_ca"],
                tls_cert=certs["client_cert"],
                tls_key=certs["client_key"],
            )
        )
    # and below nats-py: the server speaks TLS only; a plain CONNECT gets no session
    host, port = "127.0.0.1", tls_server.port
    reader, writer = await asyncio.open_connection(host, port)
    try:
        info = await asyncio.wait_for(reader.readline(), 30)
        assert json.loads(info.split(b" ", 1)[1])["tls_required"] is True
        writer.write(b'CONNECT {"verbose":true}\r\nPING\r\n')
        await writer.drain()
        rest = await asyncio.wait_for(reader.read(), 30)  # the server hangs up
        assert b"PONG" not in rest
    finally:
        writer.close()


async def test_tls_options_against_a_plain_server_are_refused(
    auth_server: EmbeddedServer, certs: dict[str, str]
) -> None:
    with pytest.raises(CredentialsError, match="does not use TLS"):
        await Broker.connect(ConnectOptions(url=auth_server.url_for("client"), tls_ca=certs["ca"]))


# --- the command line --------------------------------------------------------------------------


async def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "sojourn.actors.cli",
        *args,
        cwd=ROOT,
        env=subprocess_env(**(env or {})),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    text = out.decode() + err.decode()
    assert "Traceback" not in text, text
    return proc.returncode, err.decode()


async def test_cli_errors_are_one_clean_line(
    auth_server: EmbeddedServer, tls_server: EmbeddedServer, tmp_path: Path, admin: Broker
) -> None:
    base = ("status", "some-run", "--prefix", PREFIX)
    rc, err = await cli(*base, "--nats", auth_server.url)
    assert rc == 1 and "authorization failed at" in err and "check --nats credentials" in err
    rc, err = await cli(*base, "--nats", auth_server.url, "--creds", str(tmp_path / "nope.creds"))
    assert rc == 1 and "creds file" in err and "cannot read" in err
    rc, err = await cli(*base, "--nats", auth_server.url, "--tls-ca", str(tmp_path / "ca.pem"))
    assert rc == 1 and "TLS CA file" in err
    plain = tls_server.url_for("client").replace("tls://", "nats://")
    rc, err = await cli(*base, "--nats", plain)
    assert rc == 1 and "requires TLS" in err and PASSWORDS["client"] not in err
    # a permission refused during a command: client credentials, another deployment's prefix
    rc, err = await cli("status", "r", "--prefix", "other", "--nats", auth_server.url_for("client"))
    assert rc == 1 and "permission denied" in err and "OTHER_EVENTS" in err, err
    # and the environment works like the flags
    rc, err = await cli(*base, "--nats", auth_server.url, env={"SOJOURN_NATS_CREDS": "/nope"})
    assert rc == 1 and "creds file /nope" in err
    rc, err = await cli(*base, "--nats", auth_server.url_for("client"))
    assert rc == 1 and "no run with id 'some-run'" in err


def test_write_private_never_widens(tmp_path: Path) -> None:
    from sojourn.broker.server import write_private

    path = tmp_path / "secret"
    path.write_text("old")
    path.chmod(0o644)
    write_private(path, "new")
    assert path.read_text() == "new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["secret"]  # no temp file left over


def test_url_for_needs_a_plain_url_safe_password(tmp_path: Path) -> None:
    server = EmbeddedServer(
        store_dir=tmp_path,
        port=0,
        auth=[
            AuthUser("env", "$SOJOURN_ENV_PASSWORD", "admin"),
            AuthUser("odd", "p@ss/word", "admin"),
            AuthUser("fine", "A-z_0.9~", "admin"),
        ],
    )
    with pytest.raises(ValueError, match="no plain-text password"):
        server.url_for("env")
    with pytest.raises(ValueError, match="cannot go into a URL"):
        server.url_for("odd")
    with pytest.raises(KeyError):
        server.url_for("nobody")
    assert server.url_for("fine") == "nats://fine:A-z_0.9~@127.0.0.1:0"
