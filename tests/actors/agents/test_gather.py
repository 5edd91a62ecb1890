"""``ctx.gather``: concurrent steps and children in positions that replay.

First against a ``Context`` over a real ``Machine`` with an in-memory driver (completion order
chosen by the test, hypothesis over it), then end to end on a real nats-server: overlap,
``sojourn replay``, a SIGKILLed worker, children.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from sojourn.actors import (
    Agent,
    Client,
    Context,
    GatherError,
    RetryPolicy,
    RunFailedError,
    StepError,
    TerminalError,
    Worker,
    step,
)
from sojourn.actors.core.actions import Park, Parked
from sojourn.actors.core.journal import Journal
from sojourn.actors.core.machine import Machine
from sojourn.actors.core.ratelimit import Grant
from sojourn.actors.core.replay import replay_run
from sojourn.actors.core.state import fold
from sojourn.broker import EmbeddedServer
from sojourn.schemas.codec import to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.events import (
    ChildStarted,
    ErrorInfo,
    RunEvent,
    RunStarted,
    RunSuspended,
    StepCompleted,
    StepFailed,
    StepStarted,
    WaitCompleted,
)
from sojourn.schemas.wire import ChildOutcome
from tests.actors.agents.test_waits import WorkerProc, events_of, executions
from tests.apps import gathered
from tests.conftest import wait_for

# --- an in-memory driver -------------------------------------------------------------------


class _NoCount:
    def inc(self, amount: float = 1) -> None:
        return None


class MemoryDriver:
    """Stores decisions in a list, in the order appends would land (one at a time, pending
    events first, like ``Activation.commit``); children end when the test says so."""

    def __init__(self, machine: Machine) -> None:
        self.m = machine
        self.agent_name = self.metric_agent = "a"
        self.tool_calls = _NoCount()
        self.stored: list[RunEvent] = []
        self.lock = asyncio.Lock()
        self.published: list[str] = []
        self.ended: dict[str, ChildOutcome] = {}

    def time(self) -> float:
        return time.time()

    def check_live(self) -> None:
        return None

    def report(self, details: msgspec.Raw) -> None:
        return None

    def running(self, step: str | None) -> None:
        return None

    async def commit(self, events: list[RunEvent]) -> None:
        async with self.lock:
            taken, self.m.pending = self.m.pending, []
            await asyncio.sleep(0)  # an append takes a while
            self.stored.extend([*taken, *events])

    async def backoff(self, position: int, retry_at: float) -> None:
        await self.commit([])
        left = retry_at - time.time()
        if left > 1.0:
            raise Parked()
        await asyncio.sleep(max(left, 0))

    async def park(self, action: Park) -> None:
        await self.commit([action.event] if action.event is not None else [])

    async def reserve(self, limit: str) -> Grant:
        raise AssertionError("no step here takes a shared limit")

    async def await_slot(self, position: int, slot: float, park: bool) -> None:
        raise AssertionError("no step here takes a shared limit")

    async def block_limit(self, limit: str, seconds: float | None) -> None:
        raise AssertionError("no step here takes a shared limit")

    def charge_limit(self, limit: str, tokens: int) -> None:
        raise AssertionError("no step here takes a shared limit")

    async def suspend(self, event: RunSuspended) -> None:
        await self.commit([event])
        raise Parked()

    async def start_child(self, agent: str, body: bytes, child_id: str) -> None:
        await asyncio.sleep(0)
        self.published.append(child_id)

    async def child_outcome(self, child_id: str) -> ChildOutcome | None:
        await asyncio.sleep(0)
        return self.ended.get(child_id)

    def cancel_timer(self, position: int) -> None:
        return None

    async def rest(self) -> None:
        raise Parked()

    def finish(self, parked: bool = False) -> None:
        """The activation's end: what is still pending is stored with its end, unless the
        code parked (then, like ``Activation``, nothing more is written: parking stored it)."""
        if not parked:
            self.stored.extend(self.m.pending)
        self.m.pending = []


START = RunStarted(run_id="r", agent="a", input=to_raw(None))


def activation(history: list[RunEvent]) -> tuple[Context, MemoryDriver]:
    machine = Machine(fold([START, *history]))
    driver = MemoryDriver(machine)
    return Context(machine, driver), driver


Code = Callable[[Context], Awaitable[Any]]


async def activate(code: Code, history: list[RunEvent]) -> tuple[Any, list[RunEvent]]:
    """One activation of ``code`` over ``history``: what it returned (or raised), and the
    history afterwards."""
    ctx, driver = activation(history)
    try:
        out: Any = await code(ctx)
    except (Exception, Parked) as e:
        out = e
    driver.finish(parked=isinstance(out, Parked))
    return out, [*history, *driver.stored]


def positions(events: list[RunEvent]) -> dict[int, str]:
    """Each step's position and name, as its first ``StepStarted`` recorded it."""
    got: dict[int, str] = {}
    for e in events:
        if isinstance(e, StepStarted):
            got.setdefault(e.position, e.name)
    return got


def assert_folds(events: list[RunEvent]) -> None:
    state = fold([START, *events])
    assert state.anomalies == (), state.anomalies


# --- step functions whose completion order a test controls -----------------------------------

ran: Counter[str] = Counter()
gates: dict[int, asyncio.Event] = {}


async def gated(i: int) -> int:
    ran[f"gated-{i}"] += 1
    await gates[i].wait()
    return i * 10


async def released_in(order: list[int], stored: Callable[[], list[RunEvent]]) -> None:
    """Let the gated steps finish one at a time, in ``order``, each recorded before the next."""
    for i in order:
        gates[i].set()

        def recorded(i: int = i) -> bool:
            return any(
                isinstance(e, StepCompleted) and e.result == to_raw(i * 10) for e in stored()
            )

        # Yield until it is recorded: a generous deadline, not a count of loop turns (a loaded
        # machine may need many turns of other tasks first).
        deadline = asyncio.get_running_loop().time() + 30
        while not recorded() and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0)
        assert recorded(), f"step {i} never completed"


def gather_of(n: int, *, head: int = 1, **kw: Any) -> Code:
    """A step, then ``n`` gated steps gathered, then one more step."""

    async def code(ctx: Context) -> Any:
        before = [await ctx.step(gathered.first, k) for k in range(head)]
        got = await ctx.gather(*(ctx.step(gated, i) for i in range(n)), **kw)
        after = await ctx.step(gathered.second, 0)
        return [*before, got, after]

    return code


async def run_gated(code: Code, n: int, order: list[int]) -> tuple[Any, list[RunEvent]]:
    ctx, driver = activation([])
    for i in range(n):
        gates[i] = asyncio.Event()
    task = asyncio.ensure_future(code(ctx))
    await released_in(order, lambda: [*driver.stored, *driver.m.pending])
    out = await task
    driver.finish()
    return out, driver.stored


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_completion_order_gives_the_same_positions_and_results(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 8), label="branches")
    order = data.draw(st.permutations(list(range(n))), label="completion order")
    head = data.draw(st.integers(0, 2), label="steps before")
    ran.clear()
    out, events = asyncio.run(run_gated(gather_of(n, head=head), n, order))
    assert out == [*[k + 1 for k in range(head)], [i * 10 for i in range(n)], 2]
    want = {k: "first" for k in range(head)}
    want.update({head + i: "gated" for i in range(n)})
    want[head + n] = "second"
    assert positions(events) == want
    by_result = {
        e.position: e.result for e in events if isinstance(e, StepCompleted) and e.name == "gated"
    }
    assert by_result == {head + i: to_raw(i * 10) for i in range(n)}
    done_order = [e.position - head for e in events if isinstance(e, StepCompleted)][head:-1]
    assert done_order == order  # the completions really came in the order drawn
    assert_folds(events)
    # A replay returns the same without running anything.
    ran.clear()
    again, replayed = asyncio.run(activate(gather_of(n, head=head), events))
    assert again == out and replayed == events and not ran


@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_crash_at_any_point_of_a_gather_resumes_to_the_same_positions(
    data: st.DataObject,
) -> None:
    """Histories cut after any event (a SIGKILL) replay: completed branches return, started
    ones run again as attempt 2 in the same position, unstarted ones start."""
    n = data.draw(st.integers(1, 6), label="branches")
    order = data.draw(st.permutations(list(range(n))), label="completion order")
    ran.clear()
    full_out, full = asyncio.run(run_gated(gather_of(n), n, order))
    cut = data.draw(st.integers(0, len(full)), label="cut")
    for i in range(n):
        gates[i] = asyncio.Event()
        gates[i].set()
    out, events = asyncio.run(activate(gather_of(n), full[:cut]))
    assert out == full_out
    assert positions(events) == positions(full)
    assert_folds(events)
    for e in events[cut:]:
        if isinstance(e, StepStarted) and e.name == "gated":
            prior = [
                x for x in full[:cut] if isinstance(x, StepStarted) and x.position == e.position
            ]
            assert e.attempt == len(prior) + 1


def test_limit_bounds_how_many_run_at_once_and_keeps_argument_order() -> None:
    peak = 0
    live = 0

    async def counted(i: int) -> int:
        nonlocal peak, live
        live += 1
        peak = max(peak, live)
        await asyncio.sleep(0.01 * (5 - i % 5))
        live -= 1
        return i

    async def code(ctx: Context) -> Any:
        return await ctx.gather(*(ctx.step(counted, i) for i in range(12)), limit=3)

    out, events = asyncio.run(activate(code, []))
    assert out == list(range(12)) and peak == 3
    started = [e.position for e in events if isinstance(e, StepStarted)]
    assert started == list(range(12))
    assert_folds(events)


def test_a_failure_raises_after_the_others_settle_or_is_returned_in_place() -> None:
    async def broken(i: int) -> int:
        await asyncio.sleep(0.01 * i)
        raise TerminalError(f"no {i}")

    async def slow_ok(i: int) -> int:
        await asyncio.sleep(0.05)
        return i

    def code(return_exceptions: bool) -> Code:
        async def run(ctx: Context) -> Any:
            return await ctx.gather(
                ctx.step(slow_ok, 0),
                ctx.step(broken, 2),
                ctx.step(broken, 1),
                return_exceptions=return_exceptions,
            )

        return run

    out, events = asyncio.run(activate(code(False), []))
    assert isinstance(out, StepError) and "no 2" in str(out)  # the first in argument order
    assert sorted(e.position for e in events if isinstance(e, StepCompleted)) == [0]
    assert sorted(e.position for e in events if isinstance(e, StepFailed)) == [1, 2]
    out, events = asyncio.run(activate(code(True), []))
    assert out[0] == 0 and isinstance(out[1], StepError) and isinstance(out[2], StepError)
    assert "no 1" in str(out[2])
    again, _ = asyncio.run(activate(code(True), events))
    assert [str(x) for x in again] == [str(x) for x in out]


def test_a_branch_that_parks_lets_the_others_finish_and_records_them() -> None:
    """A long backoff parks one branch; the others' results are stored before the run parks,
    and the next activation runs none of them again."""
    calls: Counter[int] = Counter()

    @step(retry=RetryPolicy(retry_on=(RuntimeError,), attempts=2, initial_interval=30.0, jitter=0))
    async def flaky(i: int) -> int:
        calls[i] += 1
        if calls[i] == 1:
            raise RuntimeError("try later")
        return i

    async def steady(i: int) -> int:
        calls[i] += 1
        await asyncio.sleep(0.05)
        return i

    async def code(ctx: Context) -> Any:
        return await ctx.gather(ctx.step(steady, 0), ctx.step(flaky, 1), ctx.step(steady, 2))

    out, events = asyncio.run(activate(code, []))
    assert isinstance(out, Parked)
    assert sorted(e.position for e in events if isinstance(e, StepCompleted)) == [0, 2]
    failed = [e for e in events if isinstance(e, StepFailed)]
    assert [(e.position, e.retry_at is not None) for e in failed] == [(1, True)]
    assert_folds(events)
    # Once the retry is due: only the parked branch runs again.
    due = [
        msgspec.structs.replace(e, retry_at=time.time() - 1) if isinstance(e, StepFailed) else e
        for e in events
    ]
    out, events = asyncio.run(activate(code, due))
    assert out == [0, 1, 2] and calls == Counter({0: 1, 1: 2, 2: 1})
    assert_folds(events)


def test_a_branch_with_two_journaled_calls_is_refused_live_and_on_replay() -> None:
    async def code(ctx: Context) -> Any:
        async def both() -> int:
            a = await ctx.step(gathered.first, 1)
            return await ctx.step(gathered.second, a)

        return await ctx.gather(ctx.step(gathered.first, 0), both())

    out, events = asyncio.run(activate(code, []))
    assert isinstance(out, GatherError) and "second journaled call" in str(out)
    assert positions(events) == {0: "first", 1: "first"}  # the refused call took nothing
    assert_folds(events)
    again, replayed = asyncio.run(activate(code, events))
    assert isinstance(again, GatherError) and replayed == events


def test_what_a_branch_may_not_do() -> None:
    async def waits(ctx: Context) -> Any:
        async def nap() -> None:
            await ctx.sleep(10)

        return await ctx.gather(nap())

    async def late(ctx: Context) -> Any:
        async def later() -> int:
            await asyncio.sleep(0)
            return await ctx.step(gathered.first, 1)

        return await ctx.gather(later())

    async def nested(ctx: Context) -> Any:
        async def inner() -> Any:
            return await ctx.gather(ctx.step(gathered.first, 1))

        return await ctx.gather(inner())

    async def child_inside(ctx: Context) -> Any:
        async def kid() -> Any:
            return await ctx.child("gkid", 1)

        return await ctx.gather(kid())

    for code, says in (
        (waits, "may only run a step"),
        (late, "awaited something before"),
        (nested, "inside an argument of another"),
        (child_inside, "may only run a step"),
    ):
        out, events = asyncio.run(activate(code, []))
        assert isinstance(out, GatherError) and says in str(out), (code, out)
        assert events == [], events

    async def task(ctx: Context) -> Any:
        return await ctx.gather(asyncio.ensure_future(asyncio.sleep(0)))

    out, _ = asyncio.run(activate(task, []))
    assert isinstance(out, GatherError) and "not a task" in str(out)

    async def too_many(ctx: Context) -> Any:
        return await ctx.gather(*(ctx.step(gathered.first, i) for i in range(1001)))

    out, events = asyncio.run(activate(too_many, []))
    assert isinstance(out, ValueError) and "at most 1000" in str(out) and events == []

    async def bad_limit(ctx: Context) -> Any:
        return await ctx.gather(ctx.step(gathered.first, 1), limit=0)

    out, _ = asyncio.run(activate(bad_limit, []))
    assert isinstance(out, ValueError)


def test_children_start_first_then_steps_then_results_in_argument_order() -> None:
    async def code(ctx: Context) -> Any:
        return await ctx.gather(
            ctx.step(gathered.first, 1),
            ctx.child("gkid", 1, type=int),
            ctx.child("gkid", 2, type=int),
            ctx.step(gathered.second, 1),
            return_exceptions=True,
        )

    ctx, driver = activation([])
    with pytest.raises(Parked):
        asyncio.run(code(ctx))
    driver.finish(parked=True)
    first = driver.stored
    kids = ["r-c0", "r-c1"]
    assert driver.published == kids
    assert [(e.position, e.child_run_id) for e in first if isinstance(e, ChildStarted)] == [
        (0, kids[0]),
        (1, kids[1]),
    ]
    assert positions(first) == {2: "first", 3: "second"}
    assert_folds(first)
    # The second child ends first: the run still parks on the first, then takes both.
    ctx, driver = activation(first)
    driver.ended[kids[1]] = ChildOutcome(child_run_id=kids[1], status="completed", output=to_raw(4))
    with pytest.raises(Parked):
        asyncio.run(code(ctx))
    driver.finish(parked=True)
    second = [*first, *driver.stored]
    assert not driver.published
    ctx, driver = activation(second)
    driver.ended[kids[0]] = ChildOutcome(child_run_id=kids[0], status="failed", output=to_raw(None))
    driver.ended[kids[1]] = ChildOutcome(child_run_id=kids[1], status="completed", output=to_raw(4))
    out = asyncio.run(code(ctx))
    driver.finish()
    assert out[0] == 2 and out[2] == 4 and out[3] == 3
    assert type(out[1]).__name__ == "ChildRunError"
    done = [*second, *driver.stored]
    assert [e.position for e in done if isinstance(e, WaitCompleted)] == [4, 5]
    assert_folds(done)


def test_replay_without_an_event_loop_checks_a_gathered_history() -> None:
    """``sojourn replay`` drives the agent by hand: a gather's branches replay the same."""
    naps = gathered.Naps(seed=3, n=4, low=0.0, high=0.01)
    out, events = asyncio.run(activate(lambda c: gathered.gather_naps.call(c, naps), []))
    assert out == [0, 10, 20, 30, 990]
    history = [
        RunStarted(run_id="r", agent="gather_naps", input=to_raw(msgspec.to_builtins(naps))),
        *events,
    ]
    assert replay_run(gathered.gather_naps, history).ok
    assert replay_run(gathered.gather_naps, history[:4]).ok  # a frontier mid-gather
    swapped = [
        msgspec.structs.replace(e, name="other")
        if isinstance(e, StepStarted) and e.position == 2
        else e
        for e in history
    ]
    result = replay_run(gathered.gather_naps, swapped)
    assert not result.ok and "position 2" in result.describe()


def test_the_journal_asks_before_every_position() -> None:
    asked: list[str] = []
    j = Journal(fold([START]))
    j.claim = asked.append
    j.step("s")
    j.value("now")
    j.wait("sleep")
    j.child("k")
    j.patch("p")
    assert asked == ["step", "value", "wait", "child", "patch"] and j.position == 5

    def refuse(kind: str) -> None:
        raise GatherError(kind)

    j.claim = refuse
    with pytest.raises(GatherError):
        j.step("t")
    assert j.position == 5  # nothing taken


# --- end to end on a real nats-server --------------------------------------------------------


@pytest_asyncio.fixture
async def worker(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Worker]:
    agents: list[Agent[Any, Any]] = [
        gathered.gather_naps,
        gathered.gather_kids,
        gathered.gkid,
        gathered.gather_two_calls,
        gathered.gather_backoff,
    ]
    async with Worker(agents, nats=nats_server.url, settings=settings) as w:
        yield w


async def test_gathered_steps_overlap_and_replay(worker: Worker, client: Client) -> None:
    naps = gathered.Naps(seed=13, n=5, low=0.2, high=1.0)
    run_id = await client.start("gather_naps", naps, run_id="naps-1", wait=True)
    assert await client.result(run_id, timeout=60) == [0, 10, 20, 30, 40, 990]
    events = await events_of(client, run_id)
    starts = {e.position: e for e in events if isinstance(e, StepStarted)}
    ends = {e.position: e for e in events if isinstance(e, StepCompleted)}
    assert {p: e.name for p, e in starts.items()} == {p: "nap" for p in range(6)}
    assert {p: e.result for p, e in ends.items()} == {
        p: to_raw(r) for p, r in enumerate([0, 10, 20, 30, 40, 990])
    }
    # Every gathered step started before any of them ended: they all ran at once.
    assert max(starts[p].at for p in range(5)) < min(ends[p].at for p in range(5))
    spans = sum(ends[p].at - starts[p].at for p in range(5))
    together = max(ends[p].at for p in range(5)) - min(starts[p].at for p in range(5))
    assert together < spans / 2, (together, spans)
    assert starts[5].at >= max(ends[p].at for p in range(5))
    assert fold(events).anomalies == ()
    assert replay_run(gathered.gather_naps, events).ok


async def test_gathered_children_return_their_outputs_and_a_failure(
    worker: Worker, client: Client
) -> None:
    run_id = await client.start("gather_kids", gathered.Kids(inputs=[1, 2, 3]), run_id="gk-1")
    assert await client.result(run_id, timeout=60) == [2, 4, 6, 14, 200]
    events = await events_of(client, run_id)
    assert [e.child_run_id for e in events if isinstance(e, ChildStarted)] == [
        f"gk-1-c{p}" for p in range(4)
    ]
    assert fold(events).anomalies == ()
    assert replay_run(gathered.gather_kids, events).ok

    kids = gathered.Kids(inputs=[1, -2, 3], return_exceptions=True)
    run_id = await client.start("gather_kids", kids, run_id="gk-2")
    out = await client.result(run_id, timeout=60)
    assert out[0] == 2 and out[2] == 6 and out[3:] == [14, 200]
    assert "ChildRunError" in out[1] and "gkid refuses -2" in out[1]

    run_id = await client.start("gather_kids", gathered.Kids(inputs=[1, -2, -3]), run_id="gk-3")
    with pytest.raises(RunFailedError, match="ChildRunError") as info:
        await client.result(run_id, timeout=60)
    assert info.value.error is not None and "gk-3-c2" in info.value.error.message  # -2's child
    # Every child was waited for before the failure was raised.
    st3 = await client.state(run_id)
    waits = [op for op in st3.ops if op.kind == "wait"]
    assert len(waits) == 4 and all(op.status == "completed" for op in waits)


async def test_two_journaled_calls_in_a_branch_fail_the_run_clearly(
    worker: Worker, client: Client
) -> None:
    run_id = await client.start("gather_two_calls", None, run_id="two-1")
    with pytest.raises(RunFailedError, match="GatherError") as info:
        await client.result(run_id, timeout=30)
    assert info.value.error is not None
    assert "second journaled call" in info.value.error.message
    events = await events_of(client, run_id)
    assert positions(events) == {0: "first", 1: "first"}


async def test_a_branch_parked_on_a_long_backoff_lets_the_others_finish_once(
    worker: Worker, client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "steps.log"
    monkeypatch.setenv("SOJOURN_TEST_LOG", str(log))
    run_id = await client.start("gather_backoff", None, run_id="back-1")
    assert await client.result(run_id, timeout=60) == [0, 10, 20]
    events = await events_of(client, run_id)
    failed = [e for e in events if isinstance(e, StepFailed)]
    assert [(e.position, e.retry_at is not None) for e in failed] == [(1, True)]
    parked_at = next(i for i, e in enumerate(events) if isinstance(e, StepFailed))
    done = {e.position: i for i, e in enumerate(events) if isinstance(e, StepCompleted)}
    # The naps ended (and were stored) in the activation that parked, before the retry.
    retry = next(i for i, e in enumerate(events) if isinstance(e, StepStarted) and e.attempt == 2)
    assert done[0] < retry and done[2] < retry and parked_at < retry
    assert fold(events).anomalies == ()
    execs = Counter(key for ev, _, key, _ in executions(log) if ev == "exec")
    assert execs == Counter({f"{run_id}/0": 1, f"{run_id}/1": 2, f"{run_id}/2": 1}), execs


async def test_a_worker_sigkilled_mid_gather_resumes_without_repeating_completed_steps(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> None:
    log = tmp_path / "steps.log"
    url, prefix = nats_server.url, settings.prefix
    naps = gathered.Naps(seed=5, n=5, low=0.5, high=6.0)
    want = [0, 10, 20, 30, 40, 990]
    procs: list[WorkerProc] = [
        WorkerProc(url, prefix, tmp_path, "w1", log=log, module="tests.apps.gathered")
    ]
    try:
        await procs[0].ready()
        run_id = await client.start("gather_naps", naps, run_id="kill-1", wait=True)

        async def some_recorded() -> bool:
            done = [e for e in await events_of(client, run_id) if isinstance(e, StepCompleted)]
            return len(done) >= 2

        await wait_for(some_recorded, timeout=60, what="two gathered steps to be recorded")
        procs[0].kill()
        before = await events_of(client, run_id)
        completed = {e.position for e in before if isinstance(e, StepCompleted)}
        assert 2 <= len(completed) < 5, completed  # killed while the others still ran
        procs.append(WorkerProc(url, prefix, tmp_path, "w2", log=log, module="tests.apps.gathered"))
        await procs[1].ready()
        assert await client.result(run_id, timeout=120) == want
    finally:
        for proc in procs:
            proc.stop()
    events = await events_of(client, run_id)
    assert positions(events) == {p: "nap" for p in range(6)}
    assert fold(events).anomalies == ()
    execs = Counter(key for ev, _, key, _ in executions(log) if ev == "exec")
    for p in range(6):
        expected = 1 if p in completed or p == 5 else 2
        assert execs[f"{run_id}/{p}"] == expected, (p, execs, completed)
    assert replay_run(gathered.gather_naps, events).ok


@st.composite
def concurrent_histories(draw: st.DrawFn) -> tuple[list[RunEvent], dict[int, tuple[str, int]]]:
    """Steps opened in position order (as a gather stores them), each then failing with a retry
    some times and ending (completed, failed, or left in doubt), the steps' events interleaved
    at random. Returns the events and each position's expected (status, attempts)."""
    n = draw(st.integers(1, 8))
    lives: list[list[RunEvent]] = []
    want: dict[int, tuple[str, int]] = {}
    for p in range(n):
        name = f"s{p}"
        retries = draw(st.integers(0, 2))
        life: list[RunEvent] = []
        for a in range(1, retries + 1):
            life.append(StepStarted(position=p, name=name, attempt=a))
            life.append(
                StepFailed(
                    position=p,
                    name=name,
                    attempt=a,
                    error=ErrorInfo(type="E", message="e"),
                    retry_at=1.0,
                )
            )
        a = retries + 1
        life.append(StepStarted(position=p, name=name, attempt=a))
        end = draw(st.sampled_from(["completed", "failed", "started"]))
        if end == "completed":
            life.append(StepCompleted(position=p, name=name, attempt=a, result=to_raw(p)))
        elif end == "failed":
            life.append(
                StepFailed(position=p, name=name, attempt=a, error=ErrorInfo(type="E", message="e"))
            )
        lives.append(life)
        want[p] = (end, a)
    # A random merge of the steps' own sequences, in which step p opens only after step p-1.
    events: list[RunEvent] = []
    taken = [0] * n
    while any(taken[k] < len(lives[k]) for k in range(n)):
        ready = [
            k
            for k in range(n)
            if taken[k] < len(lives[k]) and (taken[k] > 0 or k == 0 or taken[k - 1] > 0)
        ]
        k = draw(st.sampled_from(ready))
        events.append(lives[k][taken[k]])
        taken[k] += 1
    return events, want


@hsettings(max_examples=200, deadline=None)
@given(concurrent_histories())
def test_interleaved_open_steps_fold_without_anomalies(
    case: tuple[list[RunEvent], dict[int, tuple[str, int]]],
) -> None:
    events, want = case
    state = fold([START, *events])
    assert state.anomalies == ()
    assert {op.position: (op.status, op.attempts) for op in state.ops} == want
    # And a step opened out of position order is still an anomaly.
    opens = [i for i, e in enumerate(events) if isinstance(e, StepStarted) and e.attempt == 1]
    if len(opens) > 1:
        swapped = list(events)
        swapped[opens[0]], swapped[opens[1]] = swapped[opens[1]], swapped[opens[0]]
        assert fold([START, *swapped]).anomalies != ()
