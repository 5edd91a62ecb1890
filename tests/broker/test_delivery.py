"""The façade's own types against a real server: a consumer's ``Delivery`` (settling it, its
metadata), core subscriptions, typed publish acks and refusals, direct gets' ``StoredMessage``,
and what is translated so that nothing above the broker sees nats-py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC

import pytest
import pytest_asyncio

from sojourn.broker import (
    BROKER_ERRORS,
    Broker,
    Delivery,
    EmbeddedServer,
    JetStreamError,
    Names,
    NotADelivery,
    PublishAck,
    StoredMessage,
    headers,
)
from sojourn.broker.eventstore import WRONG_LAST_SEQUENCE
from sojourn.broker.follow import StreamFollower
from sojourn.broker.topology import ensure_topology
from sojourn.schemas import BrokerUnavailable
from sojourn.schemas.config import Settings


@pytest_asyncio.fixture
async def deployment(
    nats_server: EmbeddedServer, settings: Settings
) -> AsyncIterator[tuple[Broker, Names]]:
    broker = await Broker.connect(nats_server.url)
    names = Names(settings.prefix)
    await ensure_topology(broker, names, settings)
    try:
        yield broker, names
    finally:
        await broker.close()


async def test_a_consumers_message_is_a_delivery(deployment: tuple[Broker, Names]) -> None:
    broker, names = deployment
    subject = names.start("greeter")
    ack = await broker.publish(subject, b'{"input": 1}', {headers.MSG_ID: "d-1"})
    assert ack == PublishAck(stream=names.inbox_stream, seq=ack.seq, duplicate=False)
    consumer = await broker.pull(names.inbox_stream, names.intake_consumer)
    try:
        [d] = await consumer.fetch(batch=10, timeout=5.0)
        assert isinstance(d, Delivery)
        assert (d.subject, d.data) == (subject, b'{"input": 1}')
        assert d.headers == {headers.MSG_ID: "d-1"} and d.header(headers.MSG_ID) == "d-1"
        assert d.header(headers.REPLY_TO) == "" and d.header(headers.REPLY_TO, "-") == "-"
        assert d.reply.startswith("$JS.ACK.")
        assert (d.num_delivered, d.stream_seq, d.consumer_seq) == (1, ack.seq, 1)
        assert (d.stream, d.consumer, d.num_pending) == (names.inbox_stream, "intake", 0)
        assert d.timestamp.tzinfo is not None and d.timestamp.utcoffset() == UTC.utcoffset(None)
        await d.in_progress()
        await d.nak()  # handed back: delivered again at once
        [again] = await consumer.fetch(batch=10, timeout=5.0)
        assert (again.num_delivered, again.stream_seq) == (2, ack.seq)
        await again.ack()
        assert await consumer.fetch(batch=10, timeout=0.2) == []
    finally:
        await consumer.close()


async def test_publish_acks_and_refusals_are_typed(deployment: tuple[Broker, Names]) -> None:
    broker, names = deployment
    subject = names.events("pa-1")
    fence = {headers.EXPECTED_LAST_SUBJECT_SEQUENCE: "0", headers.MSG_ID: "pa-1:0"}
    first = await broker.try_publish(subject, b"[]", fence)
    assert isinstance(first, PublishAck) and first.stream == names.events_stream
    again = await broker.try_publish(subject, b"[]", {headers.MSG_ID: "pa-1:0"})
    assert again == PublishAck(stream=names.events_stream, seq=first.seq, duplicate=True)
    broken = await broker.try_publish(subject, b"[]", {headers.EXPECTED_LAST_SUBJECT_SEQUENCE: "0"})
    assert isinstance(broken, JetStreamError) and broken.err_code == WRONG_LAST_SEQUENCE
    assert broken.description and broken.description in broken.message
    with pytest.raises(JetStreamError) as info:
        await broker.publish(subject, b"[]", {headers.EXPECTED_LAST_SUBJECT_SEQUENCE: "0"})
    assert info.value.err_code == WRONG_LAST_SEQUENCE
    nobody = await broker.try_publish(f"{names.prefix}.nowhere", b"")
    assert isinstance(nobody, JetStreamError) and nobody.code == 503


async def test_core_subscriptions_requests_and_timeouts(deployment: tuple[Broker, Names]) -> None:
    broker, names = deployment
    got: asyncio.Queue[Delivery] = asyncio.Queue()

    async def on_msg(d: Delivery) -> None:
        await got.put(d)

    subject = f"{names.prefix}.core.x"
    sub = await broker.subscribe(subject, cb=on_msg)
    await broker.flush()
    try:
        await broker.publish_core(subject, b"hi", {headers.WAKE_REASON: "test"})
        d = await asyncio.wait_for(got.get(), 10)
        assert (d.subject, d.data, d.headers) == (subject, b"hi", {headers.WAKE_REASON: "test"})
        with pytest.raises(NotADelivery):
            _ = d.num_delivered
    finally:
        await sub.unsubscribe()

    async def answer(d: Delivery) -> None:
        await d.respond(d.data.upper())

    service = await broker.subscribe(f"{names.prefix}.core.echo", cb=answer)
    await broker.flush()
    try:
        reply = await broker.request(f"{names.prefix}.core.echo", b"ping", timeout=10)
        assert reply.data == b"PING"
    finally:
        await service.unsubscribe()

    inbox = broker.new_inbox()
    quiet = await broker.subscribe(inbox, max_msgs=1)
    try:
        with pytest.raises(TimeoutError) as timeout:
            await quiet.next_msg(timeout=0.05)
        assert type(timeout.value) is TimeoutError  # not nats-py's
    finally:
        await quiet.unsubscribe()

    async def ignore(d: Delivery) -> None:
        pass

    silent = await broker.subscribe(f"{names.prefix}.core.silent", cb=ignore)
    await broker.flush()
    try:
        with pytest.raises(TimeoutError) as timeout:
            await broker.request(f"{names.prefix}.core.silent", b"", timeout=0.2)
        assert type(timeout.value) is TimeoutError
    finally:
        await silent.unsubscribe()
    with pytest.raises(BROKER_ERRORS):  # nobody subscribed: no responders
        await broker.request(f"{names.prefix}.core.nobody", b"", timeout=5)


async def test_the_facade_hides_nats(deployment: tuple[Broker, Names]) -> None:
    import nats.errors

    broker, _ = deployment
    assert BROKER_ERRORS == (nats.errors.Error, BrokerUnavailable, JetStreamError)
    assert not hasattr(broker, "nc") and not hasattr(broker, "js")
    assert broker.max_payload >= 1024 * 1024
    assert headers.MSG_ID == "Nats-Msg-Id"
    assert headers.EXPECTED_LAST_SUBJECT_SEQUENCE == "Nats-Expected-Last-Subject-Sequence"


def test_a_stored_message_is_read_from_a_direct_gets_answer() -> None:
    from nats.aio.msg import Msg

    answer = {
        headers.SUBJECT: "t.ev.r1",
        headers.SEQUENCE: "42",
        headers.TIME_STAMP: "2025-01-02T03:04:05.123456789Z",
        "Nats-Stream": "t-events",
        headers.WRITER: "w1",
    }
    m = StoredMessage.from_nats(Msg(None, subject="_INBOX.x", data=b"[]", headers=answer))  # type: ignore[arg-type]
    assert (m.subject, m.seq, m.data) == ("t.ev.r1", 42, b"[]")  # the stored subject, not the inbox
    assert m.headers == answer and m.headers is not answer
    assert m.header(headers.WRITER) == "w1" and m.header(headers.MSG_ID, "-") == "-"
    assert abs(m.time - (1735787045 + 0.123456789)) < 1e-6
    assert "t.ev.r1" in repr(m) and "#42" in repr(m)
    bare = StoredMessage.from_nats(Msg(None, subject="_INBOX.y", data=b"x"))  # type: ignore[arg-type]
    assert (bare.subject, bare.seq, bare.headers, bare.time) == ("", 0, {}, 0.0)
    odd = {headers.SEQUENCE: "1", headers.TIME_STAMP: "not a time"}
    assert StoredMessage.from_nats(Msg(None, headers=odd)).time == 0.0  # type: ignore[arg-type]
    made = StoredMessage(subject="s", seq=1, data=b"")
    assert (made.headers, made.time) == ({}, 0.0)


async def test_direct_gets_return_stored_messages(deployment: tuple[Broker, Names]) -> None:
    broker, names = deployment
    subject = names.events("sm-1")
    before = time.time()
    acks = [
        await broker.publish(subject, f"[{i}]".encode(), {headers.MSG_ID: f"sm-1:{i}"})
        for i in range(3)
    ]
    last = await broker.direct_get_last(names.events_stream, subject)
    assert isinstance(last, StoredMessage)
    assert (last.subject, last.seq, last.data) == (subject, acks[-1].seq, b"[2]")
    assert last.header(headers.MSG_ID) == "sm-1:2" and last.headers[headers.SEQUENCE] == str(
        last.seq
    )
    assert before - 5 < last.time < time.time() + 5
    nxt = await broker.direct_get_next(names.events_stream, subject, acks[0].seq + 1)
    assert nxt is not None and (nxt.seq, nxt.data) == (acks[1].seq, b"[1]")
    assert await broker.direct_get_last(names.events_stream, names.events("sm-none")) is None
    assert await broker.direct_get_next(names.events_stream, subject, acks[-1].seq + 1) is None
    every = await broker.direct_get_range(names.events_stream, subject, page=2)
    assert [(m.seq, m.data) for m in every] == [
        (a.seq, f"[{i}]".encode()) for i, a in enumerate(acks)
    ]
    assert all(isinstance(m, StoredMessage) and m.subject == subject for m in every)
    page, pending = await broker.direct_get_batch(names.events_stream, names.events_all, 1, 2)
    assert [m.seq for m in page] == [acks[0].seq, acks[1].seq] and pending >= 1
    follower = StreamFollower(broker, names.events_stream, subject, page=2)
    first = await follower.next_page()
    assert [m.seq for m in first] == [acks[0].seq, acks[1].seq] and follower.pending == 1
    assert (follower.last_seq, follower.last_time) == (acks[1].seq, first[-1].time)
    rest = await follower.next_page()
    assert [m.data for m in rest] == [b"[2]"] and follower.pending == 0
    assert await follower.next_page() == []


@pytest.mark.parametrize(
    "reply",
    [
        "$JS.ACK.S.C.3.10.7.1700000000000000000.5",
        "$JS.ACK._.ACC.S.C.2.11.8.1700000000000000000.4.r4nd0m",
        "$JS.ACK.hub.ACC.S.C.1.99.98.1700000000000000000.0",
    ],
)
def test_a_deliverys_counts_are_read_from_its_ack_subject_as_nats_py_reads_them(
    reply: str,
) -> None:
    from nats.aio.msg import Msg

    msg = Msg(_client=None, subject="s", reply=reply, data=b"")  # type: ignore[arg-type]
    d = Delivery(msg)
    meta = Msg(_client=None, subject="s", reply=reply, data=b"").metadata  # type: ignore[arg-type]
    assert (d.num_delivered, d.stream_seq, d.consumer_seq, d.num_pending) == (
        meta.num_delivered,
        meta.sequence.stream,
        meta.sequence.consumer,
        meta.num_pending,
    )
    assert d.timestamp == meta.timestamp
    assert d.stored_at == meta.timestamp.timestamp()


@pytest.mark.parametrize(
    "reply", [None, "", "_INBOX.abc.1", "$JS.ACK.S.C.x.10.7.1.5", "$JS.ACK.S.C.3", "$JS.NAK.a.b.c"]
)
def test_a_message_without_an_ack_subject_of_a_consumer_has_no_counts(reply: str | None) -> None:
    from nats.aio.msg import Msg

    d = Delivery(Msg(_client=None, subject="s", reply=reply or "", data=b""))  # type: ignore[arg-type]
    for read in ("num_delivered", "stream_seq", "consumer_seq", "num_pending", "stored_at"):
        with pytest.raises(NotADelivery):
            getattr(d, read)
