"""Large values by reference on a real nats-server: stored once and shared as they grow,
read back on replay, refused when tampered with; the cutting logic with hypothesis."""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from sojourn.actors import Agent, Client, Worker
from sojourn.actors.history.values import PIECE_HARD_MAX, Values, split
from sojourn.broker import EmbeddedServer
from sojourn.broker.values import PieceStore, digest_of
from sojourn.schemas import RunCompleted, RunStarted, StepCompleted
from sojourn.schemas.codec import decode_wedge_record, encode
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import ValueUnreadable
from sojourn.schemas.events import ValueRef
from tests.actors.agents.test_waits import events_of, until_state
from tests.apps import values as app
from tests.conftest import wait_for

AGENTS: list[Agent[Any, Any]] = [app.grow, app.big_out]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=300),
    lambda inner: st.lists(inner, max_size=40) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=400,
)


@hsettings(max_examples=60, deadline=None)
@given(json_values)
def test_pieces_join_to_the_value(value: Any) -> None:
    raw = encode(value)
    data, pieces = split(raw)
    assert b"".join(pieces) == data
    assert msgspec.json.decode(data) == msgspec.json.decode(raw)
    assert all(0 < len(p) <= PIECE_HARD_MAX for p in pieces)
    assert split(raw) == (data, pieces)  # deterministic


@hsettings(max_examples=25, deadline=None)
@given(st.integers(400, 800), st.integers(0, 2**32), st.text())
def test_a_value_that_grows_at_its_end_keeps_its_pieces_but_the_tail(
    n: int, seed: int, extra: str
) -> None:
    """Only the pieces holding the end of the grown list change (its last element's piece,
    and the closing brackets'): every other piece is shared with the earlier version."""
    rnd = random.Random(seed)
    items = ["".join(rnd.choices("abc xyz", k=rnd.randint(200, 400))) for _ in range(n)]
    _, before = split(encode({"k": 1, "items": items}))
    _, after = split(encode({"k": 1, "items": [*items, extra]}))
    assert len(before) > 10
    assert before[:-2] == after[: len(before) - 2]


def test_settings_bound_the_inline_threshold() -> None:
    with pytest.raises(ValueError, match="value_inline_max"):
        Settings(value_inline_max=10)
    assert Settings().value_inline_max == 16 * 1024


@pytest_asyncio.fixture
async def worker(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Worker]:
    async with Worker(AGENTS, nats=nats_server.url, settings=settings) as w:
        yield w


async def stream_bytes(client: Client, stream: str) -> int:
    info = await client.broker.api(f"$JS.API.STREAM.INFO.{stream}", {})
    return int(info["state"]["bytes"])


async def test_a_growing_state_is_stored_once_not_once_per_step(
    worker: Worker, client: Client
) -> None:
    """The issue's proof at CI scale: a 200 KB state carried over 20 steps, each adding a small
    message, stores at most twice the state in all (history and pieces); inline it would be
    21 copies."""
    g = app.Grow(messages=200, size=1000, steps=20)
    run_id = await client.start("grow", g, run_id="grow-1", wait=True)
    assert await client.result(run_id, timeout=60) == app.expected(g)
    events = await events_of(client, run_id)
    results = [e for e in events if isinstance(e, StepCompleted)]
    assert len(results) == 21 and all(e.result_ref is not None for e in results)
    assert all(bytes(e.result) == b"null" for e in results)
    final = results[-1].result_ref
    assert final is not None
    inline = sum(e.result_ref.size for e in results if e.result_ref is not None)
    stored = await stream_bytes(client, client.names.events_stream) + await stream_bytes(
        client, client.names.values_stream
    )
    assert stored <= 2 * final.size, (stored, final.size, inline)
    assert inline > 10 * stored  # what it saved


async def test_replay_reads_references_back_on_another_worker(
    nats_server: EmbeddedServer, client: Client, settings: Settings
) -> None:
    g = app.Grow(messages=100, size=500, steps=5, wait=True)
    async with Worker(AGENTS, nats=nats_server.url, settings=settings):
        run_id = await client.start("grow", g, run_id="grow-2", wait=True)
        await until_state(client, run_id, lambda s: s.status == "waiting", what="waiting")
    # A new worker (an empty piece cache) replays the steps from their references.
    async with Worker(AGENTS, nats=nats_server.url, settings=settings):
        await client.signal(run_id, "go")
        assert await client.result(run_id, timeout=60) == app.expected(g)


async def test_a_large_input_and_output_go_by_reference(worker: Worker, client: Client) -> None:
    items = [f"item {i} " + "y" * 90 for i in range(300)]  # about 30 KB
    run_id = await client.start("big_out", items, run_id="big-1", wait=True)
    assert await client.result(run_id, timeout=30) == [*items, "more", "last"]
    started = (await events_of(client, "big-1-g2"))[0]
    assert isinstance(started, RunStarted) and started.input_ref is not None
    ends = [e for e in await events_of(client, "big-1-g2") if isinstance(e, RunCompleted)]
    assert ends and ends[0].output_ref is not None
    assert (await client.state("big-1-g2")).chain_root == run_id


async def test_a_tampered_piece_wedges_the_run_and_the_worker_goes_on(
    nats_server: EmbeddedServer, client: Client, settings: Settings
) -> None:
    g = app.Grow(messages=60, size=500, steps=2, wait=True)
    async with Worker(AGENTS, nats=nats_server.url, settings=settings):
        run_id = await client.start("grow", g, run_id="tamper-1", wait=True)
        await until_state(client, run_id, lambda s: s.status == "waiting", what="waiting")
    events = await events_of(client, run_id)
    ref = next(e.result_ref for e in events if isinstance(e, StepCompleted) and e.result_ref)
    names = client.names
    piece = names.value(ref.parts[0])
    # Replace the piece with other bytes (as an attacker with write access to the stream).
    await client.broker.api(f"$JS.API.STREAM.PURGE.{names.values_stream}", {"filter": piece})
    await client.broker.publish(piece, b'"not what was stored"')
    async with Worker(AGENTS, nats=nats_server.url, settings=settings):
        await client.signal(run_id, "go")

        async def wedged() -> bool:
            m = await client.broker.direct_get_last(names.health_stream, names.wedge(run_id))
            return m is not None

        await wait_for(wedged, timeout=30, what="the run to be wedged")
        m = await client.broker.direct_get_last(names.health_stream, names.wedge(run_id))
        assert m is not None
        record = decode_wedge_record(m.data)
        assert "does not match its digest" in record.reason, record
        # The worker is alive and serves other runs.
        other = await client.start("grow", app.Grow(messages=5, size=10, steps=1), run_id="ok-1")
        assert (await client.result(other, timeout=30))["messages"] == 6
    assert (await client.state(run_id)).status == "waiting"  # nothing was recorded


async def test_references_out_of_bounds_are_refused_before_reading(
    nats_server: EmbeddedServer, client: Client, settings: Settings
) -> None:
    await client.start("grow", app.Grow(messages=1, size=1, steps=0), run_id="topo-1")
    values = Values(PieceStore(client.broker, client.names), inline_max=1024, max_value=4096)
    good = "0" * 64
    for ref, why in (
        (ValueRef(sha256=good, size=10**9, parts=(good,)), "at most 4096"),
        (ValueRef(sha256="nope", size=10, parts=(good,)), "sha256 is malformed"),
        (ValueRef(sha256=good, size=10, parts=(good,) * 5000), "out of bounds"),
        (ValueRef(sha256=good, size=10, parts=(good,), depth=3), "out of bounds"),
        (ValueRef(sha256=good, size=10, parts=("../x",)), "malformed piece digest"),
        (ValueRef(sha256=good, size=10, parts=(good,)), "missing"),
    ):
        with pytest.raises(ValueUnreadable, match=why):
            await values.load(ref)
    # A piece larger than its reference says is refused as soon as it is read.
    big = b'"' + b"z" * 3000 + b'"'
    await values.pieces.put_many([(digest_of(big), big)])
    liar = ValueRef(sha256=hashlib.sha256(big).hexdigest(), size=100, parts=(digest_of(big),))
    with pytest.raises(ValueUnreadable, match="more than the 100 bytes"):
        await values.load(liar)
    ok = ValueRef(sha256=hashlib.sha256(big).hexdigest(), size=len(big), parts=(digest_of(big),))
    assert bytes(await values.load(ok)) == big
