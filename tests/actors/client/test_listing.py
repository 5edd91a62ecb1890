"""The run listing service over the real nats-server: pages, hostile requests, ``list_runs``
and ``sojourn runs``, against a SQLite model filled directly."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from sojourn.actors.client.listing import _page, list_runs
from sojourn.broker import EmbeddedServer
from sojourn.broker.connection import Broker
from sojourn.broker.names import Names
from sojourn.projections.listing import ListingService
from sojourn.projections.sqlite import Applied, SqliteModel
from sojourn.schemas.codec import decode_json, encode
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import InvalidName, SojournError
from sojourn.schemas.views import (
    CHILDREN_SHOWN,
    ERROR_MESSAGE_MAX,
    QUERY_LIMIT_MAX,
    RunsPage,
    RunView,
    ViewError,
)
from sojourn.schemas.wire import ErrorBody, IntakeError
from tests.actors.cli.test_cli import sojourn

NOW = time.time()


def view(i: int, **fields: object) -> RunView:
    base: dict[str, object] = {
        "run_id": f"run{i:03d}",
        "agent": ("greeter", "mailer")[i % 2],
        "status": ("running", "waiting", "completed")[i % 3],
        "liveness": ("running", "waiting", "ended")[i % 3],
        "updated_at": NOW - 1000 + i,
        "started_at": NOW - 2000,
        "last_seq": i + 1,
    }
    base.update(fields)
    return RunView(**base)  # type: ignore[arg-type]


@dataclass
class Listing:
    broker: Broker
    names: Names
    model: SqliteModel
    service: ListingService

    async def ask(self, body: bytes) -> object:
        msg = await self.broker.request(self.names.query_runs, body, timeout=10.0)
        return decode_json(msg.data)


@pytest_asyncio.fixture
async def listing(
    nats_server: EmbeddedServer, settings: Settings, tmp_path: Path
) -> AsyncIterator[Listing]:
    names = Names(settings.prefix)
    model = await SqliteModel.open(tmp_path / "runs.sqlite3", events_stream=names.events_stream)
    await model.apply([Applied(i + 1, view(i), ()) for i in range(30)])
    broker = await Broker.connect(nats_server.url)
    service = ListingService(broker, names, model)
    await service.start()
    await broker.flush()
    try:
        yield Listing(broker, names, model, service)
    finally:
        await service.stop()
        await broker.close()
        await model.close()


async def test_answers_and_pages(listing: Listing) -> None:
    first = await list_runs(listing.broker, listing.names, limit=12)
    assert [v.run_id for v in first.runs] == [f"run{i:03d}" for i in range(29, 17, -1)]
    assert first.next is not None and first.position == 30
    seen = list(first.runs)
    after: str | None = first.next
    while after is not None:
        page = await list_runs(listing.broker, listing.names, limit=12, after=after)
        seen.extend(page.runs)
        after = page.next
    assert [v.run_id for v in seen] == [f"run{i:03d}" for i in range(29, -1, -1)]
    waiting = await list_runs(
        listing.broker, listing.names, agent="mailer", status=["waiting"], since=NOW - 990
    )
    assert {v.run_id for v in waiting.runs} == {
        f"run{i:03d}" for i in range(10, 30) if i % 2 == 1 and i % 3 == 1
    }
    empty = await listing.ask(b"")  # defaults
    assert isinstance(empty, dict) and len(empty["runs"]) == 30 and empty["next"] is None


HOSTILE = [
    b"not json",
    b"[1, 2]",
    b'"a string"',
    b'{"limit": 0}',
    b'{"limit": %d}' % (QUERY_LIMIT_MAX + 1),
    b'{"limit": "ten"}',
    b'{"status": ["sleeping"]}',
    b'{"liveness": ["dead"]}',
    b'{"after": "\' OR 1=1 --"}',
    b'{"after": "MS4wL2E"}',
    b'{"agent": "a.b"}',
    b'{"agent": "*"}',
    b'{"parent_run_id": ">"}',
    b'{"since": "yesterday"}',
    b'{"drop": "table"}',
    b'{"limit": 5' + b" " * 20_000 + b"}",
    b"\xff\xfe",
]


@pytest.mark.parametrize("body", HOSTILE, ids=range(len(HOSTILE)))
async def test_hostile_requests_get_an_error_answer(listing: Listing, body: bytes) -> None:
    answer = await listing.ask(body)
    assert isinstance(answer, dict) and set(answer) == {"error"}, answer
    codes = {"invalid_json", "invalid_query", "payload_too_large", "invalid_encoding"}
    assert answer["error"]["code"] in codes
    assert answer["error"]["message"]
    page = await list_runs(listing.broker, listing.names, limit=1)  # it keeps answering
    assert len(page.runs) == 1


async def test_no_answer_on_a_reply_subject_that_is_not_an_inbox(listing: Listing) -> None:
    target = f"{listing.names.prefix}.ev.victim"
    spy = await listing.broker.subscribe(target)
    await listing.broker.flush()
    await listing.broker.publish_core(listing.names.query_runs, b"{}", reply=target)
    page = await list_runs(listing.broker, listing.names, limit=1)  # handled after the first
    assert len(page.runs) == 1
    await listing.broker.flush()
    with pytest.raises(TimeoutError):
        await spy.next_msg(timeout=0.2)
    await spy.unsubscribe()
    assert listing.service.refused >= 1


async def test_a_page_larger_than_a_message_is_cut_with_next(listing: Listing) -> None:
    # Views as large as a view gets: the longest error message and every child id shown.
    error = ViewError(type="E", message="x" * ERROR_MESSAGE_MAX)
    children = tuple(f"{j:03d}" + "c" * 125 for j in range(CHILDREN_SHOWN))
    n = QUERY_LIMIT_MAX
    size = len(encode(view(0, error=error, children=children)))
    assert n * size > 1.5 * listing.broker.max_payload  # one page cannot hold them all
    await listing.model.reset()
    await listing.model.apply(
        [
            Applied(i + 1, view(i, run_id=f"big{i:04d}", error=error, children=children), ())
            for i in range(n)
        ]
    )
    first = await list_runs(listing.broker, listing.names, limit=n)
    assert 0 < len(first.runs) < n and first.next is not None
    got = list(first.runs)
    after: str | None = first.next
    while after is not None:
        page = await list_runs(listing.broker, listing.names, limit=n, after=after)
        got.extend(page.runs)
        after = page.next
    assert [v.run_id for v in got] == [f"big{i:04d}" for i in range(n - 1, -1, -1)]


async def test_list_runs_checks_its_arguments(listing: Listing) -> None:
    with pytest.raises(InvalidName):
        await list_runs(listing.broker, listing.names, agent="a b")
    with pytest.raises(ValueError):
        await list_runs(listing.broker, listing.names, status=["sleeping"])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        await list_runs(listing.broker, listing.names, status="waiting")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await list_runs(listing.broker, listing.names, limit=0)
    with pytest.raises(ValueError):
        await list_runs(listing.broker, listing.names, after="garbage!")


async def test_list_runs_without_a_projector_says_what_to_start(
    nats_server: EmbeddedServer, settings: Settings
) -> None:
    broker = await Broker.connect(nats_server.url)
    try:
        with pytest.raises(SojournError, match="sojourn projector"):
            await list_runs(broker, Names(settings.prefix), timeout=2.0)
    finally:
        await broker.close()


def test_an_error_answer_raises_its_message() -> None:
    body = encode(IntakeError(error=ErrorBody(code="invalid_trigger", message="limit 0")))
    with pytest.raises(SojournError, match="limit 0"):
        _page(body, "x")
    with pytest.raises(SojournError, match="answered something else"):
        _page(b'{"runs": 5}', "x")
    assert _page(encode(RunsPage(position=3)), "x") == RunsPage(position=3)


# --- sojourn runs -----------------------------------------------------------------------------


async def test_sojourn_runs(listing: Listing, nats_server: EmbeddedServer) -> None:
    await listing.model.apply(
        [
            Applied(
                100,
                view(
                    99,
                    run_id="broken",
                    agent="greeter",
                    status="failed",
                    liveness="ended",
                    updated_at=NOW - 5,
                    error=ViewError(type="KeyError", message="'email'\nmore"),
                ),
                (),
            ),
            Applied(
                101,
                view(
                    98,
                    run_id="busy",
                    agent="mailer",
                    status="running",
                    step="fetch",
                    step_attempt=2,
                    updated_at=NOW,
                    priority=1,
                ),
                (),
            ),
        ]
    )
    common = ("--nats", nats_server.url, "--prefix", listing.names.prefix)
    r = await sojourn("runs", *common, "--limit", "3")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].split() == ["RUN_ID", "AGENT", "STATUS", "LIVENESS", "UPDATED", "STEP/ERROR"]
    assert lines[1].split()[:4] == ["busy", "mailer", "running", "p1"]  # started at priority 1
    assert lines[2].split()[2] == "failed"  # the default priority: no tag
    assert lines[1].endswith("fetch (attempt 2)")
    assert lines[2].split()[:4] == ["broken", "greeter", "failed", "ended"]
    assert lines[2].endswith("KeyError: 'email' | more")
    starts = {line.index(line.split()[2]) for line in lines[:4]}
    assert len(starts) == 1  # the STATUS column is aligned
    assert "more" in lines[-1]  # a next page exists

    r = await sojourn("runs", *common, "--json", "--status", "failed", "--since", "1h")
    assert r.rc == 0, r.err
    body = json.loads(r.out)
    assert [v["run_id"] for v in body] == ["broken"]
    assert body[0]["error"] == {"type": "KeyError", "message": "'email'\nmore"}

    r = await sojourn("runs", *common, "--agent", "nobody")
    assert r.rc == 0 and "no runs match" in r.out

    for bad in (["--since", "yesterday"], ["--status", "sleeping"], ["--liveness", "dead"]):
        r = await sojourn("runs", *common, *bad)
        assert r.rc == 2, (bad, r)
        assert len(r.err.strip().splitlines()) == 1 and bad[1] in r.err

    await listing.service.stop()
    r = await sojourn("runs", *common)
    assert r.rc == 1 and "sojourn projector" in r.err, r
