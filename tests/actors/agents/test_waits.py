"""Durable waits on a real nats-server: broker-kept timers, signals, select, waiting as state.

Where a test needs "no worker process at all" or a killed broker, workers run in their own
processes (``tests.apps.waits``); otherwise an in-process ``Worker`` serves the agents below.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio

from sojourn.actors import (
    Agent,
    Client,
    Context,
    RunFailedError,
    RunState,
    Worker,
    agent,
    current_step,
)
from sojourn.broker import Broker, Delivery, EmbeddedServer, Names
from sojourn.broker import headers as h
from sojourn.schemas import (
    InvalidName,
    RunEvent,
    RunFailed,
    SignalReceived,
    WaitCompleted,
    WaitStarted,
    decode_dead_letter,
)
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import RunNotFound
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for

# --- helpers -----------------------------------------------------------------------------------


class WorkerProc:
    """A worker for ``module``'s agents in its own process, killed for real.

    Its output goes to a file (a pipe nobody reads could fill up and stall it).
    """

    def __init__(
        self,
        url: str,
        prefix: str,
        tmp: Path,
        name: str,
        *,
        log: Path,
        module: str = "tests.apps.waits",
        slow: float = 3.0,
    ) -> None:
        self.out = tmp / f"{name}.out"
        self._out = open(self.out, "wb")
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "tests.apps.run_worker", url, prefix, module, "2"],
            cwd=ROOT,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=subprocess_env(SOJOURN_TEST_LOG=str(log), SOJOURN_SLOW_STEP=str(slow)),
        )

    async def ready(self) -> None:
        async def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited early: {self.out.read_text()[-2000:]}")
            return b"ready" in self.out.read_bytes()

        await wait_for(up, timeout=30, interval=0.05, what="the worker process to be ready")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close()

    def _close(self) -> None:
        if not self._out.closed:
            self._out.close()


def executions(log: Path) -> list[tuple[str, str, str, int]]:
    """``(event, step, idempotency key, attempt)`` rows written by ``tests.apps.waits`` steps."""
    if not log.exists():
        return []
    rows = []
    for raw in log.read_text().splitlines():
        event, name, key, attempt = raw.split()
        rows.append((event, name, key, int(attempt)))
    return rows


async def events_of(client: Client, run_id: str) -> list[RunEvent]:
    return [e for d in await client.history(run_id) for e in d.events]


async def until_state(
    client: Client,
    run_id: str,
    check: Callable[[RunState], bool],
    *,
    timeout: float = 30.0,
    what: str = "the run's state",
) -> RunState:
    """Poll the run's folded state until ``check`` holds; return that state."""
    seen: list[RunState] = []

    async def ok() -> bool:
        try:
            st = await client.state(run_id)
        except RunNotFound:
            return False
        if check(st):
            seen.append(st)
            return True
        return False

    await wait_for(ok, timeout=timeout, what=f"{what} of {run_id}")
    return seen[-1]


def is_waiting(st: RunState) -> bool:
    return st.status == "waiting"


async def time_passes(t: float, *, timeout: float = 30.0) -> None:
    """Wait until the wall clock reaches ``t`` (a deadline the test depends on)."""

    async def passed() -> bool:
        return time.time() >= t

    await wait_for(passed, timeout=timeout, what=f"the wall clock to reach {t}")


async def send_raw(
    broker: Broker, subject: str, data: bytes, *, timeout: float = 15.0, **headers: str
) -> dict[str, Any]:
    """Publish like a foreign client (raw bytes, ``Sojourn-Reply-To``); return the answer."""
    inbox = broker.new_inbox()
    sub = await broker.subscribe(inbox, max_msgs=1)
    try:
        await broker.publish(subject, data, {h.REPLY_TO: inbox, **headers})
        msg = await sub.next_msg(timeout=timeout)
    finally:
        await sub.unsubscribe()
    answer: dict[str, Any] = json.loads(msg.data)
    return answer


async def dead_letter(client: Client, kind: str):  # type: ignore[no-untyped-def]
    m = await client.broker.direct_get_last(client.names.dlq_stream, client.names.dlq(kind))
    assert m is not None, f"no dead-letter record of kind {kind}"
    return decode_dead_letter(m.data)


async def stored_timer(client: Client, run_id: str, position: int) -> Any:
    """The pending timer message of a wait, or ``None``."""
    names = client.names
    return await client.broker.direct_get_last(
        names.wake_stream, names.timer(run_id, str(position))
    )


# --- agents served in-process ---------------------------------------------------------------

gates: dict[str, asyncio.Event] = {}


def gate(run_id: str) -> asyncio.Event:
    return gates.setdefault(run_id, asyncio.Event())


async def hold() -> str:
    """A step that blocks until the test opens its run's gate."""
    await gate(current_step().run_id).wait()
    return "held"


@agent("signed")
async def signed(ctx: Context, timeout: float | None) -> Any:
    return await ctx.wait_for("docs.signed", timeout=timeout)


@agent("signed_then_work")
async def signed_then_work(ctx: Context, _: None) -> Any:
    got = await ctx.wait_for("docs.signed", timeout=60)
    await ctx.step(hold)
    return got


@agent("early")
async def early(ctx: Context, _: None) -> Any:
    """Busy in a step while the signal arrives; only then does it wait for it."""
    await ctx.step(hold)
    return await ctx.wait_for("early.bird")


@agent("items")
async def items(ctx: Context, n: int) -> list[Any]:
    return [await ctx.wait_for("item") for _ in range(n)]


@agent("votes")
async def votes(ctx: Context, _: None) -> list[Any]:
    first = await ctx.wait_for("vote")
    await ctx.wait_for("done")
    second = await ctx.wait_for("vote", timeout=0.3)
    return [first, second]


@agent("chooser")
async def chooser(ctx: Context, timeout: float) -> Any:
    sel = await ctx.select("a", "b", timeout=timeout)
    return None if sel is None else [sel.name, sel.payload]


@agent("late_chooser")
async def late_chooser(ctx: Context, _: None) -> Any:
    await ctx.step(hold)
    sel = await ctx.select("a", "b")
    return None if sel is None else [sel.name, sel.payload]


@agent("past_sleeper")
async def past_sleeper(ctx: Context, _: None) -> str:
    await ctx.sleep(until=datetime(2000, 1, 1, tzinfo=UTC))
    return "done"


@agent("bad_wait")
async def bad_wait(ctx: Context, _: None) -> Any:
    return await ctx.wait_for("bad name!")


@agent("parked")
async def parked(ctx: Context, n: int) -> int:
    got = await ctx.wait_for("go", type=int)
    assert got is not None  # no timeout: the wait ends only with the signal
    return n + got


@agent("hold_then_nap")
async def hold_then_nap(ctx: Context, seconds: float) -> str:
    await ctx.step(hold)
    await ctx.sleep(seconds)
    return "rested"


AGENTS: list[Agent[Any, Any]] = [
    hold_then_nap,
    signed,
    signed_then_work,
    early,
    items,
    votes,
    chooser,
    late_chooser,
    past_sleeper,
    bad_wait,
    parked,
]


@pytest_asyncio.fixture
async def worker(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Worker]:
    w = Worker(AGENTS, nats=nats_server.url, settings=settings)
    await w.start()
    try:
        yield w
    finally:
        for g in gates.values():
            g.set()
        await w.stop()


# --- timers ------------------------------------------------------------------------------------


async def test_sleep_fires_while_no_worker_process_exists(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> None:
    log = tmp_path / "steps.log"
    first = WorkerProc(nats_server.url, settings.prefix, tmp_path, "w1", log=log)
    second: WorkerProc | None = None
    try:
        await first.ready()
        run_id = await client.start("napper", 3.0, run_id="nap-offline", wait=True)
        st = await until_state(client, run_id, is_waiting, what="the sleep to be recorded")
        assert st.waiting_on == ("timer",)
        assert st.deadline is not None
        assert 0.5 < st.deadline - time.time() <= 3.05, st.deadline - time.time()
        started = [e for e in await events_of(client, run_id) if isinstance(e, WaitStarted)]
        assert len(started) == 1 and abs(st.deadline - started[0].at - 3.0) < 0.25
        first.kill()
        assert first.proc.poll() is not None  # no worker process exists from here on

        # The broker itself fires the timer: a wake lands on the run's wake subject, routed
        # to the workers of its agent.
        names = client.names

        async def fired() -> bool:
            wake = names.wake(run_id, "napper")
            m = await client.broker.direct_get_last(names.wake_stream, wake)
            return m is not None and m.header(h.SCHEDULER) == names.timer(run_id, "0")

        await wait_for(fired, timeout=15, what="the broker to fire the timer")
        assert time.time() >= st.deadline - 0.05
        assert (await client.state(run_id)).status == "waiting"  # nobody has run it yet
        assert executions(log) == []

        second = WorkerProc(nats_server.url, settings.prefix, tmp_path, "w2", log=log)
        await second.ready()
        assert await client.result(run_id, timeout=30) == "woke up"
    finally:
        first.stop()
        if second is not None:
            second.stop()

    assert [r[:3] for r in executions(log)] == [("exec", "after_nap", "nap-offline/1")]
    events = await events_of(client, run_id)
    started = [e for e in events if isinstance(e, WaitStarted)]
    done = [e for e in events if isinstance(e, WaitCompleted)]
    assert [(e.key, e.deadline) for e in started] == [("sleep", st.deadline)]
    assert len(done) == 1 and done[0].outcome == "timeout"
    assert st.deadline is not None and done[0].at >= st.deadline - 0.05
    assert await stored_timer(client, run_id, 0) is None


async def test_pending_timers_survive_a_broker_sigkill(
    own_server: EmbeddedServer, settings: Settings, tmp_path: Path
) -> None:
    """Two sleeping runs; the broker is SIGKILLed. One timer falls due while the broker is down
    (it must fire right after start-up), the other after the restart. Neither fires early."""
    log = tmp_path / "steps.log"
    worker = WorkerProc(own_server.url, settings.prefix, tmp_path, "w", log=log)
    client = await Client.connect(own_server.url, settings=settings)
    try:
        await worker.ready()
        short = await client.start("napper", 2.0, run_id="nap-short", wait=True)
        long = await client.start("napper", 6.0, run_id="nap-long", wait=True)
        deadlines: dict[str, float] = {}
        for run_id in (short, long):
            st = await until_state(client, run_id, is_waiting, what="the sleep")
            assert st.deadline is not None
            deadlines[run_id] = st.deadline
        assert await stored_timer(client, long, 0) is not None
        await client.close()
        own_server.kill()
        await time_passes(deadlines[short] + 0.3)  # overdue while the broker is down
        await own_server.start()  # same store, same port
        client = await Client.connect(own_server.url, settings=settings)
        if time.time() < deadlines[long] - 1.0:
            assert await stored_timer(client, long, 0) is not None  # still pending: not lost
            assert (await client.status(long)) == "waiting"
        assert await client.result(short, timeout=60) == "woke up"
        assert await client.result(long, timeout=60) == "woke up"
        for run_id, deadline in deadlines.items():
            events = await events_of(client, run_id)
            done = [e for e in events if isinstance(e, WaitCompleted)]
            assert len(done) == 1 and done[0].outcome == "timeout", done
            assert done[0].at >= deadline - 0.05, (run_id, done[0].at, deadline)
    finally:
        worker.stop()
        await client.close()
    keys = sorted(r[2] for r in executions(log) if r[0] == "exec")
    assert keys == ["nap-long/1", "nap-short/1"]  # each step ran once


async def test_broker_outage_while_a_run_parks_does_not_fail_it(
    own_server: EmbeddedServer, settings: Settings
) -> None:
    """The run reaches ``ctx.sleep`` (which schedules a timer) while the broker is down for
    longer than one publish timeout; once the broker is back the run must carry on."""
    worker = Worker(AGENTS, nats=own_server.url, settings=settings)
    await worker.start()
    client = await Client.connect(own_server.url, settings=settings)
    try:
        run_id = await client.start("hold_then_nap", 0.5, run_id="outage-1", wait=True)
        await until_state(client, run_id, lambda s: s.status == "running", what="the step")
        await client.close()
        own_server.kill()
        gate(run_id).set()  # the step ends; the run goes on to park while the broker is down
        await time_passes(time.time() + 6.0)  # the outage outlasts a publish timeout (5 s)
        await own_server.start()
        client = await Client.connect(own_server.url, settings=settings)
        assert await client.result(run_id, timeout=60) == "rested"
    finally:
        await client.close()
        await worker.stop()


async def test_timer_in_the_past_returns_at_once(worker: Worker, client: Client) -> None:
    t0 = time.monotonic()
    run_id = await client.start("past_sleeper", None, run_id="past-1", wait=True)
    assert await client.result(run_id, timeout=30) == "done"
    assert time.monotonic() - t0 < 5.0
    events = await events_of(client, run_id)
    assert not any(isinstance(e, WaitStarted) for e in events)  # it never parked
    done = [e for e in events if isinstance(e, WaitCompleted)]
    assert [(e.key, e.outcome) for e in done] == [("sleep", "timeout")]
    assert await stored_timer(client, run_id, 0) is None


# --- signals -----------------------------------------------------------------------------------


async def test_signal_sent_while_no_worker_runs_wakes_the_run_later(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    first = Worker(AGENTS, nats=nats_server.url, settings=settings)
    await first.start()
    try:
        run_id = await client.start("signed", None, run_id="offline-sig", wait=True)
        st = await until_state(client, run_id, is_waiting, what="the wait")
        assert st.waiting_on == ("signal:docs.signed",) and st.deadline is None
    finally:
        await first.stop()
    sid = await client.signal(run_id, "docs.signed", {"by": "hr"})
    st = await client.state(run_id)
    assert st.status == "waiting" and st.signals == ()  # kept in the inbox, not yet taken
    async with Worker(AGENTS, nats=nats_server.url, settings=settings):
        assert await client.result(run_id, timeout=30) == {"by": "hr"}
    received = [e for e in await events_of(client, run_id) if isinstance(e, SignalReceived)]
    assert [(e.name, e.signal_id) for e in received] == [("docs.signed", sid)]


async def test_signal_sent_before_the_wait_is_buffered_not_lost(
    worker: Worker, client: Client
) -> None:
    run_id = await client.start("early", None, run_id="early-1", wait=True)

    async def in_step() -> bool:
        return (await client.state(run_id)).status == "running"

    await wait_for(in_step, what="the run to be busy in its first step")
    await client.signal(run_id, "early.bird", {"n": 7}, signal_id="bird-1")

    async def buffered() -> bool:
        return any(isinstance(e, SignalReceived) for e in await events_of(client, run_id))

    await wait_for(buffered, what="the signal to be recorded")
    st = await client.state(run_id)
    assert st.status == "running" and [s.signal_id for s in st.signals] == ["bird-1"]
    gate(run_id).set()
    assert await client.result(run_id, timeout=30) == {"n": 7}

    events = await events_of(client, run_id)
    kinds = [type(e).__name__ for e in events]
    got = kinds.index("SignalReceived")
    wait_at = kinds.index("WaitStarted") if "WaitStarted" in kinds else kinds.index("WaitCompleted")
    assert got < wait_at, kinds
    done = [e for e in events if isinstance(e, WaitCompleted)]
    assert [(e.outcome, e.signal, e.signal_id) for e in done] == [
        ("signal", "early.bird", "bird-1")
    ]
    assert (await client.state(run_id)).signals == ()  # consumed


async def test_same_signal_id_counts_once(nats_server: EmbeddedServer, settings: Settings) -> None:
    """Twice within the broker's dedup window, and once more after it (the intake's check)."""
    s = msgspec.structs.replace(settings, dedup_window=1.0)
    async with (
        await Client.connect(nats_server.url, settings=s) as client,
        Worker(AGENTS, nats=nats_server.url, settings=s),
    ):
        run_id = await client.start("votes", None, run_id="votes-1", wait=True)
        await until_state(client, run_id, is_waiting, what="the first wait")
        await client.signal(run_id, "vote", "yes", signal_id="vote-1")
        await client.signal(run_id, "vote", "yes", signal_id="vote-1")
        await until_state(
            client,
            run_id,
            lambda st: "signal:done" in st.waiting_on,
            what="the first vote to be taken",
        )
        # Publish the same signal id again until the broker's dedup window has passed, so the
        # intake itself sees it a second time.
        broker, names = client.broker, client.names
        inbox = broker.new_inbox()
        sub = await broker.subscribe(inbox, max_msgs=1)
        try:
            headers = {h.MSG_ID: "vote-1", h.REPLY_TO: inbox}

            async def stored() -> bool:
                ack = await broker.publish_raw(names.signal(run_id, "vote"), b'"yes"', headers)
                assert not ack.get("error"), ack
                return not ack.get("duplicate")

            await wait_for(stored, timeout=20, interval=0.2, what="the dedup window to pass")
            answer = json.loads((await sub.next_msg(timeout=15)).data)
        finally:
            await sub.unsubscribe()
        assert answer == {"run_id": run_id, "created": False}
        await client.signal(run_id, "done")
        assert await client.result(run_id, timeout=30) == ["yes", None]
        received = [e for e in await events_of(client, run_id) if isinstance(e, SignalReceived)]
        assert [(e.name, e.signal_id) for e in received] == [
            ("vote", "vote-1"),
            ("done", received[-1].signal_id),
        ]


async def test_signals_of_one_name_are_consumed_in_order(worker: Worker, client: Client) -> None:
    run_id = await client.start("items", 6, run_id="items-1", wait=True)
    sent = [await client.signal(run_id, "item", i, signal_id=f"item-{i}") for i in range(3)]
    await until_state(client, run_id, is_waiting, what="a wait")
    sent += [await client.signal(run_id, "item", i, signal_id=f"item-{i}") for i in range(3, 6)]
    assert await client.result(run_id, timeout=30) == [0, 1, 2, 3, 4, 5]
    done = [e for e in await events_of(client, run_id) if isinstance(e, WaitCompleted)]
    assert [e.signal_id for e in done] == sent
    assert [e.position for e in done] == list(range(6))


async def test_wait_for_returns_none_on_timeout(worker: Worker, client: Client) -> None:
    run_id = await client.start("signed", 0.5, run_id="timeout-1", wait=True)
    assert await client.result(run_id, timeout=30) is None
    events = await events_of(client, run_id)
    started = [e for e in events if isinstance(e, WaitStarted)]
    done = [e for e in events if isinstance(e, WaitCompleted)]
    assert len(started) == 1 and started[0].deadline is not None
    assert [e.outcome for e in done] == ["timeout"]
    assert done[0].at >= started[0].deadline - 0.05


async def test_select_tells_which_signal_arrived_or_times_out(
    worker: Worker, client: Client
) -> None:
    picked = await client.start("chooser", 30.0, run_id="select-b", wait=True)
    timed_out = await client.start("chooser", 0.5, run_id="select-none", wait=True)
    st = await until_state(client, picked, is_waiting, what="the select")
    assert st.waiting_on == ("signal:a", "signal:b", "timer")
    await client.signal(picked, "b", {"x": 1})
    assert await client.result(picked, timeout=30) == ["b", {"x": 1}]
    assert await client.result(timed_out, timeout=30) is None
    done = [e for e in await events_of(client, timed_out) if isinstance(e, WaitCompleted)]
    assert [e.outcome for e in done] == ["timeout"]


async def test_select_takes_the_oldest_buffered_signal(worker: Worker, client: Client) -> None:
    run_id = await client.start("late_chooser", None, run_id="select-late", wait=True)

    async def in_step() -> bool:
        return (await client.state(run_id)).status == "running"

    await wait_for(in_step, what="the run to be busy in its first step")
    await client.signal(run_id, "b", 1, signal_id="b-1")
    await client.signal(run_id, "a", 2, signal_id="a-1")

    async def both() -> bool:
        return len((await client.state(run_id)).signals) == 2

    await wait_for(both, what="both signals to be recorded")
    gate(run_id).set()
    assert await client.result(run_id, timeout=30) == ["b", 1]
    left = (await client.state(run_id)).signals
    assert [(s.name, s.signal_id) for s in left] == [("a", "a-1")]  # the other stays buffered


# --- waiting as state --------------------------------------------------------------------------


async def test_waiting_is_first_class_state(worker: Worker, client: Client) -> None:
    run_id = await client.start("signed_then_work", None, run_id="state-1", wait=True)
    st = await until_state(client, run_id, is_waiting, what="the wait")
    assert await client.status(run_id) == "waiting"
    assert st.waiting_on == ("signal:docs.signed", "timer")
    assert st.deadline is not None and 55 < st.deadline - time.time() <= 60.05
    assert await stored_timer(client, run_id, 0) is not None
    await client.signal(run_id, "docs.signed", {"by": "ceo"})
    st = await until_state(client, run_id, lambda s: s.status == "running", what="the resume")
    assert st.waiting_on == () and st.deadline is None
    gate(run_id).set()
    assert await client.result(run_id, timeout=30) == {"by": "ceo"}
    st = await client.state(run_id)
    assert st.status == "completed" and st.waiting_on == () and st.deadline is None

    async def timer_gone() -> bool:
        return await stored_timer(client, run_id, 0) is None

    await wait_for(timer_gone, timeout=10, what="the signalled wait's timer to be removed")


async def test_scale_to_zero_with_200_waiting_runs(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    n = 200
    ids = [f"idle-{i}" for i in range(n)]
    first = Worker(AGENTS, nats=nats_server.url, settings=settings)
    await first.start()
    try:
        for i, run_id in enumerate(ids):
            await client.start("parked", i, run_id=run_id)

        async def all_waiting() -> bool:
            states = await asyncio.gather(*(client.state(r) for r in ids), return_exceptions=True)
            return all(isinstance(s, RunState) and s.status == "waiting" for s in states)

        await wait_for(all_waiting, timeout=60, interval=0.25, what="all runs to wait")

        async def idle() -> bool:
            return not first._active

        await wait_for(idle, timeout=10, what="the worker to hold no activation")
        assert first._active == {}
    finally:
        await first.stop()
    async with Worker(AGENTS, nats=nats_server.url, settings=settings):
        for run_id in ids:
            await client.signal(run_id, "go", 1000)
        results = await asyncio.gather(*(client.result(r, timeout=60) for r in ids))
    assert results == [1000 + i for i in range(n)]


# --- bad input ---------------------------------------------------------------------------------


async def test_signal_for_an_unknown_run_is_dead_lettered(worker: Worker, client: Client) -> None:
    body = b'{"by": "nobody"}'
    subject = client.names.signal("ghost", "docs.signed")
    answer = await send_raw(client.broker, subject, body, timeout=20)
    assert answer["error"]["code"] == "unknown_run", answer
    assert "ghost" in answer["error"]["message"]
    record = await dead_letter(client, "signal")
    assert record.code == "unknown_run" and record.kind == "signal"
    assert record.data == body and record.subject == subject
    assert await client.store.last_seq("ghost") == 0


async def test_malformed_signal_is_rejected_and_the_run_keeps_waiting(
    worker: Worker, client: Client
) -> None:
    run_id = await client.start("signed", None, run_id="malformed-1", wait=True)
    await until_state(client, run_id, is_waiting, what="the wait")
    subject = client.names.signal(run_id, "docs.signed")
    answer = await send_raw(client.broker, subject, b"{not json")
    assert answer["error"]["code"] == "invalid_json", answer
    assert "not valid JSON" in answer["error"]["message"]
    record = await dead_letter(client, "signal")
    assert record.code == "invalid_json" and record.data == b"{not json"
    answer = await send_raw(client.broker, client.names.signal(run_id, "bad!name"), b"1")
    assert answer["error"]["code"] == "invalid_trigger", answer
    assert "invalid signal name" in answer["error"]["message"]
    st = await client.state(run_id)
    assert st.status == "waiting" and st.signals == ()
    assert not any(isinstance(e, SignalReceived) for e in await events_of(client, run_id))
    await client.signal(run_id, "docs.signed", {"ok": True})
    assert await client.result(run_id, timeout=30) == {"ok": True}


async def test_signal_for_an_ended_run_is_rejected(worker: Worker, client: Client) -> None:
    run_id = await client.start("past_sleeper", None, run_id="ended-1", wait=True)
    assert await client.result(run_id, timeout=30) == "done"
    before = await client.history(run_id)
    subject = client.names.signal(run_id, "docs.signed")
    answer = await send_raw(client.broker, subject, b'"late"')
    assert answer["error"]["code"] == "run_ended", answer
    record = await dead_letter(client, "signal")
    assert record.code == "run_ended" and record.data == b'"late"'
    assert await client.history(run_id) == before  # nothing appended after the end


async def test_invalid_wait_name_fails_the_run_clearly(worker: Worker, client: Client) -> None:
    run_id = await client.start("bad_wait", None, run_id="badname-1", wait=True)
    with pytest.raises(RunFailedError, match="InvalidName"):
        await client.result(run_id, timeout=30)
    events = await events_of(client, run_id)
    failed = [e for e in events if isinstance(e, RunFailed)]
    assert len(failed) == 1
    assert failed[0].error.type == "InvalidName"
    assert "invalid signal name 'bad name!'" in failed[0].error.message
    assert not any(isinstance(e, (WaitStarted, WaitCompleted)) for e in events)


async def test_client_refuses_invalid_signal_names_before_publishing(
    client: Client, settings: Settings
) -> None:
    names = Names(settings.prefix)
    seen: list[str] = []

    async def on_msg(msg: Delivery) -> None:
        seen.append(msg.subject)

    sub = await client.broker.subscribe(f"{settings.prefix}.signal.>", cb=on_msg)
    try:
        for bad in ("bad name!", "docs..signed", "docs.", "x.*", ">", "", "a" * 300):
            with pytest.raises(InvalidName, match="invalid signal name"):
                await client.signal("some-run", bad, 1)
        with pytest.raises(InvalidName, match="run_id"):
            await client.signal("a.b", "docs.signed", 1)
        # A sentinel (not captured by the inbox stream): whatever was published before it
        # would have arrived first.
        sentinel = f"{settings.prefix}.signal.sentinel"
        await client.broker.publish_core(sentinel, b"")
        await client.broker.flush()

        async def got_sentinel() -> bool:
            return sentinel in seen

        await wait_for(got_sentinel, timeout=10, what="the sentinel")
    finally:
        await sub.unsubscribe()
    assert seen == [sentinel]
    assert names.signal("some-run", "x") not in seen


def tally(total: int, n: int) -> int:
    return total + n


@agent("accumulator")
async def accumulator(ctx: Context, rounds: int) -> int:
    """A long-lived run: each round waits for a signal, then records a step."""
    total = 0
    for _ in range(rounds):
        n = await ctx.wait_for("add", type=int)
        assert n is not None  # no timeout: the wait ends only with the signal
        total = await ctx.step(tally, total, n)
    return total


async def test_a_long_run_woken_many_times_reads_only_new_history(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    """Wakes of a long history come from the worker's history cache plus a tail read, and the
    run still sees exactly what was recorded (including signals appended by the intake).
    (Without kept activations: a kept one reads no history at all,
    tests/actors/worker/test_sticky.py.)"""
    url = nats_server.url
    async with Worker([accumulator], nats=url, settings=settings, sticky_runs=0) as worker:
        run_id = await client.start("accumulator", 30)
        for i in range(1, 31):

            async def waiting(expect: int = i - 1) -> bool:
                with contextlib.suppress(RunNotFound):
                    state = await client.state(run_id)
                    done = sum(op.status == "completed" for op in state.ops if op.kind == "step")
                    return state.status == "waiting" and done == expect
                return False

            await wait_for(waiting, what=f"round {i} to wait")
            await client.signal(run_id, "add", i)
        assert await client.result(run_id, timeout=30) == sum(range(1, 31))
        assert worker.store.cache_hits > 10  # the later wakes read only the tail
    history = await client.history(run_id)
    assert len(history) > 16
