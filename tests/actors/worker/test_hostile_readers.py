"""Every reader besides the intake is total (issue 25): whatever a stranger with a plain NATS
connection publishes on a subject a worker, the scheduler, the watchdog or a client reads, on a
deployment without authentication, is refused (dead-lettered once and acked, where a durable
consumer delivered it), skipped or ended with a clear error; nothing else changes, nothing is
redelivered, and every other message goes on as before.

The stranger is nats-py, or a raw socket for what no client library writes: subjects that are
not UTF-8, header blocks nats-py cannot parse. The projector's readers are in
tests/projections/test_hostile_projector.py.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from sojourn.actors import Client, Context, Worker, agent
from sojourn.actors.client.base import TriggerRejected
from sojourn.actors.client.watching import follow_history, watch_run
from sojourn.actors.gateway import BearerTokens, GatewayConfig, GatewayServer, create_app
from sojourn.actors.gateway._sse import encode_event
from sojourn.actors.ops.watchdog import Watchdog
from sojourn.broker import EmbeddedServer, Names
from sojourn.broker import headers as h
from sojourn.broker.archive import decode_archive
from sojourn.broker.follow import read_all
from sojourn.broker.objects import ObjectStore
from sojourn.broker.registry import AgentRegistry
from sojourn.broker.schedules import ScheduleStore
from sojourn.projections.model import SNAPSHOT_OBJECT, snapshot_store
from sojourn.projections.projector import Projector
from sojourn.schemas.codec import decode_dead_letter, encode_events
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import HistoryError
from sojourn.schemas.events import RunStarted
from sojourn.schemas.wire import DeadLetter
from tests.conftest import wait_for
from tests.hostile import nested

DEADLINE = 60.0
"""How long a test waits for what a loaded machine may take seconds to do."""

# --- what a stranger writes ------------------------------------------------------------------

BODIES: list[bytes] = [
    b"\xff\xfe{",  # not UTF-8
    b'{"a": "caf\xe9"}',  # not UTF-8 in a string
    nested(100_000),  # 100,000 levels deep
    nested(2_000, "{"),
    b"not json",
    b'{"run_id": 1, "run_id": 2}',  # a key twice
    b"[1e400, 18446744073709551616]",  # numbers out of range
    b'{"worker_id": 7, "runs": "x"}',  # the wrong shape
    b"",
]

BLOCKS: list[bytes] = [
    b"XXXX\r\n\r\n",
    b"NATS\r\n\r\n",
    b"NATS/1.0\r\n: x\r\n\r\n",
    b"NATS/1.0\r\n\xff\xfe: \xff\r\n\r\n",
]
"""Header blocks nats-server passes on as they are and nats-py cannot parse (or parses into
nothing sensible)."""

STATUSES: list[dict[str, str]] = [{h.STATUS: s, h.DESCRIPTION: "x"} for s in ("500", "204", "503")]
"""Headers any publisher may set that mean something to a reader of status answers."""


def pub(subject: bytes, body: bytes, reply: bytes = b"") -> bytes:
    """A ``PUB`` frame with ``subject`` and ``reply`` exactly as given (any bytes)."""
    head = b"PUB " + subject + (b" " + reply if reply else b"") + b" %d\r\n" % len(body)
    return head + body + b"\r\n"


def hpub(subject: bytes, block: bytes, body: bytes) -> bytes:
    """An ``HPUB`` frame with the header block exactly as given."""
    head = b"HPUB " + subject + b" %d %d\r\n" % (len(block), len(block) + len(body))
    return head + block + body + b"\r\n"


async def raw(port: int, *frames: bytes) -> None:
    """Send protocol frames as written, and wait until the server has processed them."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await reader.readline()  # INFO
        writer.write(b'CONNECT {"verbose":false,"headers":true,"protocol":1}\r\n')
        for frame in frames:
            writer.write(frame)
        writer.write(b"PING\r\n")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 5)
        assert line == b"PONG\r\n", line
    finally:
        writer.close()


START = RunStarted(run_id="claimed", agent="echo", input=msgspec.Raw(b"null"))

# --- the deployment ----------------------------------------------------------------------------

INTERRUPTED: set[str] = set()
STEP_BEGAN: set[str] = set()


@agent("echo")
async def echo(ctx: Context, x: Any) -> Any:
    return x


@agent("parked")
async def parked(ctx: Context) -> Any:
    return await ctx.wait_for("go")


@agent("stuck")
async def stuck(ctx: Context) -> str:
    async def wait_long() -> str:
        STEP_BEGAN.add(ctx.run_id)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            INTERRUPTED.add(ctx.run_id)
            raise
        return "done"

    return await ctx.step(wait_long)


@agent("chatty")
async def chatty(ctx: Context, n: int) -> int:
    async def say() -> None:
        for i in range(n):
            await ctx.stream(f"t{i} ")

    await ctx.step(say)
    return n


class World:
    """A worker serving the agents above, a well-behaved client, and a stranger's nats-py
    connection, on one deployment."""

    def __init__(
        self, server: EmbeddedServer, settings: Settings, worker: Worker, client: Client, nc: NATS
    ) -> None:
        self.server = server
        self.settings = settings
        self.names = Names(settings.prefix)
        self.worker = worker
        self.client = client
        self.nc = nc
        self.p = settings.prefix.encode()

    async def send(self, *frames: bytes) -> None:
        await raw(self.server.port, *frames)

    async def publish(
        self, subject: str, body: bytes, headers: dict[str, str] | None = None
    ) -> None:
        """A stranger's publish on a stored subject, with nats-py's JetStream publish: it
        returns once the stream has stored the message."""
        await self.nc.jetstream().publish(subject, body, headers=headers)

    async def notice(
        self, subject: str, body: bytes, headers: dict[str, str] | None = None
    ) -> None:
        """A stranger's core publish (nothing stores it), flushed."""
        await self.nc.publish(subject, body, headers=headers)
        await self.nc.flush()

    async def dead_letters(self) -> list[DeadLetter]:
        msgs = await read_all(
            self.client.broker, self.names.dlq_stream, f"{self.names.prefix}.dlq.*"
        )
        return [decode_dead_letter(m.data) for m in msgs]

    async def mark(self, subject: str) -> int:
        """A well-formed message of ours after the stranger's (an empty one, acked by the
        stream): once it is stored, everything published before it on the subject is."""
        return (await self.client.broker.publish(subject, b"")).seq

    async def acked(self, stream: str, consumer: str, seq: int) -> bool:
        """The consumer has settled every message up to stream sequence ``seq``, each on its
        first delivery."""
        info = await self.client.broker.api(f"$JS.API.CONSUMER.INFO.{stream}.{consumer}")
        assert info["num_redelivered"] == 0, f"{consumer}: {info['num_redelivered']} redelivered"
        return bool(info["ack_floor"]["stream_seq"] >= seq and info["num_ack_pending"] == 0)

    async def settled(self, stream: str, consumer: str) -> bool:
        """Every message of the consumer delivered once and settled."""
        info = await self.client.broker.api(f"$JS.API.CONSUMER.INFO.{stream}.{consumer}")
        assert info["num_redelivered"] == 0, f"{consumer}: {info['num_redelivered']} redelivered"
        return bool(info["num_pending"] == 0 and info["num_ack_pending"] == 0)

    async def serves(self, timeout: float = 5.0) -> None:
        """The worker still takes starts and runs them (its connection still reads)."""
        t0 = time.perf_counter()
        run_id = await self.client.start("echo", "ok")
        assert await self.client.result(run_id, timeout=timeout) == "ok"
        assert time.perf_counter() - t0 < timeout


async def _world(server: EmbeddedServer, settings: Settings) -> AsyncIterator[World]:
    worker = Worker([echo, parked, stuck, chatty], nats=server.url, settings=settings)
    await worker.start()
    client = await Client.connect(server.url, settings=settings)
    nc = await nats.connect(server.url)
    try:
        yield World(server, settings, worker, client, nc)
    finally:
        await nc.close()
        await client.close()
        await worker.stop()


@pytest_asyncio.fixture
async def world(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[World]:
    async for w in _world(nats_server, settings):
        yield w


@pytest_asyncio.fixture
async def steady_world(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[World]:
    """``world`` with the default lease (30 s): for a test that counts redeliveries, which the
    tests' 2 s ack deadline can cause on a loaded machine through no fault of the code (seen
    once in a full run on 2 cores)."""
    steady = msgspec.structs.replace(settings, lease_ttl=Settings().lease_ttl)
    async for w in _world(nats_server, steady):
        yield w


async def parked_run(w: World, run_id: str) -> int:
    """Start a ``parked`` run and wait until it waits; its last events-stream sequence."""
    await w.client.start("parked", None, run_id=run_id, wait=True)

    async def waiting() -> bool:
        return (await w.client.status(run_id)) == "waiting"

    await wait_for(waiting, DEADLINE, what=f"{run_id} waiting")
    return await w.client.store.last_seq(run_id)


# --- subjects that are not names -------------------------------------------------------------


async def test_subjects_that_are_not_utf8_or_not_names_are_refused_and_the_worker_reads_on(
    world: World,
) -> None:
    """nats-server stores and delivers any bytes as a subject; nats-py's read loop used to end
    on the first that was not UTF-8 (the worker then heard nothing more, from anyone). Each is
    now refused like a malformed subject, on every subject the worker pulls or listens to."""
    w, p, n = world, world.p, world.names
    stored = [
        (p + b".wake.r\xff\xfe", "invalid_run_id"),  # unrouted wake
        (p + b".wake.echo.r\xff", "invalid_run_id"),  # routed wake
        (p + b".wake.echo.bad$id", "invalid_run_id"),
        (p + b".schedule.fire.echo.n\xff", "invalid_trigger"),
        (p + b".schedule.fire.echo.bad$name", "invalid_trigger"),
        (p + b".start.echo.r\xff", None),  # the intake's (its own code)
    ]
    await w.send(
        *(pub(subject, b"{}") for subject, _ in stored),
        pub(p + b".interrupt.r\xff", b""),  # core NATS, heard by every worker
        pub(n.interrupt("x").encode(), b"", reply=b"_INBOX.\xff"),  # a reply that is not UTF-8
    )
    await w.serves()
    shown = {subject.decode("utf-8", "backslashreplace"): code for subject, code in stored}

    async def all_refused() -> bool:
        return len([d for d in await w.dead_letters() if d.subject in shown]) >= len(shown)

    await wait_for(all_refused, DEADLINE, what="a dead letter for each")
    for stream, consumer in (
        (n.wake_stream, n.wake_consumer),
        (n.wake_stream, n.agent_wake_consumer("echo")),
        (n.schedules_stream, n.fire_consumer("echo")),
        (n.inbox_stream, n.intake_consumer),
    ):
        await wait_for(functools.partial(w.settled, stream, consumer), DEADLINE, what=consumer)
    letters = [d for d in await w.dead_letters() if d.subject in shown]
    assert sorted(d.subject for d in letters) == sorted(shown), letters  # one each
    for d in letters:
        assert shown[d.subject] in (None, d.code), d


# --- wakes -----------------------------------------------------------------------------------


async def test_a_wake_with_any_body_or_headers_is_a_hint_that_changes_nothing(world: World) -> None:
    """A wake's meaning is its subject; its body is never read and its headers only label it.
    So a wake with a hostile body or header block on a valid wake subject is a wake: the run is
    looked at and left as its history says, the wake is acked once. (Dead-lettered instead, it
    would lose the wake it replaced: the stream keeps one per run.)"""
    w, n = world, world.names
    before = await parked_run(w, "victim")
    subject = n.wake("victim", "parked")
    for body in BODIES:
        await w.publish(subject, body)
    for headers in [*STATUSES, {h.WAKE_REASON: "x" * 300}]:
        await w.publish(subject, b"x", headers)
    await w.send(*(hpub(subject.encode(), block, b"\xff") for block in BLOCKS))
    last = await w.mark(subject)
    await w.publish(n.wake("nobody", "echo"), nested(100_000))  # a run that does not exist
    nobody = await w.mark(n.wake("nobody", "echo"))
    consumer = n.agent_wake_consumer("parked")
    await wait_for(lambda: w.acked(n.wake_stream, consumer, last), DEADLINE, what="the wakes acked")
    await wait_for(lambda: w.acked(n.wake_stream, n.agent_wake_consumer("echo"), nobody), DEADLINE)
    assert await w.client.status("victim") == "waiting"
    assert await w.client.store.last_seq("victim") == before  # nothing appended
    assert await w.client.store.last_seq("nobody") == 0  # nothing created
    assert [d for d in await w.dead_letters() if d.kind == "other"] == []
    await w.client.signal("victim", "go", 5)
    assert await w.client.result("victim", timeout=10) == 5


async def test_a_wake_for_a_history_no_intake_wrote_gives_the_run_up_not_back(
    steady_world: World,
) -> None:
    """A history whose first message starts nothing (anyone may publish on an event subject)
    cannot be executed: its wake used to be handed back as misrouted, for hours. The run is
    given up on once (a wedge record, a ``poison`` dead letter) and the wake acked."""
    w, n = steady_world, steady_world.names
    await w.publish(n.events("junk"), b"[]")
    await w.publish(n.wake("junk", "echo"), b"")
    await wait_for(lambda: w.settled(n.wake_stream, n.agent_wake_consumer("echo")), DEADLINE)
    # Unrouted, too, once the first activation has ended: a wake for a run still active here
    # is handed back by design (a redelivery), and the ack comes before the activation ends.
    await wait_for(lambda: _true("junk" not in w.worker._active), DEADLINE, what="idle")
    await w.publish(n.wake("junk"), b"")
    await wait_for(lambda: w.settled(n.wake_stream, n.wake_consumer), DEADLINE)
    letters = [d for d in await w.dead_letters() if d.subject == n.events("junk")]
    assert letters and {d.code for d in letters} == {"poison"}, letters
    wedge = await w.client.broker.direct_get_last(n.health_stream, n.wedge("junk"))
    assert wedge is not None and b'"permanent":true' in wedge.data
    assert w.worker.misrouted == 0
    await w.serves()


async def test_a_wake_routed_to_another_agent_is_passed_on_not_handed_back(world: World) -> None:
    """Only the workers serving an agent pull its wakes, so a wake routed to the wrong agent
    (a stranger's) would be handed back to them for hours: it is published where the run's
    agent is served, and acked."""
    w, n = world, world.names
    started = RunStarted(run_id="elsewhere", agent="other", input=msgspec.Raw(b"null"))
    await w.publish(n.events("elsewhere"), encode_events([started]))
    await w.publish(n.wake("elsewhere", "echo"), b"")

    async def moved() -> bool:
        m = await w.client.broker.direct_get_last(n.wake_stream, n.wake("elsewhere", "other"))
        return m is not None and m.header(h.WAKE_REASON) == "rewake"

    await wait_for(moved, DEADLINE, what="the wake passed on")
    await wait_for(lambda: w.settled(n.wake_stream, n.agent_wake_consumer("echo")), DEADLINE)
    assert await w.client.store.last_seq("elsewhere") == 1  # nothing appended
    assert w.worker.misrouted == 0


# --- schedules -------------------------------------------------------------------------------


async def test_a_fire_with_a_garbled_header_block_or_no_fire_headers_is_refused_once(
    world: World,
) -> None:
    w, n = world, world.names
    # Three schedules' subjects: the stream keeps one fire per schedule, so three fires of one
    # schedule published faster than the worker takes them would replace one another.
    subject = n.schedule_fire("echo", "nightly1").encode()
    await w.send(hpub(subject, b"XXXX\r\n\r\n", b"forged 1"))
    await w.publish(n.schedule_fire("echo", "nightly2"), b"forged 2", STATUSES[0])
    await w.publish(n.schedule_fire("echo", "nightly3"), nested(100_000))

    async def refused() -> bool:
        return len(await w.dead_letters()) >= 3

    await wait_for(refused, DEADLINE, what="three dead letters")
    consumer = n.fire_consumer("echo")
    await wait_for(lambda: w.settled(n.schedules_stream, consumer), DEADLINE, what="fires settled")
    codes = sorted(d.code for d in await w.dead_letters())
    assert codes == ["invalid_headers", "invalid_trigger", "invalid_trigger"], codes
    assert await w.client.schedules() == []


@pytest.mark.parametrize(
    "record",
    [
        b"\xff not a record",
        nested(100_000),
        # readable, but nothing a worker writes: no time can be armed for it
        b'{"name": "every1", "spec": {"agent": "echo", "every": 1, "input": 1}, '
        b'"next_fire_at": 1e300}',
        b'{"name": "every1", "spec": {"agent": "no.such", "every": 1, "input": 1}}',
    ],
    ids=["not-utf8", "deep", "time-out-of-range", "agent-not-a-name"],
)
async def test_a_schedule_whose_record_was_replaced_by_garbage_dead_letters_its_fire_once(
    world: World, record: bytes
) -> None:
    """A fire whose record cannot be read or used used to be handed back every second (up to
    ``max_deliveries``, 1,000 times). It is kept once (``poison``) and acked; the schedule
    fires no more, other schedules are listed, requests on it are refused, delete removes it."""
    w, n = world, world.names
    await w.client.add_schedule("every1", agent="echo", every="1s", input=1)
    await w.client.add_schedule("daily", agent="echo", cron="0 3 * * *", input=2)
    await w.publish(n.schedule_record("every1"), record)

    async def poisoned() -> bool:
        return any(d.code == "poison" for d in await w.dead_letters())

    await wait_for(poisoned, DEADLINE, what="the fire's dead letter")
    await wait_for(lambda: w.settled(n.schedules_stream, n.fire_consumer("echo")), DEADLINE)
    [letter] = [d for d in await w.dead_letters() if d.code == "poison"]
    assert letter.subject == n.schedule_fire("echo", "every1") and "every1" in letter.message
    listed = [r.name for r in await w.client.schedules()]  # an unreadable one is left out
    assert listed == (["daily", "every1"] if record.startswith(b'{"name"') else ["daily"])
    with pytest.raises(TriggerRejected) as refused:
        await w.client.pause_schedule("every1")
    assert refused.value.code == "invalid_schedule"
    assert await w.client.delete_schedule("every1")
    store = ScheduleStore(w.client.broker, n)
    assert await store.get("every1") is None
    assert [r.name for r in await store.all()] == ["daily"]


# --- interrupt notices -----------------------------------------------------------------------


async def test_interrupt_notices_a_stranger_sends_interrupt_nothing(world: World) -> None:
    """Notices are hints: hostile ones (any body, header block, subject or reply) make the
    executing activation look at its history, which holds no cancel, and its step runs on;
    the worker still hears the real notice, and a cancel interrupts the step at once."""
    w, n = world, world.names
    await w.client.start("stuck", None, run_id="busy", wait=True)
    await wait_for(lambda: _true("busy" in STEP_BEGAN), DEADLINE, what="the step to begin")
    subject = n.interrupt("busy")
    for body in BODIES:
        await w.notice(subject, body)
    for headers in STATUSES:
        await w.notice(subject, b"", headers)
    await w.send(
        *(hpub(subject.encode(), block, b"") for block in BLOCKS),
        pub(subject.encode(), b"", reply=b"_INBOX.\xff"),
        pub(w.p + b".interrupt.busy\xff", b""),  # refused: no run has that id
    )
    heard = len(BODIES) + len(STATUSES) + len(BLOCKS) + 1
    await wait_for(lambda: _true(w.worker.interrupts.notices >= heard), 5, what="the notices")
    assert w.worker.interrupts.notices == heard
    assert "busy" not in INTERRUPTED
    t0 = time.perf_counter()
    await w.client.cancel("busy")
    await wait_for(lambda: _true("busy" in INTERRUPTED), 5, what="the step interrupted")
    assert time.perf_counter() - t0 < 1.5  # the notice, not the 2 s backup look
    await wait_for(lambda: _status_is(w.client, "busy", "cancelled"), DEADLINE, what="cancelled")


# --- heartbeats, the registry, progress records ---------------------------------------------


async def test_heartbeats_agents_and_progress_records_a_stranger_writes_are_passed_over(
    world: World,
) -> None:
    """The health, agents and leases streams take anything on their subjects. A record that
    cannot be read is no beat, no agent's record, no progress report; a stored ``Status``
    header is the message's, never a read's end (it used to end every read of the stream
    there, or fail it: no worker was ever judged dead again)."""
    w, n = world, world.names
    await parked_run(w, "victim")
    for i, body in enumerate(BODIES):
        await w.publish(n.worker(f"eve{i}"), body)
        await w.publish(n.lease("victim"), body)
        await w.publish(n.agent(f"ghost{i}"), body)
    for i, headers in enumerate(STATUSES):
        await w.publish(n.worker(f"mallory{i}"), b"{}", headers)
        await w.publish(n.agent(f"spooky{i}"), b"{}", headers)
        await w.publish(n.lease("victim"), b"{}", headers)
    await w.send(
        *(hpub(n.worker("trudy").encode(), block, b"{}") for block in BLOCKS),
        pub(w.p + b".worker.\xff", b"{}"),
        pub(w.p + b".agent.\xff", b"{}"),
    )
    await w.worker.heartbeats.look()  # raised on a stored Status header
    assert w.worker.membership.alive(w.worker.worker_id)
    registry = AgentRegistry(w.client.broker, n)
    known = await registry.known()
    assert {"echo", "parked", "spooky0", "spooky1", "spooky2"} <= set(known)
    for name in ("spooky0", "spooky1", "spooky2"):  # the records exist, whatever they hold
        assert await registry.is_known(name)
    liveness = await w.client.liveness("victim")  # raised on a progress record of no shape
    assert liveness.state == "waiting", liveness
    await w.serves()


async def test_a_beat_listing_runs_that_are_not_names_does_not_stop_takeovers(
    world: World,
) -> None:
    """When a worker falls silent the others wake the runs its last beat listed. A beat of the
    right shape listing a run id that is no subject token (``>``) made that wake's publish fail,
    and with it the look at the workers: every other worker found dead in the same look was
    never taken over. Such a beat is now no beat."""
    w, n = world, world.names
    now = time.time()

    def beat(worker_id: str, run_id: str) -> bytes:
        runs = [[run_id, "echo", now]]
        body = {"worker_id": worker_id, "agents": ["echo"], "at": now, "started_at": now}
        return json.dumps({**body, "runs": runs, "interval": 0.25}).encode()

    await w.publish(n.worker("bad"), beat("bad", ">"))
    await w.publish(n.worker("bad2"), beat("bad2", "two tokens.x"))
    await w.publish(n.worker("gone"), beat("gone", "orphan"))  # a real-looking one that dies

    async def taken_over() -> bool:
        m = await w.client.broker.direct_get_last(n.wake_stream, n.wake("orphan", "echo"))
        return m is not None and m.header(h.WAKE_REASON) == "takeover"

    await wait_for(taken_over, DEADLINE, what="the silent worker's run woken")
    assert not w.worker.membership.known("bad") and not w.worker.membership.known("bad2")


async def test_what_a_stranger_stores_above_a_dead_workers_last_beat_does_not_stop_takeovers(
    world: World,
) -> None:
    """A dead worker's runs claimed after its last beat are read from the events stream above
    the beat's ``events_seq``. A stranger's beat pointing there, and decisions signed with its
    writer whose bodies are not events, whose subjects are no run ids, or that say nothing is
    left to do, wake nothing and do not stop the listed run's takeover; one that names a run
    with work is woken (a wake is only a hint: the run's own history decides)."""
    w, n = world, world.names
    floor = await w.mark(n.events("marker"))
    signed = {h.WRITER: "ghost.1"}
    await w.publish(n.events("junk"), b"not json", signed)
    await w.publish(n.events("deep"), nested(100_000), signed)
    await w.publish(n.events("bad$id"), encode_events([START]), signed)
    await w.publish(n.events("notmine"), encode_events([START]), {h.WRITER: "other.1"})
    await w.publish(n.events("claimed"), encode_events([START]), signed)
    now = time.time()
    runs = [["orphan2", "echo", now]]
    body = {"worker_id": "ghost", "agents": ["echo"], "at": now, "started_at": now}
    beat = {**body, "runs": runs, "interval": 0.25, "events_seq": floor}
    await w.publish(n.worker("ghost"), json.dumps(beat).encode())

    async def woken(run_id: str) -> bool:
        m = await w.client.broker.direct_get_last(n.wake_stream, n.wake(run_id, "echo"))
        return m is not None and m.header(h.WAKE_REASON) == "takeover"

    await wait_for(functools.partial(woken, "orphan2"), DEADLINE, what="the listed run woken")
    await wait_for(functools.partial(woken, "claimed"), DEADLINE, what="the claimed run woken")
    for run_id in ("junk", "deep", "bad$id", "notmine"):
        assert not await woken(run_id), run_id
    await w.serves()


# --- the watchdog ----------------------------------------------------------------------------


async def test_the_watchdog_scans_on_whatever_its_streams_and_snapshot_hold(world: World) -> None:
    w, n = world, world.names
    await parked_run(w, "victim")
    for i, body in enumerate(BODIES):
        await w.publish(n.events(f"junk{i}"), body)
        await w.publish(n.worker(f"eve{i}"), body)
        await w.publish(n.wedge("victim"), body)
        await w.publish(n.lease("victim"), body)
        await w.publish(n.watch("victim"), body)
    for i, headers in enumerate(STATUSES):
        await w.publish(n.events(f"status{i}"), b"[]", headers)
        await w.publish(n.watch(f"status{i}"), b"{}", headers)
        await w.publish(n.wedge(f"status{i}"), b"{}", headers)
    await w.send(*(hpub(n.events("garbled").encode(), block, b"[]") for block in BLOCKS))
    # A snapshot whose description is 20,000 levels deep: the watchdog starts without it.
    store = snapshot_store(w.client.broker, n)
    await store.ensure()
    await w.publish(ObjectStore._meta_subject(store, SNAPSHOT_OBJECT), nested(20_000))
    wd = Watchdog(nats=w.server.url, settings=w.settings, interval=0.2)
    await wd._open()  # what start() does before its loop: the scans are made here
    try:
        judged = await wd.scan()
        for _ in range(50):
            if wd.model.caught_up:
                break
            judged = await wd.scan()
        assert wd.model.caught_up
        assert judged["victim"].state == "waiting", judged["victim"]
        assert judged["junk0"].state == "wedged"  # a history that cannot be read: reported
        # Its claim subject's last message carries a stored "Status: 503" header: a claim.
        assert await wd._claim(judged["status2"], 1, time.time())
    finally:
        await wd.stop()


# --- what clients follow ---------------------------------------------------------------------


async def test_a_watch_skips_what_a_stranger_publishes_on_its_run_and_ends_with_the_run(
    world: World,
) -> None:
    w, n = world, world.names
    async with Projector(nats=w.server.url, settings=w.settings, interval=0.2):
        await parked_run(w, "victim")
        subject = n.change("parked", "victim")

        async def junk() -> None:
            for body in BODIES:
                await w.publish(subject, body)
            for headers in STATUSES:
                await w.publish(subject, b"{}", headers)
            await w.send(
                *(hpub(subject.encode(), block, b"{}") for block in BLOCKS),
                pub(w.p + b".runs.parked.victim\xff", b"{}"),
            )

        await junk()  # stored before the watch starts, and published while it runs
        seen: list[str] = []
        async for view in watch_run(w.client.broker, n, "victim", timeout=10):
            seen.append(view.status)
            if view.status == "waiting" and seen.count("waiting") == 1:
                await junk()
                await w.client.signal("victim", "go", 1)
        assert seen[-1] == "completed", seen


async def test_following_a_history_a_stranger_appended_garbage_to_ends_with_history_error(
    world: World,
) -> None:
    w, n = world, world.names
    await parked_run(w, "victim")
    await w.publish(n.events("victim"), nested(100_000))
    with pytest.raises(HistoryError):
        async with asyncio.timeout(10):
            async for _ in follow_history(w.client.broker, n, "victim"):
                pass


def _chunk(run_id: str, value: bytes = b"null", **fields: Any) -> bytes:
    body = {
        "run_id": run_id, "position": 0, "attempt": 1, "execution": 1, "index": 0,
        "kind": "progress", "text": "", "at": 1.0, **fields,
    }  # fmt: skip
    return json.dumps(body).encode()[:-1] + b', "value": ' + value + b"}"


HOSTILE_CHUNKS = [
    *BODIES,
    _chunk("someone-else"),
    _chunk("chat", position=-1),
    _chunk("chat", kind="noise"),
]


async def test_the_output_reader_skips_what_is_not_a_chunk_of_its_run(world: World) -> None:
    """Chunks a stranger stores on a run's output subject are skipped and counted; a stored
    ``Status`` header is a chunk's own; a value with line breaks comes on one line."""
    w, n = world, world.names
    subject = n.output("chat")
    for body in HOSTILE_CHUNKS:
        await w.publish(subject, body)
    for headers in STATUSES:
        await w.publish(subject, b"{}", headers)
    await w.send(*(hpub(subject.encode(), block, b"{}") for block in BLOCKS))
    await w.publish(subject, _chunk("chat", b"[1,\n\n2]", index=7))
    run_id = await w.client.start("chatty", 3, run_id="chat")
    assert await w.client.result(run_id, timeout=10) == 3
    async with w.client.stream("chat", timeout=10) as reader:
        chunks = [c async for c in reader]
    texts = [c.text for c in chunks if c.kind == "text"]
    assert texts == ["t0 ", "t1 ", "t2 "], texts
    [forged] = [c for c in chunks if c.kind == "progress"]
    assert bytes(forged.chunk.value) == b"[1,  2]" and forged.value() == [1, 2]
    assert json.dumps(forged.as_json(), default=_raw).count("\n") == 0
    assert reader.skipped == len(HOSTILE_CHUNKS) + len(STATUSES) + len(BLOCKS)


def _raw(value: Any) -> Any:
    return json.loads(bytes(value)) if isinstance(value, msgspec.Raw) else value


TOKEN = "hostile-readers-token-0123456789"


async def test_the_gateway_event_stream_sends_each_chunk_on_one_line(world: World) -> None:
    """A forged chunk whose value holds line breaks used to be sent as it was stored: the event
    was cut at the first blank line and its ``data`` was not JSON."""
    w, n = world, world.names
    run_id = await w.client.start("chatty", 2, run_id="said")
    assert await w.client.result(run_id, timeout=10) == 2
    await w.publish(n.output("said"), _chunk("said", b'{"a":\n\n[1,\r\n2]}', index=9))
    await w.publish(n.output("said"), nested(100_000))

    async def connect() -> Client:
        return await Client.connect(w.server.url, settings=w.settings)

    config = GatewayConfig(tokens=BearerTokens({TOKEN: "client"}), keepalive=1.0)
    server = GatewayServer(create_app(connect, config), "127.0.0.1", 0)
    url = await server.start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with http.stream("GET", "/v1/runs/said/stream", headers=headers) as r:
                assert r.status_code == 200
                text = (await r.aread()).decode()
    finally:
        await server.stop()
    events = [e for e in text.split("\n\n") if e and not e.startswith(":")]
    parsed = []
    for e in events:
        lines = dict(line.split(": ", 1) for line in e.split("\n"))
        parsed.append((lines["event"], json.loads(lines["data"])))
    assert [e for e, _ in parsed] == ["chunk", "chunk", "chunk", "end"], text
    assert parsed[2][1]["value"] == {"a": [1, 2]}


def test_an_event_is_one_data_line_whatever_its_json_holds() -> None:
    """The event stream's own guard, for any value that was stored as written."""
    event = encode_event("chunk", 3, b'{"a":\r\n[1,\n\n2]}')
    assert event == b'event: chunk\nid: 3\ndata: {"a":  [1,  2]}\n\n'
    assert json.loads(event.split(b"data: ")[1]) == {"a": [1, 2]}


def test_an_archive_nested_200000_levels_deep_is_a_history_error() -> None:
    """``decode_archive`` (``Client.history`` of an archived run, retention) raised
    ``RecursionError`` on a document a stranger stored with a field nested that deep."""
    deep = b"\x82\xa6format\x01\xa1x" + b"\x91" * 200_000 + b"\x01"
    with pytest.raises(HistoryError):
        decode_archive("r1", deep)


async def _true(value: bool) -> bool:
    return value


async def _status_is(client: Client, run_id: str, status: str) -> bool:
    return (await client.status(run_id)) == status
