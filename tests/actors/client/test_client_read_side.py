"""The read side through ``Client``: ``view``, ``runs``, ``watch`` and ``stream`` against a real
nats-server, a worker and a projector with its SQLite model and listing service (the same
pieces ``sojourn dev`` runs)."""

from __future__ import annotations

import contextlib
from datetime import timedelta
from pathlib import Path

import pytest

from sojourn.actors import Client, Context, RunNotFound, Worker, agent
from sojourn.actors.cli._projector import running_projector
from sojourn.broker import EmbeddedServer
from sojourn.broker.connection import ConnectOptions
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import SojournError
from tests.conftest import wait_for

WORDS = ["durable ", "runs ", "stream ", "tokens"]


@agent("reader_demo")
async def reader_demo(ctx: Context, topic: str) -> str:
    async def answer() -> str:
        for i, word in enumerate(WORDS):
            await ctx.stream(word)
            await ctx.progress({"done": i + 1})
        return "".join(WORDS)

    text = await ctx.step(answer)
    await ctx.wait_for("ack")
    return f"{topic}: {text}"


async def test_view_runs_watch_and_stream(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> None:
    opts = ConnectOptions(url=nats_server.url)
    async with (
        running_projector(opts, settings, sqlite=tmp_path / "runs.sqlite3"),
        Worker([reader_demo], nats=nats_server.url, settings=settings),
    ):
        run_id = await client.start("reader_demo", "sojourn")
        await wait_for(
            lambda: _status_is(client, run_id, "waiting"), timeout=60, what="a waiting view"
        )
        view = await client.view(run_id)
        assert view is not None and view.agent == "reader_demo" and view.steps_done == 1
        assert view.waiting_on == ("signal:ack",)

        # The listing is fed by the same projector as the view, written a moment later.
        async def listed() -> bool:
            page = await client.runs(
                agent="reader_demo", status="waiting", since=timedelta(hours=1)
            )
            return [v.run_id for v in page.runs] == [run_id]

        await wait_for(listed, timeout=60, what="the waiting run in the listing")
        assert (await client.runs(agent="reader_demo", status=["completed"])).runs == ()

        # The stream so far, then a resume from the middle: exactly the chunks after it.
        async with client.stream(run_id, follow=False) as reader:
            chunks = [c async for c in reader]
        texts = [c.text for c in chunks if c.kind == "text"]
        assert "".join(texts) == "".join(WORDS)
        middle = chunks[len(chunks) // 2].offset
        async with client.stream(run_id, after=middle, follow=False) as reader:
            rest = [c.offset async for c in reader]
        assert rest == [c.offset for c in chunks if c.offset > middle]

        await client.signal(run_id, "ack")
        async with contextlib.aclosing(client.watch(run_id, timeout=60)) as views:
            seen = [v async for v in views]
        assert seen[-1].status == "completed"
        assert [v.last_seq for v in seen] == sorted({v.last_seq for v in seen})
        assert {"running", "waiting", "completed"} <= {v.status for v in seen}
        assert await client.result(run_id, timeout=30) == "sojourn: " + "".join(WORDS)


async def _status_is(client: Client, run_id: str, status: str) -> bool:
    view = await client.view(run_id)
    return view is not None and view.status == status


async def test_read_side_errors_say_what_to_do(client: Client) -> None:
    assert await client.view("nobody-here") is None
    with pytest.raises(SojournError, match="sojourn projector"):
        await client.runs(timeout=2)
    with pytest.raises(ValueError):
        await client.runs(status="sleeping")
    with pytest.raises(RunNotFound):
        async with contextlib.aclosing(client.watch("nobody-here", timeout=10)) as views:
            async for _ in views:
                pass
