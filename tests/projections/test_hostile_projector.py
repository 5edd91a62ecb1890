"""The projector's readers are total (issue 25): whatever a stranger with a plain NATS
connection stores on the subjects it follows (run events, runs-bucket entries, change
messages, its leader record, dead letters, the inbox, its snapshot) or sends to its listing
service, on a deployment without authentication, is skipped or refused, and every other run's
view goes on being written.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from sojourn.actors import Client, Worker
from sojourn.actors.client.watching import read_view
from sojourn.broker import EmbeddedServer, Names
from sojourn.broker import headers as h
from sojourn.broker.connection import Broker
from sojourn.broker.follow import read_all
from sojourn.broker.topology import ensure_topology
from sojourn.projections.listing import ListingService
from sojourn.projections.model import SNAPSHOT_OBJECT, snapshot_store
from sojourn.projections.projector import Projector
from sojourn.projections.sqlite import SqliteModel
from sojourn.schemas.codec import decode_json
from sojourn.schemas.config import Settings
from tests.actors.worker.test_hostile_readers import BLOCKS, BODIES, STATUSES, hpub, pub, raw
from tests.conftest import wait_for
from tests.hostile import nested
from tests.projections.test_projector import pj_steps

DEADLINE = 20.0


class Stranger:
    """A plain nats-py connection, and raw frames for what no client library writes."""

    def __init__(self, server: EmbeddedServer, settings: Settings, nc: NATS, broker: Broker):
        self.server = server
        self.names = Names(settings.prefix)
        self.p = settings.prefix.encode()
        self.nc = nc
        self.broker = broker

    async def publish(
        self, subject: str, body: bytes, headers: dict[str, str] | None = None
    ) -> None:
        """Stored (nats-py's JetStream publish returns once the stream has it)."""
        await self.nc.jetstream().publish(subject, body, headers=headers)

    async def junk(self, subject: str, last: str = "") -> None:
        """Every hostile body, header block and status header on ``subject``; the last one
        with a ``Status: <last>`` header if given (what a direct get of the last message
        answers)."""
        for body in BODIES:
            await self.publish(subject, body)
        await raw(self.server.port, *(hpub(subject.encode(), b, b"[]") for b in BLOCKS))
        for headers in STATUSES:
            await self.publish(subject, b"[]", headers)
        if last:
            await self.publish(subject, b"{}", {h.STATUS: last, h.DESCRIPTION: "x"})


@pytest_asyncio.fixture
async def stranger(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Stranger]:
    nc = await nats.connect(nats_server.url)
    broker = await Broker.connect(nats_server.url)
    await ensure_topology(broker, Names(settings.prefix), settings, consumers=False)
    try:
        yield Stranger(nats_server, settings, nc, broker)
    finally:
        await broker.close()
        await nc.close()


async def completed(b: Broker, names: Names, run_id: str) -> bool:
    v = await read_view(b, names, run_id)  # a client's reader: a stranger's entry is no view
    return v is not None and v.status == "completed"


async def test_event_messages_no_intake_wrote_leave_every_other_view_written(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    stranger: Stranger,
    tmp_path: Path,
) -> None:
    """A run whose first message starts nothing has no agent, so no change subject: writing
    its view used to be retried forever, and no other view was written again. A stored
    ``Status`` header failed or ended every read of the stream at that message."""
    s, n = stranger, stranger.names
    for i in range(3):
        await s.junk(n.events(f"junk{i}"))
    await raw(s.server.port, pub(s.p + b".ev.r\xff", b"[]"))
    sink = await SqliteModel.open(tmp_path / "runs.sqlite3", events_stream=n.events_stream)
    try:
        async with (
            Projector(nats=nats_server.url, settings=settings, interval=0.2, sink=sink) as pj,
            Worker([pj_steps], nats=nats_server.url, settings=settings),
        ):
            await client.start("pj_steps", 1, run_id="good")
            await wait_for(lambda: completed(s.broker, n, "good"), DEADLINE, what="good's view")
            await s.junk(n.events("junk-later"))  # and while it runs
            await client.start("pj_steps", 1, run_id="good2")
            await wait_for(lambda: completed(s.broker, n, "good2"), DEADLINE, what="good2")
            assert pj.malformed["events"] > 0
        changes = await read_all(s.broker, n.changes_stream, n.changes_all)
        assert {m.subject.split(".")[-2] for m in changes} == {"pj_steps"}
        assert await read_view(s.broker, n, "junk0") is None
    finally:
        await sink.close()


async def test_views_changes_leader_records_and_inbox_bytes_a_stranger_stored_are_passed_over(
    nats_server: EmbeddedServer, settings: Settings, client: Client, stranger: Stranger
) -> None:
    s, n = stranger, stranger.names
    await s.junk(n.leader("projector"), last="500")  # a record of no shape: free to take
    await s.junk(n.run_key("good"), last="404")
    await s.junk(n.change("pj_steps", "good"), last="503")
    await s.junk(n.dlq("start"))
    await s.junk(n.start("pj_steps", run_id="never"))
    await s.junk(n.worker("eve"))
    await s.junk(n.lease("good"))
    await s.junk(n.wedge("good"))
    async with Projector(nats=nats_server.url, settings=settings, interval=0.2) as pj:
        await wait_for(lambda: _true(pj.leading), DEADLINE, what="the leadership")
        async with Worker([pj_steps], nats=nats_server.url, settings=settings):
            await client.start("pj_steps", 2, run_id="good")
            await wait_for(lambda: completed(s.broker, n, "good"), DEADLINE, what="good's view")
        views = [v async for v in client.watch("good", timeout=10)]
        assert views[-1].status == "completed"


@pytest.mark.parametrize("where", ["description", "object"])
async def test_a_snapshot_nested_far_too_deep_is_not_used(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    stranger: Stranger,
    where: str,
) -> None:
    """A snapshot that cannot be read is logged and the model folds from sequence 1; one
    nested too deep made the projector (and the watchdog) fail to start, by recursion."""
    s, n = stranger, stranger.names
    store = snapshot_store(s.broker, n)
    await store.ensure()
    if where == "description":
        await s.publish(store._meta_subject(SNAPSHOT_OBJECT), nested(20_000))
    else:
        # {"format": 1, "x": [[[...]]]}: a field no reader looks at, 200,000 levels deep
        deep = b"\x82\xa6format\x01\xa1x" + b"\x91" * 200_000 + b"\x01"
        await store.put(SNAPSHOT_OBJECT, deep)
    async with Projector(nats=nats_server.url, settings=settings, interval=0.2) as pj:
        async with Worker([pj_steps], nats=nats_server.url, settings=settings):
            await client.start("pj_steps", 1, run_id="good")
            await wait_for(lambda: completed(s.broker, n, "good"), DEADLINE, what="good's view")
        assert pj.model.restored_from == 0


LISTING_HOSTILE: list[tuple[bytes, str]] = [
    (b"\xff\xfe", "invalid_encoding"),
    (b'{"agent": "caf\xe9"}', "invalid_encoding"),
    (b'{"agent": "x", "agent": "y"}', "duplicate_key"),
    (b'{"since": 1e400}', "out_of_range"),
    (b'{"limit": 18446744073709551616}', "out_of_range"),
    (b'{"status": ' + nested(5_000) + b"}", "too_deep"),
    (b"[" * 65 + b"]" * 65, "too_deep"),
    (b'{"limit": 5} x', "invalid_json"),
    (b'{"drop": "table"}', "invalid_query"),
]


async def test_the_listing_service_refuses_each_hostile_request_with_its_code(
    nats_server: EmbeddedServer, settings: Settings, stranger: Stranger, tmp_path: Path
) -> None:
    s, n = stranger, stranger.names
    model = await SqliteModel.open(tmp_path / "runs.sqlite3", events_stream=n.events_stream)
    service = ListingService(s.broker, n, model)
    await service.start()
    try:
        await s.broker.flush()
        for body, code in LISTING_HOSTILE:
            answer = decode_json((await s.nc.request(n.query_runs, body, timeout=5)).data)
            assert answer["error"]["code"] == code, (body[:40], answer)
        # A header block that cannot be read, and a reply subject that is not UTF-8 (no
        # answer: only an inbox is answered), then a good request is answered.
        inbox = s.nc.new_inbox()
        sub = await s.nc.subscribe(inbox, max_msgs=1)
        await raw(
            s.server.port,
            pub(n.query_runs.encode(), b"{}", reply=b"_INBOX.\xff"),
            b"HPUB %s %s %d %d\r\nXXXX\r\n\r\n{}\r\n"
            % (n.query_runs.encode(), inbox.encode(), 8, 10),
        )
        answer = json.loads((await sub.next_msg(timeout=5)).data)
        assert answer["error"]["code"] == "invalid_headers", answer
        good = decode_json((await s.nc.request(n.query_runs, b"{}", timeout=5)).data)
        assert "runs" in good, good
        assert service.answered >= 1
    finally:
        await service.stop()
        await model.close()


async def _true(value: bool) -> bool:
    return value
