"""Bad input gets a clear error, a dead-letter record, and loses nothing.

Each case publishes the way a user of another language would (raw NATS, JSON bytes, a
``Sojourn-Reply-To`` header), then checks the intake's answer, the dead-letter record, that no
run was half-created, and that the worker still serves the next valid trigger.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import msgspec
import pytest
import pytest_asyncio

from sojourn.actors import Client, Context, TriggerRejected, Worker, agent
from sojourn.broker import Broker, EmbeddedServer, Names
from sojourn.broker import headers as h
from sojourn.schemas import (
    BrokerUnavailable,
    InvalidName,
    PayloadTooLarge,
    UnknownAgent,
    decode_dead_letter,
)
from sojourn.schemas.config import Settings


class Signup(msgspec.Struct, frozen=True):
    email: str
    plan: str = "free"


@agent("signup")
async def signup(ctx: Context, req: Signup) -> str:
    return req.email


@pytest_asyncio.fixture
async def deployment(
    nats_server: EmbeddedServer, settings: Settings
) -> AsyncIterator[tuple[Broker, Names, Client]]:
    worker = Worker([signup], nats=nats_server.url, settings=settings)
    await worker.start()
    broker = await Broker.connect(nats_server.url)
    client = await Client.connect(nats_server.url, settings=settings)
    try:
        yield broker, Names(settings.prefix), client
    finally:
        await client.close()
        await broker.close()
        await worker.stop()


async def send_raw(broker: Broker, subject: str, data: bytes) -> dict[str, object]:
    """Publish like a foreign client and return the intake's JSON answer."""
    inbox = broker.new_inbox()
    sub = await broker.subscribe(inbox, max_msgs=1)
    try:
        await broker.publish(subject, data, {h.REPLY_TO: inbox})
        msg = await sub.next_msg(timeout=15)
    finally:
        await sub.unsubscribe()
    answer: dict[str, object] = json.loads(msg.data)
    return answer


async def dead_letter(broker: Broker, names: Names, kind: str = "start"):  # type: ignore[no-untyped-def]
    m = await broker.direct_get_last(names.dlq_stream, names.dlq(kind))
    assert m is not None, "no dead-letter record"
    return decode_dead_letter(m.data)


async def assert_still_serving(client: Client) -> None:
    run_id = await client.start("signup", {"email": "ok@example.com"}, wait=True)
    assert await client.result(run_id, timeout=30) == "ok@example.com"


CASES = [
    # (description, subject suffix (agent), body, expected code, text in message)
    (
        "unknown agent",
        "nosuch",
        b'{"input": {"email": "a@b"}, "run_id": "bad-1"}',
        "unknown_agent",
        "nosuch",
    ),
    ("invalid JSON", "signup", b'{"input": {"email": ', "invalid_json", "not valid JSON"),
    ("not an object", "signup", b"[1, 2, 3]", "invalid_trigger", "Expected `object`"),
    (
        "unknown field",
        "signup",
        b'{"inputs": {"email": "a@b"}, "run_id": "bad-2"}',
        "invalid_trigger",
        "inputs",
    ),
    ("missing input", "signup", b'{"run_id": "bad-3"}', "invalid_trigger", "input"),
    (
        "input fails the type",
        "signup",
        b'{"input": {"email": 5}, "run_id": "bad-4"}',
        "invalid_input",
        "Expected `str`, got `int` - at `$.email`",
    ),
    (
        "input missing a field",
        "signup",
        b'{"input": {"plan": "pro"}, "run_id": "bad-5"}',
        "invalid_input",
        "missing required field `email`",
    ),
    (
        "run id with a dot",
        "signup",
        b'{"input": {"email": "a@b"}, "run_id": "a.b"}',
        "invalid_run_id",
        "run_id",
    ),
    (
        "run id too long",
        "signup",
        b'{"input": {"email": "a@b"}, "run_id": "' + b"x" * 200 + b'"}',
        "invalid_run_id",
        "1-128",
    ),
]


@pytest.mark.parametrize(
    ("what", "agent_name", "body", "code", "text"), CASES, ids=[c[0] for c in CASES]
)
async def test_rejected_trigger(
    deployment: tuple[Broker, Names, Client],
    what: str,
    agent_name: str,
    body: bytes,
    code: str,
    text: str,
) -> None:
    broker, names, client = deployment
    answer = await send_raw(broker, names.start(agent_name), body)
    assert answer["error"]["code"] == code, answer  # type: ignore[index]
    assert text in answer["error"]["message"], answer  # type: ignore[index]
    record = await dead_letter(broker, names)
    assert record.code == code
    assert record.data == body  # the original bytes are kept verbatim
    assert record.subject == names.start(agent_name)
    # No run was half-created for any id the trigger named.
    for run_id in ("bad-1", "bad-2", "bad-3", "bad-4", "bad-5"):
        assert await client.store.last_seq(run_id) == 0
    await assert_still_serving(client)


async def test_oversized_trigger_is_rejected_by_the_intake(
    deployment: tuple[Broker, Names, Client], settings: Settings
) -> None:
    broker, names, client = deployment
    big = json.dumps(
        {"input": {"email": "x" * (settings.max_payload + 10)}, "run_id": "bad-big"}
    ).encode()
    answer = await send_raw(broker, names.start("signup"), big)
    assert answer["error"]["code"] == "payload_too_large"  # type: ignore[index]
    assert str(settings.max_payload) in answer["error"]["message"]  # type: ignore[index]
    record = await dead_letter(broker, names)
    assert record.code == "payload_too_large" and len(record.data) == len(big)
    assert await client.store.last_seq("bad-big") == 0
    await assert_still_serving(client)


async def test_client_refuses_oversized_and_invalid_names_before_publishing(
    deployment: tuple[Broker, Names, Client], settings: Settings
) -> None:
    _, _, client = deployment
    with pytest.raises(PayloadTooLarge, match="limit"):
        await client.start("signup", {"email": "x" * settings.max_payload})
    with pytest.raises(InvalidName, match="agent name"):
        await client.start("sign.up", {"email": "a@b"})
    with pytest.raises(InvalidName, match="run_id"):
        await client.start("signup", {"email": "a@b"}, run_id="has space")


async def test_client_maps_rejections_to_typed_errors(
    deployment: tuple[Broker, Names, Client],
) -> None:
    _, _, client = deployment
    with pytest.raises(UnknownAgent, match="nosuch"):
        await client.start("nosuch", {}, wait=True)
    with pytest.raises(TriggerRejected) as info:
        await client.start("signup", {"nope": 1}, wait=True)
    assert info.value.code == "invalid_input"


async def test_cancel_of_unknown_run_is_dead_lettered(
    deployment: tuple[Broker, Names, Client],
) -> None:
    broker, names, client = deployment
    answer = await send_raw(broker, names.cancel("ghost"), b'{"reason": "test"}')
    assert answer["error"]["code"] == "unknown_run"  # type: ignore[index]
    record = await dead_letter(broker, names, "cancel")
    assert record.code == "unknown_run" and record.kind == "cancel"
    answer = await send_raw(broker, names.cancel("ghost"), b"{not json")
    assert answer["error"]["code"] == "invalid_json"  # type: ignore[index]
    assert await client.store.last_seq("ghost") == 0
    await assert_still_serving(client)


async def test_same_run_id_started_twice_is_one_run(
    deployment: tuple[Broker, Names, Client],
) -> None:
    broker, names, client = deployment
    first = await client.trigger("signup", {"email": "a@b"}, run_id="once")
    assert first.created is True
    # A raw publisher with no Msg-Id (so broker dedup cannot help) and a different input.
    answer = await send_raw(
        broker, names.start("signup"), b'{"input": {"email": "other@b"}, "run_id": "once"}'
    )
    assert answer == {"run_id": "once", "created": False}
    assert await client.result("once", timeout=30) == "a@b"
    events = [e for d in await client.history("once") for e in d.events]
    assert sum(type(e).__name__ == "RunStarted" for e in events) == 1


async def test_a_run_id_started_many_times_at_once_is_one_run_created_once(
    deployment: tuple[Broker, Names, Client],
) -> None:
    """Ten starts of one run id in one burst (raw, no Msg-Id): the worker opens each in memory
    (``worker/opening.py``) and the first append of each is create-only, so one is stored and
    answered ``created``; the others find the run and are answered ``created: false``, their
    activations writing nothing."""
    broker, names, client = deployment
    bodies = [b'{"input": {"email": "%d@b"}, "run_id": "burst"}' % i for i in range(10)]
    answers = await asyncio.gather(*(send_raw(broker, names.start("signup"), b) for b in bodies))
    assert sorted(a["created"] for a in answers) == [False] * 9 + [True]  # type: ignore[type-var]
    assert {a["run_id"] for a in answers} == {"burst"}
    winner = await client.result("burst", timeout=30)
    history = await client.history("burst")
    events = [e for d in history for e in d.events]
    assert sum(type(e).__name__ == "RunStarted" for e in events) == 1
    assert [type(e).__name__ for e in events] == ["RunStarted", "RunCompleted"]
    assert isinstance(winner, str) and winner.endswith("@b")


async def test_broker_down_is_a_clear_error() -> None:
    with pytest.raises(
        BrokerUnavailable, match=r"no NATS server answered at nats://127\.0\.0\.1:1"
    ):
        await Client.connect("nats://127.0.0.1:1")
