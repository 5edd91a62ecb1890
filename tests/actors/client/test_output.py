"""Resumable output streams on a real nats-server: ``ctx.stream`` / ``ctx.progress``, the
reader (``read_output``), ``sojourn stream``, and a worker SIGKILLed mid-answer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from sojourn.actors import (
    Client,
    Context,
    OutputChunk,
    PayloadTooLarge,
    RunFailedError,
    Worker,
    agent,
    read_output,
)
from sojourn.broker import EmbeddedServer
from sojourn.broker.headers import MSG_ID
from sojourn.schemas import StepCompleted, StepStarted
from sojourn.schemas.codec import encode
from sojourn.schemas.config import Settings
from sojourn.schemas.views import Chunk
from tests import procs
from tests.actors.cli.test_cli import sojourn
from tests.conftest import wait_for

TOKENS = [f"tok{i} " for i in range(12)]
GATES: dict[str, asyncio.Event] = {}
"""Per run id: a step streams half its tokens, then waits for the test to open its gate."""


def gate(run_id: str) -> asyncio.Event:
    return GATES.setdefault(run_id, asyncio.Event())


@agent("talker")
async def talker(ctx: Context, gated: bool) -> str:
    async def answer() -> str:
        parts: list[str] = []
        for i, token in enumerate(TOKENS):
            if gated and i == len(TOKENS) // 2:
                await gate(ctx.run_id).wait()
            await ctx.stream(token)
            parts.append(token)
            if i % 4 == 3:
                await ctx.progress({"done": i + 1})
        return "".join(parts)

    text = await ctx.step(answer)
    await ctx.step(settle)  # the run goes on after the streaming step
    return text


def settle() -> None:
    return None


@agent("outside")
async def outside(ctx: Context, _: Any) -> str:
    await ctx.stream("not in a step")
    return "unreachable"


@agent("oversized")
async def oversized(ctx: Context, size: int) -> list[str]:
    async def answer() -> list[str]:
        seen = []
        try:
            await ctx.stream("x" * size)
        except PayloadTooLarge:
            seen.append("too large")
        try:
            await ctx.progress(["y" * size])
        except PayloadTooLarge:
            seen.append("too large")
        await ctx.stream("small")
        return seen

    return await ctx.step(answer)


async def collect(
    client: Client, run_id: str, *, after: int = 0, until: int | None = None, **kw: Any
) -> list[OutputChunk]:
    """Every chunk after ``after`` until the stream ends (or ``until`` chunks)."""
    got: list[OutputChunk] = []
    reader = read_output(client.broker, client.names, run_id, after=after, timeout=60, **kw)
    async with reader:
        async for c in reader:
            got.append(c)
            if until is not None and len(got) == until:
                break
    return got


def texts(chunks: list[OutputChunk]) -> list[str]:
    return [c.text for c in chunks if c.kind == "text"]


async def test_chunks_arrive_in_order_with_offsets(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    async with Worker([talker], nats=nats_server.url, settings=settings):
        reading = asyncio.create_task(collect(client, "order-1"))  # before the run exists
        await client.start("talker", False, run_id="order-1", wait=True)
        result = await client.result("order-1", timeout=30)
        got = await reading
    assert texts(got) == TOKENS
    assert result == "".join(TOKENS)
    offsets = [c.offset for c in got]
    assert offsets == sorted(set(offsets)) and offsets[0] > 0
    assert [c.chunk.index for c in got] == list(range(len(TOKENS) + 3))
    assert [c.value() for c in got if c.kind == "progress"] == [
        {"done": 4},
        {"done": 8},
        {"done": 12},
    ]
    # The execution is the sequence of the decision that stored the step's start.
    history = await client.history("order-1")
    start_seq = next(
        d.seq for d in history for e in d.events if isinstance(e, StepStarted) and e.position == 0
    )
    assert {(c.chunk.execution, c.chunk.position, c.chunk.attempt) for c in got} == {
        (start_seq, 0, 1)
    }
    assert not any(c.restarted for c in got)
    # Reading again, without following, returns the same stored chunks.
    again = await collect(client, "order-1", follow=False)
    assert [(c.offset, c.chunk) for c in again] == [(c.offset, c.chunk) for c in got]


async def test_reader_resumes_after_its_last_offset(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    run_id = "resume-1"
    async with Worker([talker], nats=nats_server.url, settings=settings):
        await client.start("talker", True, run_id=run_id, wait=True)
        first = await collect(client, run_id, until=3)  # then it disconnects
        assert texts(first) == TOKENS[:3]
        # A new connection picks up from the last offset while the step still streams.
        async with await Client.connect(nats_server.url, settings=settings) as other:
            rest = asyncio.create_task(collect(other, run_id, after=first[-1].offset))
            gate(run_id).set()
            await client.result(run_id, timeout=30)
            second = await rest
    assert texts(first) + texts(second) == TOKENS
    assert second[0].offset > first[-1].offset
    offsets = [c.offset for c in first + second]
    assert len(offsets) == len(set(offsets))
    # Resuming from the end of an ended run's output returns nothing and ends.
    assert await collect(client, run_id, after=second[-1].offset) == []


async def test_undecodable_chunk_messages_are_skipped_and_counted(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    async with Worker([talker], nats=nats_server.url, settings=settings):
        await client.start("talker", False, run_id="junk-1", wait=True)
        await client.result("junk-1", timeout=30)
    subject = client.names.output("junk-1")
    await client.broker.publish(subject, b"{not json")
    wrong_run = Chunk(run_id="someone-else", position=0, attempt=1, execution=1, index=0)
    await client.broker.publish(subject, encode(wrong_run))
    reader = read_output(client.broker, client.names, "junk-1", timeout=30)
    got = [c async for c in reader]
    assert texts(got) == TOKENS
    assert reader.skipped == 2 and reader.ended


async def test_a_retried_chunk_publish_is_stored_once(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    async with Worker([talker], nats=nats_server.url, settings=settings):
        await client.start("talker", False, run_id="dedup-1", wait=True)
        await client.result("dedup-1", timeout=30)
    got = await collect(client, "dedup-1")
    c = got[0].chunk
    # The same chunk published again (a retry after a lost ack) is the same message.
    ack = await client.broker.publish(
        client.names.output("dedup-1"),
        encode(c),
        {MSG_ID: f"out:dedup-1:{c.execution}:{c.index}"},
    )
    assert ack.duplicate and ack.seq == got[0].offset
    assert len(await collect(client, "dedup-1")) == len(got)


async def test_stream_outside_a_step_raises(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    async with Worker([outside], nats=nats_server.url, settings=settings):
        await client.start("outside", None, run_id="outside-1", wait=True)
        with pytest.raises(RunFailedError) as failed:
            await client.result("outside-1", timeout=30)
    assert failed.value.error is not None
    assert failed.value.error.type == "RuntimeError"
    assert "only available inside a step" in failed.value.error.message
    assert await collect(client, "outside-1") == []


async def test_an_oversized_chunk_raises_payload_too_large(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    async with Worker([oversized], nats=nats_server.url, settings=settings):
        await client.start("oversized", settings.max_payload, run_id="big-1", wait=True)
        assert await client.result("big-1", timeout=30) == ["too large", "too large"]
    got = await collect(client, "big-1")
    assert texts(got) == ["small"] and got[0].chunk.index == 0  # nothing else was stored


def StreamingWorker(url: str, prefix: str) -> procs.WorkerProc:
    """A worker process serving examples.streaming, killed for real."""
    return procs.WorkerProc(url, prefix, "examples.streaming")


async def test_sigkill_mid_stream_the_new_execution_is_marked_and_nothing_repeats(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    run_id = "kill-1"
    question = {"question": "why?", "tokens": 40, "delay": 0.03}
    first = StreamingWorker(nats_server.url, settings.prefix)
    second: procs.WorkerProc | None = None
    live: list[OutputChunk] = []
    try:
        await first.ready()
        reader = read_output(client.broker, client.names, run_id, timeout=120)

        async def follow() -> None:
            async for c in reader:
                live.append(c)

        following = asyncio.create_task(follow())
        await client.start("answerer", question, run_id=run_id, wait=True)

        async def streaming() -> bool:
            return len(live) >= 5

        await wait_for(streaming, what="the answer to stream")
        first.kill()
        # A reader that disconnects now, mid-answer, resumes later from its last offset.
        resume_from = live[-1].offset
        second = StreamingWorker(nats_server.url, settings.prefix)
        await second.ready()
        result = await client.result(run_id, timeout=90)
        await asyncio.wait_for(following, 60)
        resumed = await collect(client, run_id, after=resume_from)
    finally:
        first.stop()
        if second is not None:
            second.stop()

    assert reader.ended and reader.skipped == 0
    offsets = [c.offset for c in live]
    assert offsets == sorted(set(offsets))
    assert len({(c.chunk.execution, c.chunk.index) for c in live}) == len(live)
    executions = list(dict.fromkeys(c.chunk.execution for c in live))
    assert len(executions) == 2 and executions[0] < executions[1]
    old = [c for c in live if c.chunk.execution == executions[0]]
    new = [c for c in live if c.chunk.execution == executions[1]]
    assert len(old) >= 5 and all(c.chunk.attempt == 1 for c in old)
    assert all(c.chunk.attempt == 2 for c in new)
    assert new[0].restarted and new[0].chunk.index == 0 and not any(c.restarted for c in old)
    assert [c.chunk.index for c in new] == list(range(len(new)))
    assert old[-1].offset < new[0].offset  # the old execution's chunks all came first
    # The final text in the history is the last execution's text, whole.
    assert result == "".join(texts(new))
    history = [e for d in await client.history(run_id) for e in d.events]
    done = [e for e in history if isinstance(e, StepCompleted)]
    assert len(done) == 1 and msgspec.json.decode(bytes(done[0].result)) == result
    starts = {
        e.attempt: d.seq
        for d in await client.history(run_id)
        for e in d.events
        if isinstance(e, StepStarted)
    }
    assert starts == {1: executions[0], 2: executions[1]}
    # The resumed reader got exactly the chunks after its offset, none twice.
    assert [(c.offset, c.chunk) for c in resumed] == [
        (c.offset, c.chunk) for c in live if c.offset > resume_from
    ]


@pytest.fixture
async def ended_run(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> AsyncIterator[list[OutputChunk]]:
    async with Worker([talker], nats=nats_server.url, settings=settings):
        await client.start("talker", False, run_id="cli-1", wait=True)
        await client.result("cli-1", timeout=30)
    yield await collect(client, "cli-1")


async def test_cli_prints_the_text_and_after_resumes(
    nats_server: EmbeddedServer, settings: Settings, ended_run: list[OutputChunk]
) -> None:
    flags = ["--nats", nats_server.url, "--prefix", settings.prefix]
    res = await sojourn("stream", "cli-1", *flags)
    assert res.rc == 0, res.err
    assert res.out == "".join(TOKENS)  # no newline added
    assert res.err.count("[progress ") == 3

    cut = ended_run[4]
    res = await sojourn("stream", "cli-1", "--after", str(cut.offset), *flags)
    assert res.rc == 0, res.err
    assert res.out == "".join(texts([c for c in ended_run if c.offset > cut.offset]))

    res = await sojourn("stream", "cli-1", "--json", *flags)
    assert res.rc == 0, res.err
    lines = [json.loads(line) for line in res.out.splitlines()]
    assert [line["offset"] for line in lines] == [c.offset for c in ended_run]
    assert [line["text"] for line in lines if line["kind"] == "text"] == TOKENS

    res = await sojourn("stream", "no-such-run", *flags)
    assert res.rc == 1
    assert res.err.strip() == "error: no run with id 'no-such-run'"
