"""Private replies (decision 0028): every connection with a user name makes its reply inboxes
under ``_INBOX.<user>``, and the generated permissions let a restricted user subscribe to those
only, so no user sees another's PubAcks, direct-get answers, the intake's answers or listing
pages.

One authenticated server for the module with two client users (``alice``, ``mallory``), a
worker, a watchdog and an admin; a worker serves the agents and a listing service (worker role)
answers run listings. An admin's spy subscription on ``_INBOX.>`` sees every reply and checks
where each one went.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import pytest_asyncio

from sojourn.actors import Client, Watchdog, Worker
from sojourn.broker import Broker, Delivery, EmbeddedServer, Names
from sojourn.broker import headers as h
from sojourn.broker.auth import default_users, permissions_for, render_accounts
from sojourn.broker.connecting import _inbox_prefix
from sojourn.projections.listing import ListingService
from sojourn.projections.sqlite import SqliteModel
from sojourn.schemas import decode_dead_letter
from sojourn.schemas.auth import Role
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import InvalidName
from sojourn.schemas.events import SignalReceived
from sojourn.schemas.names import inbox_prefix, user_inboxes, valid_reply_subject
from tests.apps.cli_agents import cli_echo
from tests.apps.waits import gated_kid
from tests.conftest import wait_for
from tests.deployments import authenticated_server, passwords, serving

PREFIX = "privinbox"
SETTINGS = Settings(prefix=PREFIX, lease_ttl=2.0)
NAMES = Names(PREFIX)
USERS: dict[str, Role] = {
    "alice": "client",
    "mallory": "client",
    "worker": "worker",
    "watchdog": "watchdog",
    "admin": "admin",
}
PASSWORDS = passwords(USERS)
DEADLINE = 60.0
NUID = re.compile(r"[A-Za-z0-9]{22}")


# --- the names and the rendered permissions (no server) ------------------------------------------


def test_inbox_prefixes() -> None:
    assert inbox_prefix("alice") == "_INBOX.alice"
    assert inbox_prefix(None) == "_INBOX"
    assert user_inboxes("alice") == "_INBOX.alice.>"
    with pytest.raises(InvalidName):
        inbox_prefix("a.b")
    # A URL's user that is not a subject token (a server configured by hand) connects as
    # before, under the anonymous prefix: it can be no sender either.
    assert _inbox_prefix("ops.alice") == "_INBOX"
    assert _inbox_prefix("alice") == "_INBOX.alice"
    # The longest user name and a nuid and a request token stay a valid reply subject.
    longest = f"{inbox_prefix('u' * 128)}.{'N' * 22}.{'T' * 26}"
    assert valid_reply_subject(longest)


def test_each_restricted_role_subscribes_to_its_own_inboxes_only() -> None:
    roles: list[tuple[str, Role]] = [("alice", "client"), ("w1", "worker"), ("wd", "watchdog")]
    for name, role in roles:
        perms = permissions_for(NAMES, name, role)
        assert perms is not None
        inboxes = [s for s in perms.subscribe_allow if s.startswith("_INBOX")]
        assert inboxes == [f"_INBOX.{name}.>"], (role, perms.subscribe_allow)
        # only a worker answers on inboxes, anyone's
        assert ("_INBOX.>" in perms.publish_allow) == (role == "worker")
        assert not [s for s in perms.publish_allow if s.startswith("_INBOX.") and s != "_INBOX.>"]
    text = render_accounts("sojourn", default_users())
    assert '"_INBOX.client.>"' in text and '"_INBOX.watchdog.>"' in text
    assert text.count('"_INBOX.>"') == 1  # the worker's publish


# --- an authenticated deployment -----------------------------------------------------------------


@pytest_asyncio.fixture(scope="module")
async def server(
    processes: None, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[EmbeddedServer]:
    store = tmp_path_factory.mktemp("nats-private")
    async with authenticated_server(store, USERS, PASSWORDS, PREFIX) as srv:
        yield srv


@pytest_asyncio.fixture(scope="module")
async def worker(server: EmbeddedServer) -> AsyncIterator[Worker]:
    async with serving(server.url_for("worker"), [cli_echo, gated_kid], SETTINGS) as w:
        yield w


@pytest_asyncio.fixture(scope="module")
async def listing(
    server: EmbeddedServer, worker: Worker, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ListingService]:
    """The run listing service as a projector runs it, with the worker role (an empty model:
    what matters here is where its answers go)."""
    path = tmp_path_factory.mktemp("model") / "m.sqlite3"
    model = await SqliteModel.open(path, events_stream=NAMES.events_stream)
    b = await Broker.connect(server.url_for("worker"), name="test listing")
    service = ListingService(b, NAMES, model)
    await service.start()
    try:
        yield service
    finally:
        await service.stop()
        await b.close()
        await model.close()


async def connect(server: EmbeddedServer, user: str) -> Broker:
    return await Broker.connect(server.url_for(user), name=f"test {user}")


@pytest_asyncio.fixture
async def alice(server: EmbeddedServer, worker: Worker) -> AsyncIterator[Client]:
    c = await Client.connect(server.url_for("alice"), settings=SETTINGS)
    try:
        yield c
    finally:
        await c.close()


@pytest_asyncio.fixture
async def mallory(server: EmbeddedServer, worker: Worker) -> AsyncIterator[Broker]:
    b = await connect(server, "mallory")
    try:
        yield b
    finally:
        await b.close()


@dataclass
class Spy:
    """Every message an admin's subscription on ``_INBOX.>`` saw, and what one on the worker's
    inboxes saw. A message a pull request brings has its stream subject, not the inbox it was
    sent to: the second subscription tells that it went to the worker's inboxes."""

    admin: Broker
    seen: list[Delivery] = field(default_factory=list)
    worker_inboxes: list[Delivery] = field(default_factory=list)

    async def on_msg(self, msg: Delivery) -> None:
        self.seen.append(msg)

    async def on_worker_msg(self, msg: Delivery) -> None:
        self.worker_inboxes.append(msg)

    def under(self, user: str) -> list[Delivery]:
        return [m for m in self.seen if m.subject.startswith(f"_INBOX.{user}.")]


@pytest_asyncio.fixture
async def spy(server: EmbeddedServer) -> AsyncIterator[Spy]:
    admin = await connect(server, "admin")
    s = Spy(admin)
    subs = [
        await admin.subscribe("_INBOX.>", cb=s.on_msg),
        await admin.subscribe(user_inboxes("worker"), cb=s.on_worker_msg),
    ]
    await admin.flush()
    try:
        yield s
    finally:
        for sub in subs:
            await sub.unsubscribe()
        await admin.close()


async def refused_subscription(b: Broker, subject: str) -> None:
    """Subscribing ``b`` to ``subject`` is refused: the server reports the violation (after the
    SUB, before its next PONG)."""
    t0 = time.monotonic()
    sub = await b.subscribe(subject)
    try:

        async def reported() -> bool:
            await b.flush()
            return b.denied(subject, since=t0)

        await wait_for(reported, DEADLINE, what=f"the refusal of {subject} for {b.user}")
    finally:
        await sub.unsubscribe()


def is_json_object_with(msg: Delivery, *keys: str) -> bool:
    try:
        body = json.loads(msg.data)
    except ValueError:
        return False
    return isinstance(body, dict) and all(k in body for k in keys)


async def test_every_connection_makes_its_inboxes_under_its_user(
    server: EmbeddedServer, nats_server: EmbeddedServer
) -> None:
    for user in USERS:
        b = await connect(server, user)
        try:
            assert b.inbox_prefix == f"_INBOX.{user}"
            inbox = b.new_inbox()
            head, _, nuid = inbox.rpartition(".")
            assert head == f"_INBOX.{user}" and NUID.fullmatch(nuid), inbox
            assert valid_reply_subject(inbox)  # the intake answers on it
        finally:
            await b.close()
    anonymous = await Broker.connect(nats_server.url)  # a server without users
    try:
        assert anonymous.user is None and anonymous.inbox_prefix == "_INBOX"
        head, _, nuid = anonymous.new_inbox().rpartition(".")
        assert head == "_INBOX" and NUID.fullmatch(nuid)
    finally:
        await anonymous.close()


@pytest.mark.parametrize("who", ["mallory", "worker", "watchdog"])
@pytest.mark.parametrize("subject", ["_INBOX.alice.>", "_INBOX.>", "_INBOX.*.>", "_INBOX.alice.*"])
async def test_no_one_may_subscribe_to_another_users_inboxes(
    server: EmbeddedServer, worker: Worker, who: str, subject: str
) -> None:
    b = await connect(server, who)
    try:
        await refused_subscription(b, subject)
        # its own inboxes: allowed
        t0 = time.monotonic()
        own = await b.subscribe(f"_INBOX.{who}.>")
        await b.flush()
        assert not b.denied(f"_INBOX.{who}.>", since=t0)
        await own.unsubscribe()
    finally:
        await b.close()


async def test_alice_works_and_her_replies_come_to_her_inboxes_only(
    alice: Client,
    mallory: Broker,
    spy: Spy,
    server: EmbeddedServer,
    listing: ListingService,
) -> None:
    overheard: list[Delivery] = []

    async def overhear(msg: Delivery) -> None:
        overheard.append(msg)

    t0 = time.monotonic()
    eavesdrop = await mallory.subscribe("_INBOX.>", cb=overhear)
    await mallory.flush()

    # alice's requests all work: each answer comes to her own inboxes
    run_id = await alice.start("cli_echo", {"text": "hi"}, wait=True, timeout=DEADLINE)
    assert await alice.result(run_id, timeout=DEADLINE) == {"echo": "hi", "loud": "HI"}
    assert await alice.status(run_id) == "completed"
    gated = await alice.start("gated_kid", 3, wait=True, timeout=DEADLINE)

    async def waiting() -> bool:
        return await alice.status(gated) == "waiting"

    await wait_for(waiting, DEADLINE, what="the gated run to wait")
    # the watchdog reads every run through its own inboxes
    survey = await Watchdog(nats=server.url_for("watchdog"), settings=SETTINGS).survey()
    assert gated in survey and run_id not in survey  # judges live runs only
    await alice.signal(gated, "go", 5)
    assert await alice.result(gated, timeout=DEADLINE) == 15
    signals = [
        e for d in await alice.history(gated) for e in d.events if isinstance(e, SignalReceived)
    ]
    assert [s.sent_by for s in signals] == ["alice"]
    page = await alice.runs(timeout=DEADLINE)  # the listing service (worker role) answers
    assert page.runs == ()
    assert (await alice.broker.api("$JS.API.INFO"))["type"].endswith("account_info_response")

    # mallory's eavesdropping heard nothing (before private inboxes: every PubAck, read and
    # answer of alice's), and the server says it refused it
    await mallory.flush()
    assert [m.subject for m in overheard] == []

    async def reported() -> bool:
        await mallory.flush()
        return mallory.denied("_INBOX.>", since=t0)

    await wait_for(reported, DEADLINE, what="the refusal of mallory's _INBOX.>")
    await eavesdrop.unsubscribe()
    assert overheard == []

    # every reply the admin saw went to a user's own inboxes, never an anonymous one
    await spy.admin.flush()  # the admin's copies are in too: sent as the originals were
    replies = [m for m in spy.seen if m.subject.startswith("_INBOX.")]
    owners = {m.subject.split(".")[1] for m in replies}
    assert owners <= set(USERS), owners
    mine = spy.under("alice")
    assert [m for m in mine if is_json_object_with(m, "stream", "seq")], "no PubAck"
    assert [m for m in mine if is_json_object_with(m, "run_id", "created")], "no intake answer"
    assert [m for m in mine if m.headers.get("Nats-Stream") == NAMES.events_stream], "no read"
    assert [m for m in mine if is_json_object_with(m, "runs", "position")], "no listing page"
    assert spy.under("watchdog"), "no watchdog replies"
    assert spy.under("worker"), "no worker replies"
    # the starts a pull request brought the worker came to the worker's inboxes
    intake_acks = f"$JS.ACK.{NAMES.inbox_stream}.{NAMES.intake_consumer}."
    pulled = [m for m in spy.worker_inboxes if m.reply.startswith(intake_acks)]
    assert {m.subject for m in pulled} >= {NAMES.start("cli_echo", "alice", run_id)}, pulled


async def test_a_client_may_not_publish_into_another_users_inbox(
    mallory: Broker, alice: Client
) -> None:
    """Answers come from workers only: a client cannot forge one into alice's inboxes."""
    got: list[Delivery] = []

    async def on_msg(msg: Delivery) -> None:
        got.append(msg)

    inbox = alice.broker.new_inbox()
    sub = await alice.broker.subscribe(inbox, cb=on_msg)
    await alice.broker.flush()
    try:
        t0 = time.monotonic()
        await mallory.publish_core(inbox, b'{"run_id": "forged", "created": true}')

        async def reported() -> bool:
            await mallory.flush()
            return mallory.denied(inbox, since=t0)

        await wait_for(reported, DEADLINE, what="the refusal of mallory's publish")
        await alice.broker.flush()  # anything forwarded to alice would be here by now
        assert got == []
    finally:
        await sub.unsubscribe()


async def test_the_intake_answers_a_sender_only_in_its_own_inboxes(
    mallory: Broker, alice: Client, spy: Spy
) -> None:
    """mallory may read pending starts in the inbox stream, and so alice's reply subjects: she
    names one on a message of her own, hoping the intake's answer to *her* message lands in
    alice's pending request. Under authentication the intake answers a message sent as
    ``<sender>`` only under ``_INBOX.<sender>.``: mallory's message is refused, answered
    nowhere, dead-lettered."""
    victim_inbox = alice.broker.new_inbox()
    got: list[Delivery] = []

    async def on_msg(msg: Delivery) -> None:
        got.append(msg)

    sub = await alice.broker.subscribe(victim_inbox, cb=on_msg)
    await alice.broker.flush()
    try:
        run_id = f"forge-{uuid.uuid4().hex[:8]}"
        await mallory.publish(
            NAMES.start("cli_echo", "mallory", run_id),
            b'{"input": {"text": "x"}}',
            {h.REPLY_TO: victim_inbox},
        )

        async def dead_lettered() -> bool:
            msgs = await spy.admin.direct_get_range(NAMES.dlq_stream, NAMES.dlq("start"))
            return any(
                d.code == "invalid_reply_to" and run_id in d.subject
                for d in (decode_dead_letter(m.data) for m in msgs)
            )

        await wait_for(dead_lettered, DEADLINE, what="mallory's start dead-lettered")
        await alice.broker.flush()
        assert got == []
        assert not [m for m in spy.under("alice") if m.subject == victim_inbox]
        assert await alice.store.last_seq(run_id) == 0  # and no run was made
    finally:
        await sub.unsubscribe()
    # alice's own requests are answered where she asked
    receipt = await alice.trigger("cli_echo", {"text": "mine"})
    assert receipt.created is True
