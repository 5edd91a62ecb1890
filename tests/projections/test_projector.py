"""The projector on a real nats-server: KV views, change messages, crashes, leadership,
pending runs, hostile bytes and rebuilds.

Workers run in-process (the agents below); projectors run in-process, except in the crash
test, where ``sojourn projector`` is a real subprocess that is SIGKILLed mid-stream.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest_asyncio

from sojourn.actors import Client, Context, RetryPolicy, Worker, agent, step
from sojourn.actors.ops.metrics import _projector_families
from sojourn.broker import EmbeddedServer, Names
from sojourn.broker import headers as h
from sojourn.broker.connection import Broker
from sojourn.broker.delivery import StoredMessage
from sojourn.broker.headers import KV_OPERATION
from sojourn.broker.topology import ensure_topology
from sojourn.projections.projector import Projector
from sojourn.projections.sqlite import SqliteModel
from sojourn.projections.summary import summarize_all
from sojourn.projections.views import view_of
from sojourn.schemas.codec import encode, from_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.views import RunView
from sojourn.schemas.wire import StartTrigger
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for

DEADLINE = 90.0
_failed: set[str] = set()


@step(retry=RetryPolicy(retry_on=(ConnectionError,), attempts=3, initial_interval=0.05, jitter=0))
def flaky(key: str) -> str:
    if key not in _failed:
        _failed.add(key)
        raise ConnectionError("first attempt fails")
    return key


def work(i: int) -> int:
    time.sleep(0.01)
    return i


@agent("pj_steps")
async def pj_steps(ctx: Context, n: int) -> int:
    """``n`` steps, then a flaky one that fails once."""
    total = 0
    for i in range(n):
        total += await ctx.step(work, i)
    await ctx.step(flaky, ctx.run_id)
    return total


# --- helpers ------------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def broker(nats_server: EmbeddedServer) -> AsyncIterator[Broker]:
    b = await Broker.connect(nats_server.url)
    try:
        yield b
    finally:
        await b.close()


@contextlib.asynccontextmanager
async def serving(url: str, settings: Settings) -> AsyncIterator[Worker]:
    w = Worker([pj_steps], nats=url, settings=settings, concurrency=64)
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


async def kv_view(b: Broker, names: Names, run_id: str) -> RunView | None:
    m = await b.direct_get_last(names.runs_kv_stream, names.run_key(run_id))
    if m is None or m.header(KV_OPERATION) in ("DEL", "PURGE"):
        return None
    view: RunView = from_raw(m.data, RunView)
    return view


async def changes(b: Broker, names: Names) -> list[StoredMessage]:
    return await b.direct_get_range(names.changes_stream, names.changes_all)


def decision_changes(msgs: list[StoredMessage]) -> list[str]:
    """The message ids of the change messages made for decisions (``<run_id>:<seq>``, seq >
    0), in stream order: not the pending views' nor the liveness rewrites'."""
    out = []
    for m in msgs:
        parts = m.header(h.MSG_ID).split(":")
        if len(parts) == 2 and parts[1] != "0":
            out.append(m.header(h.MSG_ID))
    return out


async def expected_views(client: Client, run_ids: list[str]) -> dict[str, RunView]:
    out = {}
    for r in run_ids:
        history = await client.history(r)
        s = summarize_all((d.seq, d.size, d.events) for d in history)
        out[r] = view_of(s, None)
    return out


async def decision_ids(client: Client, run_ids: list[str]) -> list[str]:
    return [f"{r}:{d.seq}" for r in run_ids for d in await client.history(r)]


async def all_completed(b: Broker, names: Names, run_ids: list[str]) -> bool:
    for r in run_ids:
        v = await kv_view(b, names, r)
        if v is None or v.status != "completed":
            return False
    return True


async def crash(p: Projector) -> None:
    """What a SIGKILL does to an in-process projector: it stops, resigning nothing."""
    p._stopping = True
    if p._task is not None:
        p._task.cancel()
        with contextlib.suppress(BaseException):
            await p._task
    await p.broker.close()


_CLI = (PYTHON, "-m", "sojourn.actors.cli")


class ProjectorProc:
    """``sojourn projector`` in its own process (``--no-sqlite`` unless given a file)."""

    def __init__(self, url: str, prefix: str, sqlite: Path | None = None) -> None:
        model = ["--no-sqlite"] if sqlite is None else ["--sqlite", str(sqlite)]
        self.proc = subprocess.Popen(
            [*_CLI, "projector", "--nats", url, "--prefix", prefix, *model],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=subprocess_env(),
        )

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


# --- tests --------------------------------------------------------------------------------------


async def test_a_run_s_view_goes_to_completed_with_one_change_per_decision_in_order(
    nats_server: EmbeddedServer, settings: Settings, client: Client, broker: Broker
) -> None:
    names = Names(settings.prefix)
    async with Projector(nats=nats_server.url, settings=settings, interval=0.2) as p:
        await wait_for(lambda: _true(p.leading), DEADLINE, what="the projector to lead")
        async with serving(nats_server.url, settings):
            run_id = await client.start("pj_steps", 3, run_id="one")
            await wait_for(
                lambda: all_completed(broker, names, [run_id]), DEADLINE, what="completed"
            )
    view = await kv_view(broker, names, run_id)
    assert view is not None
    want = (await expected_views(client, [run_id]))[run_id]
    assert view == want
    assert (view.liveness, view.steps_done, view.attempts, view.retries) == ("ended", 4, 5, 1)
    assert view.error is None and view.ended_at is not None
    msgs = await changes(broker, names)
    assert all(m.subject == names.change("pj_steps", run_id) for m in msgs)
    assert decision_changes(msgs) == await decision_ids(client, [run_id])
    seqs: list[int] = [from_raw(m.data, RunView).last_seq for m in msgs]
    assert seqs == sorted(seqs)
    assert from_raw(msgs[-1].data, RunView) == view


async def _true(value: bool) -> bool:
    return value


async def test_a_sigkilled_projector_restarted_writes_each_change_once_and_every_view(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    broker: Broker,
    tmp_path: Path,
) -> None:
    names = Names(settings.prefix)
    run_ids = [f"k{i}" for i in range(40)]
    killed = tmp_path / "killed.sqlite3"
    proc = ProjectorProc(nats_server.url, settings.prefix, killed)
    try:
        async with serving(nats_server.url, settings):
            for r in run_ids:
                await client.start("pj_steps", 8, run_id=r, wait=False)

            async def some_written() -> bool:
                return len(await changes(broker, names)) >= 60

            await wait_for(some_written, DEADLINE, what="the projector to write some views")
            proc.kill()  # mid-stream: the runs go on
            proc = ProjectorProc(nats_server.url, settings.prefix, killed)
            await wait_for(
                lambda: all_completed(broker, names, run_ids), DEADLINE, what="every run done"
            )
        want_ids = await decision_ids(client, run_ids)

        async def all_changes() -> bool:
            return len(decision_changes(await changes(broker, names))) >= len(want_ids)

        await wait_for(all_changes, DEADLINE, what="every change message")
        # The change messages may come from any projector; the restarted process's own model
        # must have caught up too before it is stopped (WAL: reading it here never blocks it).
        last = await client_last_seq(nats_server, names)

        async def restarted_caught_up() -> bool:
            m = await SqliteModel.open(killed, events_stream=names.events_stream)
            try:
                return m.position >= last
            finally:
                await m.close()

        await wait_for(restarted_caught_up, DEADLINE, what="the restarted projector's model")
    finally:
        proc.stop()
    await assert_changes_and_views(broker, names, client, run_ids, want_ids)
    await assert_same_rows(nats_server, settings, killed, tmp_path / "once.sqlite3", run_ids)


async def assert_changes_and_views(
    broker: Broker, names: Names, client: Client, run_ids: list[str], want_ids: list[str]
) -> None:
    """Every decision's change message is stored once (none twice, none missing, in order per
    run), and every run's KV view is the one its history gives."""
    got = decision_changes(await changes(broker, names))
    assert sorted(got) == sorted(want_ids)  # none twice, none missing
    for r in run_ids:  # in order per run
        mine = [x for x in got if x.startswith(f"{r}:")]
        assert mine == [x for x in want_ids if x.startswith(f"{r}:")]
    want = await expected_views(client, run_ids)
    for r in run_ids:
        assert await kv_view(broker, names, r) == want[r]


async def assert_same_rows(
    nats_server: EmbeddedServer, settings: Settings, got: Path, fresh: Path, run_ids: list[str]
) -> None:
    """The SQLite model at ``got`` (written by a projector that was killed and restarted)
    holds the rows a model built in one pass holds: no row twice, none missing, none stale.
    Liveness is left out: it is the judgement at the time a row was written, not history."""
    names = Names(settings.prefix)
    once = await SqliteModel.open(fresh, events_stream=names.events_stream)
    model = await SqliteModel.open(got, events_stream=names.events_stream)
    try:
        last = await client_last_seq(nats_server, names)
        async with Projector(nats=nats_server.url, settings=settings, sink=once, interval=0.2):

            async def built() -> bool:
                return once.position >= last

            await wait_for(built, DEADLINE, what="a model built in one pass")
        assert model.position >= last
        for r in run_ids:
            a, b = await model.get(r), await once.get(r)
            assert a is not None and b is not None
            assert msgspec.structs.replace(a, liveness=None) == msgspec.structs.replace(
                b, liveness=None
            )
            assert await model.steps(r) == await once.steps(r)
        assert len((await model.dump())["steps"]) == len((await once.dump())["steps"])
    finally:
        await once.close()
        await model.close()


async def client_last_seq(nats_server: EmbeddedServer, names: Names) -> int:
    b = await Broker.connect(nats_server.url)
    try:
        info = await b.api(f"$JS.API.STREAM.INFO.{names.events_stream}")
        return int(info["state"]["last_seq"])
    finally:
        await b.close()


async def test_of_two_projectors_one_leads_and_the_other_takes_over_when_it_dies(
    nats_server: EmbeddedServer, settings: Settings, client: Client, broker: Broker
) -> None:
    names = Names(settings.prefix)
    kw = {"nats": nats_server.url, "settings": settings, "interval": 0.2, "leader_ttl": 1.5}
    a = await Projector(**kw).start()  # type: ignore[arg-type]
    b = await Projector(**kw).start()  # type: ignore[arg-type]
    try:
        await wait_for(lambda: _true(a.leading or b.leading), DEADLINE, what="a leader")
        assert not (a.leading and b.leading)
        leader, other = (a, b) if a.leading else (b, a)
        async with serving(nats_server.url, settings):
            await client.start("pj_steps", 2, run_id="first")
            await wait_for(lambda: all_completed(broker, names, ["first"]), DEADLINE)
            await crash(leader)
            await client.start("pj_steps", 2, run_id="second")
            await wait_for(lambda: _true(other.leading), DEADLINE, what="the take-over")
            await wait_for(lambda: all_completed(broker, names, ["second"]), DEADLINE)
        runs = ["first", "second"]
        want_ids = await decision_ids(client, runs)

        async def written() -> bool:
            return len(decision_changes(await changes(broker, names))) >= len(want_ids)

        await wait_for(written, DEADLINE)
        assert sorted(decision_changes(await changes(broker, names))) == sorted(want_ids)
        want = await expected_views(client, runs)
        for r in runs:
            assert await kv_view(broker, names, r) == want[r]
    finally:
        for p in (a, b):
            if not p._stopping:
                await p.stop()


class _AlwaysLeads(Projector):
    """A projector that believes it leads, whatever the leader record says (a paused leader
    that came back, a clock jump): both write."""

    async def _elect(self) -> None:
        if not self.leading:
            await self._take_over(0, 0)

    async def _extend_horizon(self, horizon: int) -> bool:
        self._lead.horizon = horizon
        return True


async def test_two_leaders_at_once_write_each_change_once_and_the_right_views(
    nats_server: EmbeddedServer, settings: Settings, client: Client, broker: Broker
) -> None:
    names = Names(settings.prefix)
    run_ids = [f"d{i}" for i in range(10)]
    a = await _AlwaysLeads(nats=nats_server.url, settings=settings, interval=0.2).start()
    b = await _AlwaysLeads(nats=nats_server.url, settings=settings, interval=0.2).start()
    try:
        async with serving(nats_server.url, settings):
            for r in run_ids:
                await client.start("pj_steps", 4, run_id=r, wait=False)
            await wait_for(lambda: all_completed(broker, names, run_ids), DEADLINE)
        want_ids = await decision_ids(client, run_ids)

        async def written() -> bool:
            return len(decision_changes(await changes(broker, names))) >= len(want_ids)

        await wait_for(written, DEADLINE)
        await a.wait_scanned()
        await b.wait_scanned()
    finally:
        await a.stop()
        await b.stop()
    assert a.leading is False and b.leading is False  # stopped
    assert sorted(decision_changes(await changes(broker, names))) == sorted(want_ids)
    want = await expected_views(client, run_ids)
    for r in run_ids:
        assert await kv_view(broker, names, r) == want[r]


async def test_a_stored_start_shows_pending_and_a_refused_one_is_removed(
    nats_server: EmbeddedServer, settings: Settings, client: Client, broker: Broker
) -> None:
    names = Names(settings.prefix)
    async with Projector(nats=nats_server.url, settings=settings, interval=0.2) as p:
        await wait_for(lambda: _true(p.leading), DEADLINE)
        # no worker up: both starts wait in the inbox
        await client.start("pj_steps", 1, run_id="later", wait=False)
        await client.start("pj_steps", 1, run_id="urgent", priority=1)
        body = encode(StartTrigger(input=encode(1), run_id="nobody"))  # type: ignore[arg-type]
        await broker.publish(names.start("no_such_agent", run_id="nobody"), body)

        async def pending(run_id: str) -> bool:
            v = await kv_view(broker, names, run_id)
            return v is not None and v.status == "pending"

        await wait_for(lambda: pending("later"), DEADLINE, what="a pending view")
        await wait_for(lambda: pending("nobody"), DEADLINE, what="a pending view")
        await wait_for(lambda: pending("urgent"), DEADLINE, what="a pending view")
        v = await kv_view(broker, names, "later")
        assert v is not None and (v.agent, v.liveness, v.last_seq) == ("pj_steps", "pending", 0)
        assert v.priority == 3
        # a pending run shows its start's lane, and keeps it once it ran
        urgent = await kv_view(broker, names, "urgent")
        assert urgent is not None and urgent.priority == 1
        async with serving(nats_server.url, settings):
            await wait_for(lambda: all_completed(broker, names, ["later", "urgent"]), DEADLINE)
            done = await kv_view(broker, names, "urgent")
            assert done is not None and (done.status, done.priority) == ("completed", 1)

            async def removed() -> bool:
                m = await broker.direct_get_last(names.runs_kv_stream, names.run_key("nobody"))
                return m is not None and m.header(KV_OPERATION) == "DEL"

            await wait_for(removed, DEADLINE, what="the refused start's view to be deleted")
    msgs = await changes(broker, names)
    first = next(m for m in msgs if m.subject == names.change("pj_steps", "later"))
    assert from_raw(first.data, RunView).status == "pending"


async def test_hostile_inbox_bytes_and_dead_letters_are_skipped_and_counted(
    nats_server: EmbeddedServer, settings: Settings, client: Client, broker: Broker
) -> None:
    names = Names(settings.prefix)
    p = settings.prefix
    await ensure_topology(broker, names, settings, consumers=False)
    # stored before the projector starts (no worker: nobody takes them): it reads them at once
    await broker.publish(f"{p}.start.pj_steps.bad$id", b"\xff\x00 not json")
    await broker.publish(f"{p}.start.{'x' * 200}.r1", b"{}")
    await broker.publish(names.dlq("start"), b"\xff{not a dead letter")
    await broker.publish(names.dlq("start"), encode({"code": "x", "subject": 7}))
    async with Projector(nats=nats_server.url, settings=settings, interval=0.2) as pj:
        await wait_for(lambda: _true(pj.leading), DEADLINE)
        await client.start("pj_steps", 1, run_id="after", wait=False)

        async def pending() -> bool:
            v = await kv_view(broker, names, "after")
            return v is not None and v.status == "pending"

        await wait_for(pending, DEADLINE, what="the projector to go on")
        assert pj.malformed["inbox"] == 2 and pj.malformed["dlq"] == 2
        async with serving(nats_server.url, settings):
            await wait_for(lambda: all_completed(broker, names, ["after"]), DEADLINE)


async def test_a_rebuild_rewrites_only_what_differs_and_equals_the_incremental_views(
    nats_server: EmbeddedServer, settings: Settings, client: Client, broker: Broker
) -> None:
    names = Names(settings.prefix)
    run_ids = [f"b{i}" for i in range(6)]
    async with Projector(nats=nats_server.url, settings=settings, interval=0.2) as p:
        async with serving(nats_server.url, settings):
            for r in run_ids:
                await client.start("pj_steps", 2, run_id=r, wait=False)
            await wait_for(lambda: all_completed(broker, names, run_ids), DEADLINE)
        await p.wait_scanned()
    incremental = {r: await kv_view(broker, names, r) for r in run_ids}
    before = len(await changes(broker, names))
    # a broken entry (an old projector's bug, a hand edit)
    m = await broker.direct_get_last(names.runs_kv_stream, names.run_key("b3"))
    assert m is not None
    bogus = RunView(run_id="b3", agent="pj_steps", status="running", last_seq=1)
    await broker.publish(
        names.run_key("b3"), encode(bogus), {h.EXPECTED_LAST_SUBJECT_SEQUENCE: str(m.seq)}
    )
    async with Projector(nats=nats_server.url, settings=settings, interval=0.2, rebuild=True) as rb:
        await wait_for(lambda: _true(rb.rebuild_seconds is not None), DEADLINE, what="a rebuild")
        assert rb.views_written == 1  # only the broken one
    assert {x: await kv_view(broker, names, x) for x in run_ids} == incremental
    assert len(await changes(broker, names)) == before  # a rebuild publishes no changes
    assert incremental == await expected_views(client, run_ids)


async def test_the_sqlite_model_is_fed_from_the_same_fold_leader_or_not(
    nats_server: EmbeddedServer, settings: Settings, client: Client, broker: Broker, tmp_path: Path
) -> None:
    names = Names(settings.prefix)
    run_ids = ["s1", "s2"]
    kw = {"nats": nats_server.url, "settings": settings, "interval": 0.2}
    sinks = [
        await SqliteModel.open(tmp_path / f"{i}.sqlite3", events_stream=names.events_stream)
        for i in range(2)
    ]
    a = await Projector(sink=sinks[0], **kw).start()  # type: ignore[arg-type]
    b = await Projector(sink=sinks[1], **kw).start()  # type: ignore[arg-type]
    try:
        async with serving(nats_server.url, settings):
            for r in run_ids:
                await client.start("pj_steps", 1, run_id=r, wait=False)
            await wait_for(lambda: all_completed(broker, names, run_ids), DEADLINE)
        await a.wait_scanned()
        await b.wait_scanned()
        assert a.leading != b.leading
        for sink in sinks:
            for r in run_ids:
                assert await sink.get(r) == await kv_view(broker, names, r)
        assert a.rows_written > 0 and b.rows_written > 0
        families = {f.name: f for f in _projector_families([a, b])}
        assert families["sojourn_projector_leader"].samples[0].value == 1.0
        assert families["sojourn_projector_views_written"].samples[0].value > 0
    finally:
        for p in (a, b):
            await p.stop()
        for sink in sinks:
            await sink.close()
