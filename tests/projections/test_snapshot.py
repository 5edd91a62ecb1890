"""The run model's snapshot: restoring one and folding the rest equals folding everything
(hypothesis, no broker), and on a real nats-server: the projector leader stores one, a
watchdog started afterwards reads only what came after it and judges as one that read
everything, a damaged or foreign snapshot is logged and ignored, and a projector killed and
restarted from a snapshot loses and repeats nothing."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import msgspec
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from sojourn.actors import Client
from sojourn.actors.ops.watchdog import Watchdog
from sojourn.broker import EmbeddedServer, Names
from sojourn.broker import headers as h
from sojourn.broker.auth import AuthUser
from sojourn.broker.connection import Broker
from sojourn.broker.delivery import StoredMessage
from sojourn.broker.topology import ensure_topology
from sojourn.projections.model import (
    SNAPSHOT_OBJECT,
    RunModel,
    read_snapshot,
    snapshot_store,
    write_snapshot,
)
from sojourn.projections.projector import Projector
from sojourn.projections.sqlite import SqliteModel
from sojourn.projections.summary import RunSummary
from sojourn.schemas.auth import ROLES
from sojourn.schemas.codec import encode_events, to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import PermissionDenied
from sojourn.schemas.events import (
    RunCompleted,
    RunEvent,
    RunStarted,
    StepCompleted,
    StepStarted,
    WaitStarted,
)
from sojourn.schemas.snapshot import (
    SNAPSHOT_FORMAT,
    ModelSnapshot,
    SnapshotUnreadable,
    decode_snapshot,
    encode_snapshot,
)
from tests.conftest import wait_for
from tests.projections.test_projector import (
    all_completed,
    assert_changes_and_views,
    assert_same_rows,
    changes,
    crash,
    decision_changes,
    decision_ids,
    serving,
)
from tests.strategies import mutated_histories, valid_histories

DEADLINE = 90.0
NAMES = Names("t")


# --- the pure property -------------------------------------------------------------------------


def _message(seq: int, run_id: str, data: bytes) -> StoredMessage:
    subject = NAMES.events(run_id)
    return StoredMessage(
        subject=subject,
        seq=seq,
        data=data,
        headers={h.SUBJECT: subject, h.SEQUENCE: str(seq)},
        time=1000.0 + seq,
    )


def _model() -> RunModel:
    return RunModel(None, NAMES, Settings(prefix="t"))  # type: ignore[arg-type]


@st.composite
def deployments(draw: st.DrawFn) -> list[StoredMessage]:
    """Several runs' histories (valid ones, and mutated ones with anomalies, late events and
    ends before their time), each cut into decisions, the decisions of different runs
    interleaved at random, now and then an undecodable message."""
    histories = draw(
        st.lists(
            st.one_of(valid_histories().map(lambda he: he[0]), mutated_histories()),
            min_size=1,
            max_size=6,
        )
    )
    queues: list[list[bytes]] = []
    for k, events in enumerate(histories):
        at = 60.0 * k  # runs spread over minutes: several tool-call buckets
        shifted = [msgspec.structs.replace(e, at=e.at + at) for e in events]
        chunks: list[bytes] = []
        i = 0
        while i < len(shifted):
            n = draw(st.integers(1, 3))
            chunks.append(encode_events(shifted[i : i + n]))
            i += n
        if draw(st.booleans()) and len(chunks) > 1:
            chunks.insert(draw(st.integers(1, len(chunks))), b"\xffnot json")
        queues.append(chunks)
    order: list[tuple[int, bytes]] = []
    live = [k for k, q in enumerate(queues) if q]
    while live:
        k = draw(st.sampled_from(live))
        order.append((k, queues[k].pop(0)))
        live = [k for k, q in enumerate(queues) if q]
    return [_message(seq, f"run{k}", data) for seq, (k, data) in enumerate(order, start=1)]


def _state(m: RunModel) -> tuple[object, ...]:
    return (
        m.runs,
        m.ended,
        m.tool_calls,
        m.history,
        m.agents,
        m.position,
        m.applied_time,
        # a wedge the model made for an undecodable message is stamped with the clock
        {r: msgspec.structs.replace(w, at=0.0) for r, w in m.wedges.items() if r in m.runs},
    )


@hsettings(max_examples=300, deadline=None)
@given(deployments(), st.data())
def test_restoring_a_snapshot_and_folding_the_rest_equals_folding_everything(
    msgs: list[StoredMessage], data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(msgs)), label="cut")
    whole = _model()
    for m in msgs:
        whole._on_decision(m)
    first = _model()
    for m in msgs[:cut]:
        first._on_decision(m)
        first._events.last_seq = m.seq  # what the follower records as it reads
    snap = decode_snapshot(encode_snapshot(first.snapshot(taken_at=5.0)), RunSummary)
    assert snap.position == cut
    rest = _model()
    rest.restore(snap)
    assert rest._events.last_seq == cut and rest.restored_from == cut
    for m in msgs[cut:]:
        rest._on_decision(m)
        rest._events.last_seq = m.seq
    whole._events.last_seq = len(msgs)
    assert _state(rest) == _state(whole)


def test_restore_refuses_a_model_that_has_read_events() -> None:
    m = _model()
    start = RunStarted(run_id="r", agent="a", input=to_raw(None), at=1.0)
    m._on_decision(_message(1, "r", encode_events([start])))
    m._events.last_seq = 1
    with pytest.raises(ValueError, match="read no events"):
        m.restore(m.snapshot())


def test_a_newer_format_or_garbage_is_refused_before_decoding_the_rest() -> None:
    newer = encode_snapshot(ModelSnapshot(format=SNAPSHOT_FORMAT + 1, position=3))
    with pytest.raises(SnapshotUnreadable, match="format"):
        decode_snapshot(newer, RunSummary)
    for junk in (b"", b"\x00", b"garbage", msgspec.msgpack.encode({"format": 1, "runs": 7})):
        with pytest.raises(SnapshotUnreadable):
            decode_snapshot(junk, RunSummary)


# --- on a real nats-server ---------------------------------------------------------------------


@pytest_asyncio.fixture
async def broker(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Broker]:
    b = await Broker.connect(nats_server.url)
    try:
        await ensure_topology(b, Names(settings.prefix), settings, consumers=False)
        yield b
    finally:
        await b.close()


async def append(b: Broker, names: Names, run_id: str, events: Sequence[RunEvent]) -> int:
    ack = await b.publish(names.events(run_id), encode_events(list(events)))
    return ack.seq


async def write_runs(b: Broker, names: Names, tag: str, n: int) -> int:
    """``n`` runs of two agents: every third completes (after a few steps), the others stay
    live, waiting or in a step. Returns the last sequence written."""
    now = time.time()
    seq = 0
    for i in range(n):
        run_id = f"{tag}{i}"
        agent = ("alpha", "beta")[i % 2]
        await append(
            b, names, run_id, [RunStarted(run_id=run_id, agent=agent, input=to_raw(i), at=now)]
        )
        for pos in range(i % 4):
            await append(b, names, run_id, [StepStarted(position=pos, name="s", attempt=1, at=now)])
            done = StepCompleted(position=pos, name="s", attempt=1, result=to_raw(pos), at=now)
            seq = await append(b, names, run_id, [done])
        pos = i % 4
        if i % 3 == 0:
            seq = await append(b, names, run_id, [RunCompleted(output=to_raw(i), at=now)])
        elif i % 3 == 1:
            wait = WaitStarted(position=pos, key="sleep", deadline=now + 3600, at=now)
            seq = await append(b, names, run_id, [wait])
        else:
            seq = await append(
                b, names, run_id, [StepStarted(position=pos, name="s", attempt=1, at=now)]
            )
    return seq


async def surveyed(url: str, settings: Settings, *, from_snapshot: bool) -> Watchdog:
    wd = Watchdog(nats=url, settings=settings, from_snapshot=from_snapshot)
    await wd.survey()
    return wd


def _judged(wd: Watchdog, now: float) -> dict[str, tuple[object, ...]]:
    return {
        r: (liv.state, liv.agent, liv.status, liv.reason, liv.on, liv.deadline)
        for r, liv in wd.model.assess(now).items()
    }


async def test_a_watchdog_reads_only_what_follows_the_leader_s_snapshot_and_judges_the_same(
    nats_server: EmbeddedServer, settings: Settings, broker: Broker
) -> None:
    names = Names(settings.prefix)
    first = await write_runs(broker, names, "a", 30)
    async with Projector(
        nats=nats_server.url, settings=settings, interval=0.2, snapshot_every=3600
    ) as p:

        async def written() -> bool:
            return p.leading and p.written >= first

        await wait_for(written, DEADLINE, what="the projector to write every view")
    # its graceful stop stored a snapshot at the last decision it wrote
    snap = await read_snapshot(broker, names)
    assert snap is not None and snap.position == first
    assert len(snap.runs) == 20 and snap.ended == 10 and set(snap.agents) == {"alpha", "beta"}

    last = await write_runs(broker, names, "b", 12)  # after the snapshot
    # and some of the runs before it end after it
    ended = [RunCompleted(output=to_raw(0), at=time.time())]
    for r in ("a1", "a2", "a4"):
        last = await append(broker, names, r, ended)

    quick = await surveyed(nats_server.url, settings, from_snapshot=True)
    full = await surveyed(nats_server.url, settings, from_snapshot=False)
    assert quick.model.restored_from == first and full.model.restored_from == 0
    assert quick.model.decisions_read == last - first
    assert full.model.decisions_read == last
    now = time.time()
    assert _judged(quick, now) == _judged(full, now)
    assert len(_judged(full, now)) == 20 - 3 + 8
    q, f = quick.model, full.model
    assert (q.runs, q.ended, q.tool_calls, q.history, q.agents) == (
        f.runs,
        f.ended,
        f.tool_calls,
        f.history,
        f.agents,
    )


async def _garbage(b: Broker, names: Names, last: int) -> None:
    await write_snapshot(b, names, ModelSnapshot(format=1, position=1))  # the bucket exists
    await snapshot_store(b, names).put(SNAPSHOT_OBJECT, b"\x93garbage bytes, not a snapshot")


async def _newer(b: Broker, names: Names, last: int) -> None:
    body: ModelSnapshot[RunSummary] = ModelSnapshot(format=SNAPSHOT_FORMAT + 1, position=1)
    await snapshot_store(b, names).ensure()
    await snapshot_store(b, names).put(SNAPSHOT_OBJECT, encode_snapshot(body))


async def _beyond(b: Broker, names: Names, last: int) -> None:
    await write_snapshot(b, names, ModelSnapshot(format=1, position=last + 1))


async def _digest(b: Broker, names: Names, last: int) -> None:
    """A valid snapshot whose description's digest was changed afterwards."""
    await write_snapshot(b, names, ModelSnapshot(format=1, position=1))
    store = snapshot_store(b, names)
    subject = store._meta_subject(SNAPSHOT_OBJECT)
    m = await b.direct_get_last(store.stream, subject)
    assert m is not None
    meta = json.loads(m.data)
    meta["digest"] = "SHA-256=" + "A" * 43 + "="
    await b.publish(subject, json.dumps(meta).encode(), {"Nats-Rollup": "sub"})


async def _foreign(b: Broker, names: Names, last: int) -> None:
    """A snapshot of another incarnation of the events stream (deleted and made again)."""
    body: ModelSnapshot[RunSummary] = ModelSnapshot(
        format=1, position=1, stream_created="2001-01-01T00:00:00Z"
    )
    await write_snapshot(b, names, body)


@pytest.mark.parametrize(
    ("damage", "logged"),
    [
        (_garbage, "not a model snapshot"),
        (_newer, "snapshot format"),
        (_beyond, "beyond the events stream"),
        (_digest, "digest mismatch"),
        (_foreign, "earlier events stream"),
    ],
)
async def test_a_damaged_or_foreign_snapshot_is_logged_and_the_model_folds_from_1(
    nats_server: EmbeddedServer,
    settings: Settings,
    broker: Broker,
    caplog: pytest.LogCaptureFixture,
    damage: object,
    logged: str,
) -> None:
    names = Names(settings.prefix)
    last = await write_runs(broker, names, "c", 9)
    await damage(broker, names, last)  # type: ignore[operator]
    with caplog.at_level(logging.WARNING, logger="sojourn.projections"):
        wd = await surveyed(nats_server.url, settings, from_snapshot=True)
    assert wd.model.restored_from == 0 and wd.model.decisions_read == last
    assert len(wd.model.runs) == 6 and wd.model.ended == 3
    assert any(
        logged in r.getMessage() and "folding from sequence 1" in r.getMessage()
        for r in caplog.records
    )


async def test_no_snapshot_folds_from_1_without_a_warning(
    nats_server: EmbeddedServer,
    settings: Settings,
    broker: Broker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    names = Names(settings.prefix)
    last = await write_runs(broker, names, "d", 3)
    with caplog.at_level(logging.WARNING, logger="sojourn.projections"):
        wd = await surveyed(nats_server.url, settings, from_snapshot=True)
    assert wd.model.restored_from == 0 and wd.model.decisions_read == last
    assert not [r for r in caplog.records if r.name == "sojourn.projections"]


async def test_a_killed_projector_restarted_from_a_snapshot_loses_and_repeats_nothing(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    broker: Broker,
    tmp_path: Path,
) -> None:
    names = Names(settings.prefix)
    run_ids = [f"k{i}" for i in range(30)]
    killed = tmp_path / "killed.sqlite3"
    sink = await SqliteModel.open(killed, events_stream=names.events_stream)
    p = await Projector(
        nats=nats_server.url, settings=settings, sink=sink, interval=0.2, snapshot_decisions=40
    ).start()
    try:
        async with serving(nats_server.url, settings):
            for r in run_ids:
                await client.start("pj_steps", 8, run_id=r, wait=False)

            async def snapshotted() -> bool:
                return p.snapshots_written >= 2 and len(await changes(broker, names)) >= 120

            await wait_for(snapshotted, DEADLINE, what="a snapshot mid-stream")
            await crash(p)  # no final snapshot, no resignation: the runs go on
            await sink.close()
            stored = await read_snapshot(broker, names)
            assert stored is not None and stored.position > 0
            sink = await SqliteModel.open(killed, events_stream=names.events_stream)
            assert sink.position >= stored.position
            p = await Projector(
                nats=nats_server.url, settings=settings, sink=sink, interval=0.2
            ).start()
            assert p.model.restored_from == stored.position
            await wait_for(
                lambda: all_completed(broker, names, run_ids), DEADLINE, what="every run done"
            )
        want_ids = await decision_ids(client, run_ids)

        async def all_changes() -> bool:
            return len(decision_changes(await changes(broker, names))) >= len(want_ids)

        await wait_for(all_changes, DEADLINE, what="every change message")
        assert p.model.restored_from == stored.position  # no second fold from 1 on take-over
        assert p.model.decisions_read == len(want_ids) - stored.position
    finally:
        await p.stop()
        await sink.close()
    await assert_changes_and_views(broker, names, client, run_ids, want_ids)
    await assert_same_rows(nats_server, settings, killed, tmp_path / "once.sqlite3", run_ids)


async def test_a_projector_whose_sqlite_model_is_behind_the_snapshot_folds_from_1(
    nats_server: EmbeddedServer, settings: Settings, broker: Broker, tmp_path: Path
) -> None:
    names = Names(settings.prefix)
    last = await write_runs(broker, names, "e", 12)
    async with Projector(nats=nats_server.url, settings=settings, interval=0.2) as p:
        await wait_for(lambda: _written(p, last), DEADLINE, what="every view written")
    snap = await read_snapshot(broker, names)
    assert snap is not None and snap.position == last
    sink = await SqliteModel.open(tmp_path / "new.sqlite3", events_stream=names.events_stream)
    try:
        async with Projector(nats=nats_server.url, settings=settings, sink=sink, interval=0.2) as p:
            assert p.model.restored_from == 0

            async def fed() -> bool:
                return sink.position >= last

            await wait_for(fed, DEADLINE, what="the SQLite model fed from sequence 1")
            assert p.model.decisions_read == last
        for i in range(12):
            row = await sink.get(f"e{i}")
            assert row is not None and row.last_seq > 0
        # with its SQLite model at the snapshot (or past it), it starts from the snapshot
        async with Projector(nats=nats_server.url, settings=settings, sink=sink, interval=0.2) as p:
            assert p.model.restored_from == last and p.model.decisions_read == 0
    finally:
        await sink.close()


async def _written(p: Projector, seq: int) -> bool:
    return p.leading and p.written >= seq


async def test_the_worker_role_stores_snapshots_the_watchdog_reads_them_and_no_more(
    processes: None,
    tmp_path: Path,
) -> None:
    """Under ``broker/auth.py``'s users: the projector (worker role) creates the bucket and
    replaces its snapshot (the chunks of the one before purged), the watchdog reads it and may
    not write it, a client may not read it (a warning and ``None``: fold from 1)."""
    prefix = "snapauth"
    names = Names(prefix)
    passwords = {role: uuid.uuid4().hex for role in ROLES}
    users = [AuthUser(role, passwords[role], role) for role in ROLES]
    server = EmbeddedServer(store_dir=tmp_path / "nats", port=0, auth=users, auth_prefix=prefix)
    await server.start()
    conns: dict[str, Broker] = {}
    try:
        for role in ROLES:
            conns[role] = await Broker.connect(server.url_for(role))
        await ensure_topology(conns["admin"], names, Settings(prefix=prefix))
        body: ModelSnapshot[RunSummary] = ModelSnapshot(format=1, position=0)
        await write_snapshot(conns["worker"], names, body)
        await write_snapshot(conns["worker"], names, body)  # replaces it: purges the old chunks
        info = await conns["admin"].api(f"$JS.API.STREAM.INFO.{names.snapshots_stream}")
        assert info["state"]["messages"] == 2  # one chunk, one description
        assert await read_snapshot(conns["watchdog"], names) == body
        with pytest.raises(PermissionDenied):
            await write_snapshot(conns["watchdog"], names, body)
        assert await read_snapshot(conns["client"], names) is None
    finally:
        for b in conns.values():
            await b.close()
        await server.stop()
