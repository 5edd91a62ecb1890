"""Watching a run on a real nats-server: ``watch_run`` (the projector's views, in order, until
the run ends) and ``sojourn watch`` (a live timeline from the run's events).

An in-process ``Worker`` runs the agent below, which waits for a signal, then runs a step that
fails once and is retried, then completes; an in-process ``Projector`` writes its views. The
CLI runs as a real subprocess started while the run waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.actors import (
    Client,
    Context,
    RetryPolicy,
    Worker,
    agent,
    current_step,
    fold,
    step,
)
from sojourn.actors.client import watching as _watching
from sojourn.actors.client.watching import ViewOrder, decode_change, watch_run
from sojourn.broker import EmbeddedServer, Names
from sojourn.projections.projector import Projector
from sojourn.schemas.codec import encode, to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import RunNotFound
from sojourn.schemas.health import LIVENESS_STATES, LivenessState
from sojourn.schemas.views import RunView
from sojourn.schemas.wire import StartTrigger
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for

DEADLINE = 60.0

# --- the agent ---------------------------------------------------------------------------------

attempts: dict[str, int] = {}


def prepare(name: str) -> str:
    return f"prepared {name}"


@step(retry=RetryPolicy(retry_on=(ConnectionError,), attempts=3, initial_interval=0.3, jitter=0))
def fetch() -> str:
    """Fails on its first attempt, works on the second."""
    info = current_step()
    attempts[info.run_id] = info.attempt
    if info.attempt == 1:
        raise ConnectionError("connection reset")
    return f"fetched on attempt {info.attempt}"


@agent("watched")
async def watched(ctx: Context, name: str) -> dict[str, Any]:
    prepared = await ctx.step(prepare, name)
    approval = await ctx.wait_for("approve", timeout=600)
    fetched = await ctx.step(fetch)
    return {"prepared": prepared, "approval": approval, "fetched": fetched}


# --- fixtures and helpers ----------------------------------------------------------------------


@pytest_asyncio.fixture
async def worker(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Worker]:
    w = Worker([watched], nats=nats_server.url, settings=settings)
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


@pytest_asyncio.fixture
async def projector(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Projector]:
    p = Projector(nats=nats_server.url, settings=settings)
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


async def until_waiting(client: Client, run_id: str) -> None:
    async def waiting() -> bool:
        try:
            state = await client.state(run_id)
        except RunNotFound:
            return False
        return state.status == "waiting" and "signal:approve" in state.waiting_on

    await wait_for(waiting, timeout=DEADLINE, what=f"run {run_id} waiting for approve")


async def collect(client: Client, run_id: str, timeout: float = DEADLINE) -> list[RunView]:
    views: list[RunView] = []
    async with contextlib.aclosing(
        watch_run(client.broker, client.names, run_id, timeout=timeout)
    ) as views_of_run:
        async for view in views_of_run:
            views.append(view)
    return views


async def decided(client: Client, run_id: str) -> list[tuple[int, str]]:
    """``(seq, status)`` after each decision of the run's history, by folding its prefixes:
    what the views must show, one per decision."""
    history = await client.history(run_id)
    out: list[tuple[int, str]] = []
    for i, d in enumerate(history):
        state = fold(e for done in history[: i + 1] for e in done.events)
        out.append((d.seq, "pending" if state.status == "new" else state.status))
    return out


def per_decision(views: list[RunView]) -> list[tuple[int, str]]:
    """``(last_seq, status)`` of the views, one per decision: views that differ from the one
    before only in liveness (the projector publishes liveness changes too) must keep the
    decision's status, and are folded into it here."""
    out: list[tuple[int, str]] = []
    for v in views:
        if out and out[-1][0] == v.last_seq:
            assert out[-1][1] == v.status, views
            continue
        out.append((v.last_seq, v.status))
    return out


def assert_in_order(views: list[RunView]) -> None:
    keys = [(v.last_seq, v.liveness) for v in views]
    assert len(keys) == len(set(keys)), f"a view twice: {keys}"
    assert [v.last_seq for v in views] == sorted(v.last_seq for v in views), keys


# --- watch_run ---------------------------------------------------------------------------------


@pytest.mark.parametrize("reread", [_watching.REREAD_EVERY, 0.02])
async def test_watch_yields_every_state_change_in_order(
    client: Client,
    worker: Worker,
    projector: Projector,
    reread: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With re-reads every 20 ms, every view is read both live and from the stream (as after
    a reconnect): still each once, in order."""
    monkeypatch.setattr(_watching, "REREAD_EVERY", reread)
    run_id = await client.start("watched", "ada", wait=True)
    watching = asyncio.ensure_future(collect(client, run_id))
    await until_waiting(client, run_id)
    assert not watching.done()
    await client.signal(run_id, "approve", {"ok": True})
    views = await watching
    assert await client.result(run_id, timeout=DEADLINE) == {
        "prepared": "prepared ada",
        "approval": {"ok": True},
        "fetched": "fetched on attempt 2",
    }
    assert attempts[run_id] == 2
    assert_in_order(views)
    assert views[-1].status == "completed"
    assert sum(v.status == "completed" for v in views) == 1
    expected = await decided(client, run_id)
    got = [s for s in per_decision(views) if s[0] > 0]  # a pending view (last_seq 0) first
    assert got == expected
    statuses = [s for _, s in got]
    for status in ("waiting", "running", "completed"):
        assert status in statuses
    assert any(v.retries >= 1 for v in views)  # the failed attempt was seen


async def test_watch_after_the_end_yields_the_stored_views_and_stops(
    client: Client, worker: Worker, projector: Projector
) -> None:
    run_id = await client.start("watched", "bo", wait=True)
    await until_waiting(client, run_id)
    await client.signal(run_id, "approve", "yes")
    await client.result(run_id, timeout=DEADLINE)

    async def projected() -> bool:
        m = await client.broker.direct_get_last(
            client.names.runs_kv_stream, client.names.run_key(run_id)
        )
        return m is not None and b'"completed"' in m.data

    await wait_for(projected, timeout=DEADLINE, what="the completed view")
    views = await collect(client, run_id, timeout=DEADLINE)
    assert_in_order(views)
    assert views[-1].status == "completed"
    assert [s for s in per_decision(views) if s[0] > 0] == await decided(client, run_id)


async def test_unknown_run_raises_run_not_found(
    client: Client, worker: Worker, projector: Projector
) -> None:
    with pytest.raises(RunNotFound):
        await collect(client, "no-such-run", timeout=DEADLINE)


async def test_watch_times_out(client: Client, worker: Worker, projector: Projector) -> None:
    run_id = await client.start("watched", "cy", wait=True)
    await until_waiting(client, run_id)
    views: list[RunView] = []
    with pytest.raises(TimeoutError):
        async for view in watch_run(client.broker, client.names, run_id, timeout=1.0):
            views.append(view)
    assert views and views[-1].status == "waiting"


async def test_a_call_bound_by_a_deadline_already_passed_is_closed_not_left_unawaited() -> None:
    """A watch whose deadline passes between two broker calls raises ``TimeoutError`` and
    closes the call it did not make: a coroutine left unawaited is a warning when the garbage
    collector finds it, which failed whichever test ran then (seen in CI)."""
    deadline = _watching._Deadline("r", 0.0)

    async def call() -> int:
        return 1

    never = call()
    with pytest.raises(TimeoutError):
        await deadline.bound(never)
    assert inspect.getcoroutinestate(never) == inspect.CORO_CLOSED


async def test_garbage_on_the_change_subject_is_ignored(
    client: Client, worker: Worker, projector: Projector
) -> None:
    run_id = await client.start("watched", "di", wait=True)
    await until_waiting(client, run_id)
    views: list[RunView] = []
    seen_waiting = asyncio.Event()

    async def watch() -> None:
        async for view in watch_run(client.broker, client.names, run_id, timeout=DEADLINE):
            views.append(view)
            if view.status == "waiting":
                seen_waiting.set()

    watching = asyncio.ensure_future(watch())
    await asyncio.wait_for(seen_waiting.wait(), DEADLINE)
    subject = client.names.change("watched", run_id)
    forged = RunView(run_id="another-run", agent="watched", status="completed", last_seq=10**9)
    wrong_agent = RunView(run_id=run_id, agent="other", status="completed", last_seq=10**9)
    garbage = [
        b"",
        b"\xff\xfe not json",
        b"[1, 2, 3]",
        b'{"run_id": 5}',
        b'{"run_id": "%s", "agent": "watched", "status": "exploded"}' % run_id.encode(),
        b'{"run_id": "%s", "agent": "watched", "status": "completed", "last_seq": -1}'
        % run_id.encode(),
        encode(forged),
        b"x" * 300_000,
    ]
    for body in garbage:
        await client.broker.publish_core(subject, body)
    await client.broker.publish_core(client.names.change("other", run_id), encode(wrong_agent))
    await client.broker.flush()
    await client.signal(run_id, "approve", None)
    await asyncio.wait_for(watching, DEADLINE)
    assert_in_order(views)
    assert all(v.run_id == run_id and v.agent == "watched" for v in views)
    assert views[-1].status == "completed"
    assert [s for s in per_decision(views) if s[0] > 0] == await decided(client, run_id)


# --- sojourn watch -----------------------------------------------------------------------------


@dataclass
class Watcher:
    """``sojourn watch`` as a subprocess, its stdout read line by line."""

    proc: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)

    async def expect(self, needle: str) -> str:
        """The first line containing ``needle`` (reading on until it comes)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if needle in line:
                    return line
            seen = len(self.lines)
            assert self.proc.stdout is not None
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"no line with {needle!r}: {self.lines}")
            raw = await asyncio.wait_for(self.proc.stdout.readline(), remaining)
            if not raw:
                raise AssertionError(f"exited before {needle!r}: {self.lines}")
            self.lines.append(raw.decode().rstrip("\n"))

    async def finish(self) -> tuple[int, str]:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        rest, err = await asyncio.wait_for(self.proc.communicate(), DEADLINE)
        self.lines.extend(rest.decode().splitlines())
        assert self.proc.returncode is not None
        return self.proc.returncode, err.decode()


@contextlib.asynccontextmanager
async def sojourn_watch(
    server: EmbeddedServer, settings: Settings, *args: str
) -> AsyncIterator[Watcher]:
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "sojourn.actors.cli",
        "watch",
        *args,
        "--nats",
        server.url,
        "--prefix",
        settings.prefix,
        cwd=ROOT,
        env=subprocess_env(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield Watcher(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_sojourn_watch_prints_the_timeline_live_and_exits_0(
    nats_server: EmbeddedServer, settings: Settings, client: Client, worker: Worker
) -> None:
    run_id = await client.start("watched", "ed", wait=True)
    await until_waiting(client, run_id)
    async with sojourn_watch(nats_server, settings, run_id) as w:
        # the history so far, the wait with its deadline
        await w.expect("RunStarted")
        wait = await w.expect("WaitStarted")
        assert "waiting at pos=" in wait and "signal:approve" in wait and "until " in wait
        await client.signal(run_id, "approve", {"ok": True}, sender="ops")
        received = await w.expect("SignalReceived")
        assert "signal approve received from ops" in received
        consumed = await w.expect("WaitCompleted")
        assert "by signal approve" in consumed
        retry = await w.expect("StepFailed")
        assert "attempt 1 failed" in retry and "ConnectionError" in retry
        assert "attempt 2 at " in retry
        end = await w.expect("RunCompleted")
        assert "fetched on attempt 2" in end
        rc, err = await w.finish()
    assert rc == 0, err
    times = [line.split()[:2] for line in w.lines]
    assert all(t[1].startswith(("+", "-")) for t in times), w.lines
    assert w.lines[-1] == end  # nothing after the end


async def test_sojourn_watch_waits_for_a_pending_run(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    """A start stored while no worker runs: ``sojourn watch`` says the run is pending, then
    follows it once a worker takes it."""
    run_id = "pending-run"
    await client._ensure()  # the streams, as a first start makes them
    await client.broker.publish(
        client.names.start("watched", None, run_id),
        encode(StartTrigger(input=to_raw("gil"), run_id=run_id)),
    )
    async with sojourn_watch(nats_server, settings, run_id) as w:
        await w.expect("is pending")
        w2 = Worker([watched], nats=nats_server.url, settings=settings)
        await w2.start()
        try:
            await w.expect("WaitStarted")
            await client.signal(run_id, "approve", True)
            await w.expect("RunCompleted")
            rc, err = await w.finish()
        finally:
            await w2.stop()
    assert rc == 0, err


async def test_sojourn_watch_json_of_an_ended_run(
    nats_server: EmbeddedServer, settings: Settings, client: Client, worker: Worker
) -> None:
    run_id = await client.start("watched", "fu", wait=True)
    await until_waiting(client, run_id)
    await client.signal(run_id, "approve", 1)
    await client.result(run_id, timeout=DEADLINE)
    async with sojourn_watch(nats_server, settings, run_id, "--json") as w:
        rc, err = await w.finish()
    assert rc == 0, err
    rows = [json.loads(line) for line in w.lines]
    history = await client.history(run_id)
    assert [(r["seq"], r["type"]) for r in rows] == [
        (d.seq, type(e).__name__) for d in history for e in d.events
    ]
    assert rows[0]["since_previous"] == 0
    assert all(r["since_previous"] >= 0 for r in rows)  # one worker's clock
    assert rows[-1]["event"]["type"] == "run.completed.v1"


async def test_sojourn_watch_of_an_unknown_run_exits_1(
    nats_server: EmbeddedServer, settings: Settings, client: Client, worker: Worker
) -> None:
    async with sojourn_watch(nats_server, settings, "nope") as w:
        rc, err = await w.finish()
    assert rc == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "nope" in lines[0], err
    assert w.lines == []


# --- the order of views (pure) -----------------------------------------------------------------

livenesses = st.sampled_from([None, *LIVENESS_STATES])


@st.composite
def published(draw: st.DrawFn) -> list[tuple[int, LivenessState | None]]:
    """What a projector publishes for one run: ``last_seq`` never goes back, and views of one
    decision differ in liveness."""
    out: list[tuple[int, LivenessState | None]] = []
    seq = draw(st.integers(0, 3))
    for _ in range(draw(st.integers(0, 30))):
        seq += draw(st.integers(0, 3))
        out.append((seq, draw(livenesses)))
    return out


def view(seq: int, liveness: LivenessState | None) -> RunView:
    return RunView(run_id="r", agent="a", status="running", liveness=liveness, last_seq=seq)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(published(), st.data())
def test_view_order_passes_each_view_once_in_order(
    views: list[tuple[int, LivenessState | None]], data: st.DataObject
) -> None:
    """Each published view arrives, in order, among copies of views published before it (read
    again from the stream, or live and stored both): exactly the published ones pass, each
    once, a liveness repeated within one decision only the first time."""
    order = ViewOrder()
    passed: list[tuple[int, LivenessState | None]] = []
    for i, key in enumerate(views):
        earlier = data.draw(st.lists(st.sampled_from(views[: i + 1]), max_size=3))
        for k in [*earlier, key]:
            if order.admit(view(*k)):
                passed.append(k)
    expected: list[tuple[int, LivenessState | None]] = []
    for k in views:
        if k not in expected:
            expected.append(k)
    assert passed == expected


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.binary(max_size=512), st.sampled_from(["t.runs.a.r", "t.runs.b.r", "t.runs.a.rr"]))
def test_decode_change_never_raises(data: bytes, subject: str) -> None:
    v = decode_change(Names("t"), "r", subject, data)
    assert v is None or (v.run_id == "r" and v.agent == subject.split(".")[2])


def test_decode_change_checks_subject_run_and_agent() -> None:
    names = Names("t")
    good = encode(view(3, "running"))
    assert decode_change(names, "r", "t.runs.a.r", good) == view(3, "running")
    assert decode_change(names, "r", "t.runs.b.r", good) is None  # another agent's subject
    assert decode_change(names, "r", "t.runs.a.r.x", good) is None
    assert decode_change(names, "r", "u.runs.a.r", good) is None
    assert decode_change(names, "x", "t.runs.a.x", good) is None  # a view of another run
