"""Retention against a real nats-server: ended runs past their age leave the hot streams and
stay readable from the archive; live runs (however old) and children of live parents stay; a
crash between archiving and removing loses nothing; only the watchdog role may purge history.

Histories are appended directly with ``EventStore`` (a few events each) and their views written
as the projector writes them (``view_of``), so 10,000 runs take seconds, not a worker's hours.
Ages use a simulated clock: ``now`` is a month ahead, so runs stored a moment ago are "31 days"
old by both the writers' and the server's clocks.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import pytest_asyncio

from sojourn.actors import Client, TriggerRejected, Watchdog, Worker
from sojourn.actors.ops.archive import Archiver, RetentionUnavailable
from sojourn.actors.ops.keyed import KeyedRecords
from sojourn.broker import Broker, EmbeddedServer, Names
from sojourn.broker.archive import ArchiveStore
from sojourn.broker.auth import AuthUser
from sojourn.broker.eventstore import Decision, EventStore
from sojourn.broker.flow import FlowStore
from sojourn.broker.topology import ensure_topology
from sojourn.projections.summary import summarize_all
from sojourn.projections.views import view_of
from sojourn.schemas.auth import ROLES
from sojourn.schemas.codec import decode_run_view, encode, to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import PermissionDenied, RunNotFound
from sojourn.schemas.events import (
    RunCompleted,
    RunEvent,
    RunStarted,
    StepCompleted,
    StepStarted,
    WaitStarted,
)
from sojourn.schemas.flow import SingletonRecord, debounced_run_id, key_token
from tests.actors.cli.test_cli import sojourn
from tests.apps.keyed import latest
from tests.conftest import wait_for

DAY = 86_400.0
MONTH = 30 * DAY


def later() -> float:
    """The simulated clock: 31 days from now."""
    return time.time() + 31 * DAY


async def append_run(
    store: EventStore,
    run_id: str,
    *,
    end: str = "completed",
    at: float | None = None,
    parent: str | None = None,
) -> list[Decision]:
    """A run of a few events: started, one step, and ``completed`` or ``waiting``."""
    t = time.time() if at is None else at
    decisions: list[list[RunEvent]] = [
        [
            RunStarted(
                run_id=run_id, agent="kept", input=to_raw({"n": 1}), at=t, parent_run_id=parent
            )
        ],
        [StepStarted(position=0, name="work", at=t)],
        [StepCompleted(position=0, name="work", result=to_raw("done"), at=t)],
    ]
    if end == "completed":
        decisions[-1].append(RunCompleted(output=to_raw({"ok": run_id}), at=t))
    else:
        decisions.append([WaitStarted(position=1, key="signal:go", signals=("go",), at=t)])
    seq = 0
    for i, events in enumerate(decisions):
        seq = await store.append(run_id, events, expected_seq=seq, writer=f"w{i}")
    return await store.load(run_id)


async def put_view(broker: Broker, names: Names, history: list[Decision]) -> None:
    """The run's view, as the projector writes it."""
    s = summarize_all((d.seq, d.size, d.events) for d in history)
    await broker.publish(names.run_key(s.run_id), encode(view_of(s, None)))


async def view_archived(broker: Broker, names: Names, run_id: str) -> bool:
    m = await broker.direct_get_last(names.runs_kv_stream, names.run_key(run_id))
    assert m is not None
    return decode_run_view(m.data).archived


async def stream_bytes(broker: Broker, stream: str) -> int:
    info = await broker.api(f"$JS.API.STREAM.INFO.{stream}")
    return int(info["state"]["bytes"])


@pytest_asyncio.fixture
async def broker(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Broker]:
    b = await Broker.connect(nats_server.url)
    await ensure_topology(b, Names(settings.prefix), settings)
    try:
        yield b
    finally:
        await b.close()


@pytest.mark.slow(70)
async def test_10000_ended_runs_leave_and_stay_readable(
    broker: Broker, client: Client, settings: Settings
) -> None:
    names = Names(settings.prefix)
    store = EventStore(broker, names, settings)
    gate = asyncio.Semaphore(64)
    histories: dict[str, list[Decision]] = {}

    async def make(run_id: str, **kw: object) -> None:
        async with gate:
            h = await append_run(store, run_id, **kw)  # type: ignore[arg-type]
            await put_view(broker, names, h)
            histories[run_id] = h

    ended = [f"old-{i}" for i in range(10_000)]
    await asyncio.gather(*(make(r) for r in ended))
    # a live run, waiting for a month (by the simulated clock): never touched
    await make("live-waiting", end="waiting")
    # a live run whose view (stale, or lying) says it completed long ago: the history decides
    await make("live-lying-view", end="waiting")
    lie = view_of(
        summarize_all((d.seq, d.size, d.events) for d in histories["live-lying-view"]), None
    )
    lie = msgspec.structs.replace(lie, status="completed", ended_at=lie.updated_at)
    await broker.publish(names.run_key("live-lying-view"), encode(lie))
    # an ended run whose end is only 29 days old at the simulated time
    await make("young", at=time.time() + 2 * DAY)
    before = await stream_bytes(broker, names.events_stream)

    archiver = Archiver(broker, settings, retain_ended=MONTH, concurrency=64)
    report = await archiver.run_pass(now=later())

    assert report.errors == {}
    assert report.candidates == 10_001  # the waiting run's view is not a candidate
    assert report.skipped == {"live": 1}
    assert set(report.moved) == set(ended)
    assert set(report.moved.values()) == {"archived"}
    after = await stream_bytes(broker, names.events_stream)
    assert report.bytes_before == before and report.bytes_after == after
    # what is left is the three runs that stay: a few hundred bytes each
    assert after < before / 1000, (before, after)
    state = (await broker.api(f"$JS.API.STREAM.INFO.{names.events_stream}"))["state"]
    assert state["num_subjects"] == 3

    # live and young: untouched, histories whole
    for run_id in ("live-waiting", "live-lying-view", "young"):
        assert await store.load(run_id) == histories[run_id]
        assert not await view_archived(broker, names, run_id)
    assert await client.status("live-waiting") == "waiting"

    # archived: the same decisions as before, through the client (and its status/result)
    for run_id in ended[::500]:
        assert await store.load(run_id) == []
        assert await client.history(run_id) == histories[run_id]
        assert await client.status(run_id) == "completed"
        assert await client.result(run_id, timeout=10) == {"ok": run_id}
        assert await view_archived(broker, names, run_id)

    # a second pass moves nothing more (the lying view is judged again, and kept again)
    again = await archiver.run_pass(now=later())
    assert again.moved == {} and again.skipped == {"live": 1}


async def test_result_of_an_archived_run_even_with_no_time_to_wait(
    broker: Broker, client: Client, settings: Settings
) -> None:
    """The archive is read at the second look, or at the first when the time is already up."""
    store = EventStore(broker, Names(settings.prefix), settings)
    await put_view(broker, Names(settings.prefix), await append_run(store, "gone"))
    report = await Archiver(broker, settings, retain_ended=MONTH).run_pass(now=later())
    assert report.moved == {"gone": "archived"}
    assert await client.result("gone", timeout=0) == {"ok": "gone"}
    assert await client.result("gone", timeout=10) == {"ok": "gone"}
    assert await client.result("gone") == {"ok": "gone"}


async def test_a_run_stored_after_the_first_look_costs_no_archive_read(
    broker: Broker, client: Client, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``result`` right after a start: the first look finds nothing (the run is not stored
    yet); the run is stored before the second, so the archive is never read."""
    store = EventStore(broker, Names(settings.prefix), settings)
    archive_reads: list[str] = []
    real_archived_end = client._archived_end
    real_last = client.broker.direct_get_last
    looks: list[bool] = []  # the run's looks: whether each found a message
    events = Names(settings.prefix).events("fresh")

    async def counted(run_id: str) -> object:
        archive_reads.append(run_id)
        return await real_archived_end(run_id)

    async def last_then_store(stream: str, subject: str) -> object:
        answer = await real_last(stream, subject)
        if subject != events:  # not a look at the run (the archive reads through here too)
            return answer
        looks.append(answer is not None)
        if len(looks) == 1:  # the run is stored right after the first look
            await append_run(store, "fresh")
        return answer

    monkeypatch.setattr(client, "_archived_end", counted)
    monkeypatch.setattr(client.broker, "direct_get_last", last_then_store)
    assert await client.result("fresh", timeout=10) == {"ok": "fresh"}
    assert archive_reads == []
    assert looks[0] is False and looks[1] is True


async def test_a_cancel_for_an_archived_debounced_run_is_refused_not_kept_waiting(
    nats_server: EmbeddedServer, broker: Broker, client: Client, settings: Settings
) -> None:
    """A cancel for a debounced burst's run id that has no run waits for the burst to fire;
    one whose run ended long ago and was archived is not coming: refused ``unknown_run``, as
    for any other id."""
    names = Names(settings.prefix)
    run_id = debounced_run_id("latest", "doc-1", 17)
    history = await append_run(EventStore(broker, names, settings), run_id)
    await put_view(broker, names, history)
    report = await Archiver(broker, settings, retain_ended=MONTH).run_pass(now=later())
    assert report.moved == {run_id: "archived"}
    async with Worker([latest], nats=nats_server.url, settings=settings):
        with pytest.raises(TriggerRejected) as refused:
            await client.cancel(run_id, "late", wait=True, timeout=30)
    assert refused.value.code == "unknown_run"


async def test_sojourn_history_and_status_read_an_archived_run(
    nats_server: EmbeddedServer, broker: Broker, settings: Settings
) -> None:
    names = Names(settings.prefix)
    store = EventStore(broker, names, settings)
    history = await append_run(store, "cli-old")
    await put_view(broker, names, history)
    before = await sojourn(
        "history", "cli-old", "--json", "--nats", nats_server.url, "--prefix", settings.prefix
    )
    assert before.rc == 0, before.err
    report = await Archiver(broker, settings, retain_ended=MONTH).run_pass(now=later())
    assert report.moved == {"cli-old": "archived"}
    assert await store.load("cli-old") == []

    common = ("--nats", nats_server.url, "--prefix", settings.prefix)
    after = await sojourn("history", "cli-old", "--json", *common)
    assert after.rc == 0, after.err
    assert json.loads(after.out) == json.loads(before.out)
    text = await sojourn("history", "cli-old", *common)
    assert text.rc == 0 and "RunCompleted" in text.out
    status = await sojourn("status", "cli-old", "--json", *common)
    assert status.rc == 0, status.err
    assert json.loads(status.out)["status"] == "completed"


async def test_sojourn_archive_dry_run_then_a_pass(
    nats_server: EmbeddedServer, broker: Broker, settings: Settings
) -> None:
    names = Names(settings.prefix)
    store = EventStore(broker, names, settings)
    for run_id in ("a1", "a2"):
        await put_view(broker, names, await append_run(store, run_id))
    await put_view(broker, names, await append_run(store, "w1", end="waiting"))
    common = ("--nats", nats_server.url, "--prefix", settings.prefix, "--older-than", "1s")

    async def dry_run_lists_both() -> bool:
        r = await sojourn("archive", "--dry-run", "--json", *common)
        assert r.rc == 0, r.err
        return sorted(json.loads(r.out)["runs"]) == ["a1", "a2"]

    await wait_for(dry_run_lists_both, 60, interval=0.5, what="both runs a second old")
    assert len(await store.load("a1")) == 3  # the dry run changed nothing
    r = await sojourn("archive", *common)
    assert r.rc == 0, r.err
    assert "moved 2 run(s)" in r.out and "events stream:" in r.out
    assert await store.load("a1") == [] and len(await store.load("w1")) == 4


async def test_a_crash_between_archive_and_purge_loses_nothing(
    broker: Broker, client: Client, settings: Settings
) -> None:
    names = Names(settings.prefix)
    store = EventStore(broker, names, settings)
    history = await append_run(store, "crashy")
    await put_view(broker, names, history)
    archiver = Archiver(broker, settings, retain_ended=MONTH)
    await archiver.prepare()

    # step 1 only: archived and verified, then the "crash" before anything is removed
    messages, decisions = await archiver._read("crashy")
    await archiver.copy("crashy", messages, decisions)
    assert await ArchiveStore(broker, names).exists("crashy")
    assert await store.load("crashy") == history  # still fully hot
    assert await client.history("crashy") == history

    # the next pass finds the copy equal, removes, marks
    report = await archiver.run_pass(now=later())
    assert report.moved == {"crashy": "archived"}
    assert await store.load("crashy") == []
    assert await client.history("crashy") == history

    # a crash after the events were purged but before the rest: the next pass finishes
    h2 = await append_run(store, "halfway")
    await put_view(broker, names, h2)
    messages, decisions = await archiver._read("halfway")
    await archiver.copy("halfway", messages, decisions)
    await broker.publish(names.lease("halfway"), b"{}")
    await archiver._purge(names.events_stream, names.events("halfway"))
    report = await archiver.run_pass(now=later())
    assert report.moved == {"halfway": "finished"}
    assert await broker.direct_get_last(names.leases_stream, names.lease("halfway")) is None
    assert await view_archived(broker, names, "halfway")
    assert await client.history("halfway") == h2


async def test_a_child_leaves_only_after_its_parent_ended(
    broker: Broker, client: Client, settings: Settings
) -> None:
    names = Names(settings.prefix)
    store = EventStore(broker, names, settings)
    parent = await append_run(store, "mum", end="waiting")
    child = await append_run(store, "mum-c1", parent="mum")
    for h in (parent, child):
        await put_view(broker, names, h)
    archiver = Archiver(broker, settings, retain_ended=MONTH)
    report = await archiver.run_pass(now=later())
    assert report.moved == {} and report.skipped == {"parent_live": 1}
    assert await store.load("mum-c1") == child

    # the parent ends (now, by the simulated clock long ago): the child may go, the parent too
    done = RunCompleted(output=to_raw(1), at=time.time())
    await store.append("mum", [done], expected_seq=parent[-1].seq, writer="w")
    await put_view(broker, names, await store.load("mum"))
    report = await archiver.run_pass(now=later())
    assert set(report.moved) == {"mum", "mum-c1"}
    assert await client.history("mum-c1") == child


async def test_discard_keeps_no_copy(broker: Broker, client: Client, settings: Settings) -> None:
    names = Names(settings.prefix)
    store = EventStore(broker, names, settings)
    await put_view(broker, names, await append_run(store, "gone"))
    report = await Archiver(broker, settings, retain_ended=MONTH, policy="discard").run_pass(
        now=later()
    )
    assert report.moved == {"gone": "discarded"}
    assert not await ArchiveStore(broker, names).exists("gone")
    assert await client.history("gone") == []
    with pytest.raises(RunNotFound):
        await client.status("gone")
    assert await view_archived(broker, names, "gone")


async def test_the_watchdog_archives_periodically_and_one_leads(
    nats_server: EmbeddedServer, broker: Broker, settings: Settings
) -> None:
    names = Names(settings.prefix)
    store = EventStore(broker, names, settings)
    await put_view(broker, names, await append_run(store, "wd-old"))
    await put_view(broker, names, await append_run(store, "wd-live", end="waiting"))
    dead = SingletonRecord(agent="a", key="k", run_id="gone", inbox_seq=10**12, at=time.time())
    await FlowStore(broker, names).put_singleton(key_token("k"), dead, 0)
    record = FlowStore.subject(names, "single", "a", key_token("k"))
    retained = Settings(prefix=settings.prefix, lease_ttl=settings.lease_ttl, retain_ended=MONTH)
    one = Watchdog(broker=broker, settings=retained, archive_every=0.2, clock=later)
    two = Watchdog(broker=broker, settings=retained, archive_every=0.2, clock=later)
    async with one, two:

        async def gone() -> bool:
            return await store.load("wd-old") == []

        await wait_for(gone, 60, what="the watchdog's retention pass")
        await wait_for(
            lambda: asyncio.sleep(0, result=one.archive_passes + two.archive_passes >= 3),
            60,
            what="a few more passes",
        )
        assert (one.archive_passes == 0) != (two.archive_passes == 0)  # one leader
        # The keyed starts' records: swept by the first pass, then once an hour, not with
        # every pass of the runs.
        assert await broker.direct_get_last(names.schedules_stream, record) is None
        assert one.keyed_sweeps + two.keyed_sweeps == 1
    assert len(await store.load("wd-live")) == 4


async def test_the_events_stream_refusing_purge_is_reported(
    broker: Broker, settings: Settings
) -> None:
    """A deployment whose events stream was created before retention (deny_purge)."""
    names = Names(settings.prefix)
    cfg = await broker.stream_config(names.events_stream)
    assert cfg is not None and cfg["deny_purge"] is False  # new deployments are purgeable
    await broker.api(f"$JS.API.STREAM.DELETE.{names.events_stream}")
    await broker.api(
        f"$JS.API.STREAM.CREATE.{names.events_stream}",
        {**cfg, "deny_purge": True},
    )
    with pytest.raises(RetentionUnavailable, match="denies purge"):
        await Archiver(broker, settings, retain_ended=MONTH).run_pass(now=later())


PREFIX = "retauth"
PASSWORDS = {role: "p" + secrets.token_urlsafe(12) for role in ROLES}


@pytest_asyncio.fixture(scope="module")
async def auth_server(
    processes: None, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[EmbeddedServer]:
    users = [AuthUser(role, PASSWORDS[role], role) for role in ROLES]
    store_dir: Path = tmp_path_factory.mktemp("nats-retention-auth")
    srv = EmbeddedServer(store_dir=store_dir, port=0, auth=users, auth_prefix=PREFIX)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


@pytest_asyncio.fixture
async def brokers(auth_server: EmbeddedServer) -> AsyncIterator[dict[str, Broker]]:
    """A connection per role (worker, client, watchdog) to the deployment, its topology made."""
    connected: dict[str, Broker] = {}
    try:
        for role in ("worker", "client", "watchdog"):
            connected[role] = await Broker.connect(auth_server.url_for(role))
        await ensure_topology(connected["worker"], Names(PREFIX), Settings(prefix=PREFIX))
        yield connected
    finally:
        for b in connected.values():
            await b.close()


async def test_only_the_watchdog_role_may_purge_history(brokers: dict[str, Broker]) -> None:
    settings = Settings(prefix=PREFIX, lease_ttl=2.0)
    names = Names(PREFIX)
    store = EventStore(brokers["worker"], names, settings)
    history = await append_run(store, "secured")
    await put_view(brokers["worker"], names, history)  # the projector runs as a worker
    purge = f"$JS.API.STREAM.PURGE.{names.events_stream}"
    for role in ("worker", "client"):
        with pytest.raises(PermissionDenied):
            await brokers[role].api(purge, {"filter": names.events("secured")})
    assert await store.load("secured") == history

    report = await Archiver(brokers["watchdog"], settings, retain_ended=MONTH).run_pass(now=later())
    assert report.errors == {} and report.moved == {"secured": "archived"}
    assert await store.load("secured") == []
    async with Client(brokers["client"], settings) as c:  # a client reads the archive
        assert await c.history("secured") == history


async def test_the_watchdog_removes_a_dead_keyed_record_under_least_privilege(
    brokers: dict[str, Broker],
) -> None:
    """Retention's sweep of keyed starts' records (decision 0053) runs as the watchdog: it may
    purge the schedules stream, which a client may not."""
    settings = Settings(prefix=PREFIX, lease_ttl=2.0)
    names = Names(PREFIX)
    dead = SingletonRecord(agent="a", key="k", run_id="gone", inbox_seq=10**12, at=time.time())
    await FlowStore(brokers["worker"], names).put_singleton(key_token("k"), dead, 0)
    subject = FlowStore.subject(names, "single", "a", key_token("k"))
    # Credentials that may not purge the stream (a client's; a watchdog's rendered before
    # this sweep existed): one error that says what to do, not one per record.
    archive = ArchiveStore(brokers["client"], names)
    sweep = KeyedRecords(brokers["client"], names, archive)
    removed, errors = await sweep.sweep(later())
    assert sum(removed.values()) == 0
    assert list(errors) == [names.schedules_stream] and "render them again" in str(errors)
    assert await brokers["worker"].direct_get_last(names.schedules_stream, subject) is not None
    report = await Archiver(brokers["watchdog"], settings, retain_ended=MONTH).run_pass(now=later())
    assert report.keyed_errors == {} and report.keyed["singleton"] == 1
    assert await brokers["worker"].direct_get_last(names.schedules_stream, subject) is None
