"""sojourn on a 3-node JetStream cluster (issue 12, Proof): R3 streams from ``replicas``; 100
runs on 2 worker processes survive a SIGKILL of the events stream's leader node with no
acknowledged event lost, every run resumed within 10 s and completed, and the node catches up
when it comes back; a lame-duck restart of a node during load fails no run. A worker starting
while the cluster cannot answer waits for it rather than exiting."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from sojourn.actors import Client
from sojourn.broker import BROKER_ERRORS, Broker, Names
from sojourn.broker.cluster import LocalCluster
from sojourn.broker.delivery import StoredMessage
from sojourn.broker.topology import ensure_topology, stream_configs
from sojourn.schemas.codec import decode_events
from sojourn.schemas.config import Settings
from sojourn.schemas.events import RunCompleted, StepCompleted
from tests.conftest import wait_for
from tests.procs import WorkerProc

pytestmark = pytest.mark.usefixtures("processes")  # three-node clusters

T = TypeVar("T")
APP = "tests.cluster.apps"
STEPS = 8


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    # Its ports are picked free, then bound when the nodes start: in a parallel run another
    # test's process may take one in between ("address already in use"). Fresh ports then.
    for attempt in range(3):
        c = LocalCluster(tmp_path / f"cluster{attempt}")
        try:
            await c.start()
            break
        except AssertionError as e:
            c.stop()
            if "address already in use" not in str(e) or attempt == 2:
                raise
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def r3(settings: Settings) -> Settings:
    return Settings(prefix=settings.prefix, lease_ttl=2.0, replicas=3)


async def _settled(read: Callable[[], Awaitable[T]], what: str) -> T:
    """``read()``, asked again while the cluster elects a leader (a request then goes
    unanswered for a moment): the test's own reads must not fail where sojourn retries."""
    for _ in range(60):
        try:
            return await read()
        except BROKER_ERRORS:
            await asyncio.sleep(0.5)
    raise AssertionError(f"{what}: no answer for 30 s")


async def _all_events(b: Broker, names: Names) -> dict[int, StoredMessage]:
    return await _settled(lambda: _read_events(b, names), "reading the events stream")


async def _read_events(b: Broker, names: Names) -> dict[int, StoredMessage]:
    """Every message of the events stream, by stream sequence."""
    out: dict[int, StoredMessage] = {}
    seq = 1
    while True:
        msgs, pending = await b.direct_get_batch(names.events_stream, names.events_all, seq, 500)
        for m in msgs:
            out[m.seq] = m
        if not msgs or pending == 0:
            return out
        seq = msgs[-1].seq + 1


def _effects(log: Path) -> Counter[tuple[str, int]]:
    """How often each (run, position) step body ran, checking every key is ``run/position``."""
    runs: Counter[tuple[str, int]] = Counter()
    for line in log.read_text().splitlines():
        _, run_id, position, key, _attempt = line.split()
        assert key == f"{run_id}/{position}", line
        runs[(run_id, int(position))] += 1
    return runs


def _completed_steps(msgs: dict[int, StoredMessage], names: Names) -> set[tuple[str, int]]:
    done = set()
    for m in msgs.values():
        run_id = m.subject.removeprefix(f"{names.prefix}.ev.")
        for e in decode_events(m.data):
            if isinstance(e, StepCompleted):
                done.add((run_id, e.position))
    return done


async def _workers(cluster: LocalCluster, prefix: str, log: Path, n: int = 2) -> list[WorkerProc]:
    procs = [
        WorkerProc(cluster.urls, prefix, APP, lease_ttl=2.0, SOJOURN_TEST_LOG=str(log))
        for _ in range(n)
    ]
    for p in procs:
        await p.ready()
    return procs


async def test_r3_streams_leader_kill_loses_nothing_and_the_node_catches_up(
    cluster: LocalCluster, r3: Settings, tmp_path: Path
) -> None:
    names = Names(r3.prefix)
    broker = await Broker.connect(cluster.urls)
    await ensure_topology(broker, names, r3, consumers=False)
    streams = [c["name"] for c in stream_configs(names, r3)]
    log = tmp_path / "effects.log"
    log.touch()
    workers = await _workers(cluster, r3.prefix, log)  # their own settings say 1 replica
    client = await Client.connect(cluster.urls, settings=r3)
    try:
        for s in streams:  # R3, and the workers' start left it so (drift, not a rewrite)
            assert (await broker.stream_config(s) or {}).get("num_replicas") == 3, s
        runs = [await client.start("clustered", STEPS) for _ in range(100)]

        async def midway() -> bool:
            return sum(1 for _ in log.read_text().splitlines()) >= 100 * STEPS // 3

        await wait_for(midway, timeout=120, what="a third of the steps")
        before = await _all_events(broker, names)
        done_before = _completed_steps(before, names)
        ended_before = {
            m.subject.removeprefix(f"{names.prefix}.ev.")
            for m in before.values()
            if any(isinstance(e, RunCompleted) for e in decode_events(m.data))
        }
        leader = await cluster.stream_leader(broker, names.events_stream)
        killed_at = time.time()
        cluster.kill(leader)

        async def all_completed() -> bool:
            try:
                return all([await client.status(r) == "completed" for r in runs])
            except BROKER_ERRORS:
                return False  # a leader election under way

        await wait_for(all_completed, timeout=180, interval=0.5, what="every run completed")

        after = await _all_events(broker, names)

        def same(a: StoredMessage, b: StoredMessage) -> bool:
            return (a.subject, a.data, a.time) == (b.subject, b.data, b.time)

        lost = [seq for seq, m in before.items() if seq not in after or not same(after[seq], m)]
        assert lost == [], f"acknowledged events lost or changed: {lost[:10]}"

        late = {}
        for r in runs:
            history = await _settled(functools.partial(client.history, r), f"history of {r}")
            seqs = [d.seq for d in history]
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
            events = [e for d in history for e in d.events]
            positions = [e.position for e in events if isinstance(e, StepCompleted)]
            assert positions == list(range(STEPS)), (r, positions)
            assert isinstance(events[-1], RunCompleted), (r, events[-1])
            if r not in ended_before:
                nxt = min(
                    (
                        m.time
                        for m in after.values()
                        if m.subject == names.events(r) and m.time > killed_at
                    ),
                    default=None,
                )
                assert nxt is not None, r
                late[r] = nxt - killed_at
        assert late and max(late.values()) <= 10.0, sorted(late.values())[-5:]

        ran = _effects(log)
        assert set(ran) == {(r, p) for r in runs for p in range(STEPS)}
        redone = [k for k in done_before if ran[k] != 1]
        if redone:
            run_id = redone[0][0]
            steps = [
                (d.seq, d.writer, [(type(e).__name__, getattr(e, "attempt", "")) for e in d.events])
                for d in await client.history(run_id)
            ]
            lines = [ln for ln in log.read_text().splitlines() if run_id in ln]
            raise AssertionError(
                f"steps recorded before the kill ran again: {redone[:10]}; the first one's "
                f"history {steps}, its effects {lines}"
            )

        await cluster.restart(leader)

        async def caught_up() -> bool:
            try:
                return all([await cluster.replica_current(broker, s, leader) for s in streams])
            except BROKER_ERRORS:
                return False

        await wait_for(caught_up, timeout=120, interval=0.5, what="the restarted node caught up")

        # Its streams are current; its consumers may still be catching up, which /healthz
        # also waits for.
        async def healthy() -> bool:
            code, _ = await cluster.monitor(leader, "/healthz")
            return code == 200

        await wait_for(healthy, timeout=120, interval=0.5, what="the restarted node healthy")
    finally:
        for w in workers:
            w.stop()
        await client.close()
        await broker.close()


async def test_a_lame_duck_restart_during_load_fails_no_run(
    cluster: LocalCluster, r3: Settings, tmp_path: Path
) -> None:
    names = Names(r3.prefix)
    broker = await Broker.connect(cluster.urls)
    await ensure_topology(broker, names, r3, consumers=False)
    log = tmp_path / "effects.log"
    log.touch()
    workers = await _workers(cluster, r3.prefix, log)
    client = await Client.connect(cluster.urls, settings=r3)
    try:
        runs = [await client.start("clustered", STEPS) for _ in range(60)]

        async def started() -> bool:
            return sum(1 for _ in log.read_text().splitlines()) >= 60

        await wait_for(started, timeout=120, what="the runs under way")
        node = await cluster.stream_leader(broker, names.events_stream)
        cluster.lame_duck(node)
        await cluster.wait_exited(node)
        await cluster.restart(node)

        async def all_ended() -> bool:
            try:
                statuses = [await client.status(r) for r in runs]
            except BROKER_ERRORS:
                return False
            return all(s in ("completed", "failed", "cancelled") for s in statuses)

        await wait_for(all_ended, timeout=180, interval=0.5, what="every run ended")
        statuses = Counter([await client.status(r) for r in runs])
        assert statuses == {"completed": len(runs)}, statuses
    finally:
        for w in workers:
            w.stop()
        await client.close()
        await broker.close()


async def test_cluster_urls_reach_any_live_node(cluster: LocalCluster, r3: Settings) -> None:
    """A comma-separated URL list connects while its first node is down, and R3 streams
    keep working with one node of three gone (creating them needs all three)."""
    names = Names(r3.prefix)
    first = await Broker.connect(cluster.urls)
    try:
        await ensure_topology(first, names, r3)
    finally:
        await first.close()
    cluster.kill(0)
    await cluster.wait_healthy()
    broker = await Broker.connect(cluster.urls)
    try:
        assert broker.url == cluster.urls
        await cluster.wait_stream_leaders(broker, [c["name"] for c in stream_configs(names, r3)])
        found = await ensure_topology(broker, names, r3)
        assert {f.state for f in found} == {"ok"}
        ack = await broker.publish(names.events("r1"), b"[]")
        assert ack.stream == names.events_stream
    finally:
        await broker.close()
    await cluster.restart(0)


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP): state ``T`` in ``/proc/PID/stat``."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


async def test_a_worker_starting_while_the_cluster_has_no_quorum_waits_for_it(
    cluster: LocalCluster, r3: Settings, tmp_path: Path
) -> None:
    """Every JetStream request of a worker's start is asked again while the cluster cannot
    answer (here two of three nodes frozen after its streams were read: no quorum, so its
    per-agent consumers can be neither read nor made) instead of the process exiting. On a
    loaded machine a consumer's info can go unanswered for 5 s without any node down."""
    names = Names(r3.prefix)
    broker = await Broker.connect(cluster.urls)
    await ensure_topology(broker, names, r3)
    await broker.close()
    log = tmp_path / "effects.log"
    log.touch()
    near = cluster.nodes[0]
    worker = WorkerProc(
        near.url,
        r3.prefix,
        APP,
        lease_ttl=2.0,
        SOJOURN_TEST_LOG=str(log),
        SOJOURN_PAUSE_AT="agent_consumers",
    )
    frozen = [n.proc.pid for n in cluster.nodes[1:] if n.proc is not None]
    try:

        async def paused() -> bool:
            return _stopped(worker.proc.pid)

        await wait_for(paused, timeout=120, what="the worker at its agent_consumers pause")
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        worker.resume()
        await worker.line(lambda line: b"retrying" in line, "retrying")
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        await worker.ready()
        client = await Client.connect(cluster.urls, settings=r3)
        try:
            run = await _settled(lambda: client.start("clustered", 2), "starting a run")
            assert await client.result(run, timeout=120) == 1
        finally:
            await client.close()
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        worker.stop()
