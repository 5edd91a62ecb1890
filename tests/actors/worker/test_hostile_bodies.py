"""Nothing a sender writes stalls the intake: every malformed message is refused with its reason
on its first delivery, dead-lettered once, acked, and meanwhile other clients' starts are
answered at once.

The hostile sender is a plain NATS connection (nats-py, or a raw socket for header blocks no
client library would write) publishing on the deployment's own subjects.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from sojourn.actors import Client, Context, Worker, agent
from sojourn.broker import EmbeddedServer, Names
from sojourn.broker import headers as h
from sojourn.schemas import decode_dead_letter
from sojourn.schemas.config import Settings
from sojourn.schemas.wire import DeadLetter
from tests.conftest import wait_for
from tests.hostile import nested


@agent("echo")
async def echo(ctx: Context, x: Any) -> Any:
    return x


@agent("parked")
async def parked(ctx: Context) -> Any:
    return await ctx.wait_for("go")


class Hostile:
    """A worker serving ``echo`` and ``parked``, a well-behaved client, and an attacker's raw
    NATS connection on the same server."""

    def __init__(self, server: EmbeddedServer, settings: Settings, nc: NATS, client: Client):
        self.server = server
        self.names = Names(settings.prefix)
        self.nc = nc
        self.client = client

    async def ask(self, subject: str, body: bytes, headers: dict[str, str] | None = None) -> Any:
        """Publish as the attacker with a reply inbox; the intake's answer (within 5 s)."""
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox, max_msgs=1)
        try:
            await self.nc.publish(subject, body, headers={h.REPLY_TO: inbox, **(headers or {})})
            msg = await sub.next_msg(timeout=5)
        finally:
            await sub.unsubscribe()
        return json.loads(msg.data)

    async def raw_hpub(self, subject: str, header_block: bytes, body: bytes) -> None:
        """Publish with a header block exactly as given (no client library writes these)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.server.port)
        try:
            await reader.readline()  # INFO
            writer.write(b'CONNECT {"verbose":false,"headers":true,"protocol":1}\r\n')
            size = len(header_block)
            writer.write(
                b"HPUB %s %d %d\r\n" % (subject.encode(), size, size + len(body))
                + header_block
                + body
                + b"\r\nPING\r\n"
            )
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), 5)
            assert line == b"PONG\r\n", line
        finally:
            writer.close()

    async def dead_letters(self) -> list[DeadLetter]:
        js = self.nc.jetstream()
        info = await js.stream_info(self.names.dlq_stream)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            if info.state.messages == 0:
                break
            m = await js.get_msg(self.names.dlq_stream, seq)
            out.append(decode_dead_letter(m.data or b""))
        return out

    async def intake_settled(self) -> bool:
        """Every inbox message delivered once and settled: nothing pending, nothing redelivered
        (``num_redelivered`` counts the messages delivered more than once)."""
        info = await self.nc.jetstream().consumer_info(
            self.names.inbox_stream, self.names.intake_consumer
        )
        assert info.num_redelivered == 0, f"{info.num_redelivered} inbox messages redelivered"
        return bool(info.num_pending == 0 and info.num_ack_pending == 0)


@pytest_asyncio.fixture
async def hostile(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Hostile]:
    worker = Worker([echo, parked], nats=nats_server.url, settings=settings)
    await worker.start()
    nc = await nats.connect(nats_server.url)
    client = await Client.connect(nats_server.url, settings=settings)
    try:
        yield Hostile(nats_server, settings, nc, client)
    finally:
        await client.close()
        await nc.close()
        await worker.stop()


DEEP = nested(100_000)

HOLES: list[tuple[str, bytes, str]] = [
    ("not UTF-8", b"\xff\xfe{", "invalid_encoding"),
    ("not UTF-8 in the input", b'{"input": "caf\xe9"}', "invalid_encoding"),
    ("100,000 levels deep", b'{"input": ' + DEEP + b"}", "too_deep"),
    ("100,000 levels deep run_id", b'{"run_id": ' + DEEP + b"}", "too_deep"),
    ("65 levels deep", b'{"input": ' + nested(65) + b"}", "too_deep"),
    ("2,000 levels deep", b'{"input": ' + nested(2000, "{") + b"}", "too_deep"),
    ("truncated", b'{"input": {"name": "Ada", "email": ', "invalid_json"),
    ("not an object", b"[1, 2, 3]", "invalid_trigger"),
    ("a key twice", b'{"input": 1, "input": 2}', "duplicate_key"),
    ("a number out of range", b'{"input": 1e999}', "out_of_range"),
]


@pytest.mark.parametrize(("what", "body", "code"), HOLES, ids=[w for w, _, _ in HOLES])
async def test_a_malformed_start_is_refused_once_with_its_reason(
    hostile: Hostile, what: str, body: bytes, code: str
) -> None:
    answer = await hostile.ask(hostile.names.start("echo"), body)
    assert answer["error"]["code"] == code, answer
    records = [d for d in await hostile.dead_letters() if d.code == code]
    assert len(records) == 1, records
    assert records[0].sha256 and records[0].size == len(body)
    await wait_for(hostile.intake_settled, what="the intake settled")
    # the worker and its intake keep running
    assert await hostile.client.result(await hostile.client.start("echo", 7), timeout=10) == 7


async def test_malformed_messages_on_every_subject_never_delay_other_clients(
    hostile: Hostile,
) -> None:
    n = hostile.names
    await hostile.client.start("parked", None, run_id="victim", wait=True)
    await wait_for(lambda: _status_is(hostile.client, "victim", "waiting"), what="victim parked")
    subjects = [
        n.start("echo"),
        n.start("echo", run_id="x1"),
        n.signal("victim", "go"),
        n.cancel("victim"),
        n.resume("victim", "eve"),
        n.budget("victim", "eve"),
        n.decide("victim", 1, 1, "eve"),
        n.child_end("victim", "victim-c1", "eve"),
        n.spawn("echo", "eve"),
        n.schedule("nightly", "eve"),
    ]
    bodies = [body for _, body, _ in HOLES if body[:1] != b"["]  # a list is a valid payload
    # Everything hostile goes out at once, then 100 starts from another client: each of them
    # is answered within a second while the intake refuses the rest.
    for subject in subjects:
        for body in bodies:
            await hostile.nc.publish(subject, body, headers={h.REPLY_TO: hostile.nc.new_inbox()})
    for block in (b"XXXX\r\n\r\n", b"NATS/1.0\r\n\r\n", b"NATS\r\n\r\n"):
        await hostile.raw_hpub(n.start("echo"), block, b'{"input": 1}')
    await hostile.nc.publish(n.start("echo"), b'{"input": 1}', headers={"Status": "503"})

    async def timed_start(i: int) -> float:
        t0 = time.perf_counter()
        await hostile.client.start("echo", i, run_id=f"good-{i}")
        return time.perf_counter() - t0

    latencies: list[float] = []
    for batch in range(10):
        latencies += await asyncio.gather(*(timed_start(batch * 10 + i) for i in range(10)))
    assert max(latencies) < 1.0, sorted(latencies)[-5:]
    await wait_for(hostile.intake_settled, what="every inbox message settled")
    codes = {d.code for d in await hostile.dead_letters()}
    assert {"invalid_encoding", "too_deep", "invalid_json", "duplicate_key"} <= codes
    assert "invalid_headers" in codes
    # the victim was never touched: still waiting, and a proper signal still wakes it
    assert await hostile.client.status("victim") == "waiting"
    await hostile.client.signal("victim", "go", "now")
    assert await hostile.client.result("victim", timeout=10) == "now"


@pytest.mark.parametrize(
    "block",
    [b"XXXX\r\n\r\n", b"NATS\r\n\r\n", b"NATS/1.0\r\n\r\n", b"NATS/1.0\r\n: x\r\n\r\n"],
    ids=["not-NATS", "short", "empty", "nameless"],
)
async def test_a_garbled_header_block_is_refused_and_the_worker_keeps_reading(
    hostile: Hostile, block: bytes
) -> None:
    await hostile.raw_hpub(hostile.names.start("echo"), block, b'{"input": 1}')
    await wait_for(hostile.intake_settled, what="the intake settled")
    # nats-py's read loop ends on some of these blocks; the worker's must not have
    t0 = time.perf_counter()
    run_id = await hostile.client.start("echo", 2)
    assert await hostile.client.result(run_id, timeout=10) == 2
    assert time.perf_counter() - t0 < 5.0  # a dead read loop costs the 5 s intake timeout


async def test_a_status_header_on_a_stored_message_is_the_messages_own(hostile: Hostile) -> None:
    """A pull request's end is a status *from the server*; a publisher's ``Status`` header on
    a stored message must not end the request (which left the message unacked until its ack
    wait, every delivery)."""
    for status in ("503", "404", "408", "409"):
        answer = await hostile.ask(
            hostile.names.start("echo"), b'{"input": 3}', {"Status": status, "Description": "x"}
        )
        assert answer.get("created") is True, answer
    await wait_for(hostile.intake_settled, what="the intake settled")


async def _status_is(client: Client, run_id: str, status: str) -> bool:
    return (await client.status(run_id)) == status
