"""Child runs on a real nats-server: results, failures, rejections, cancel cascade, crashes."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio

from sojourn.actors import (
    Agent,
    ChildRunError,
    Client,
    Context,
    RunCancelledError,
    RunFailedError,
    Worker,
    agent,
)
from sojourn.broker import Delivery, EmbeddedServer
from sojourn.schemas import (
    ChildStarted,
    RunCancelled,
    RunStarted,
    SignalReceived,
    WaitCompleted,
    decode_dead_letter,
)
from sojourn.schemas.config import Settings
from tests.actors.agents.test_waits import (
    WorkerProc,
    dead_letter,
    events_of,
    executions,
    is_waiting,
    stored_timer,
    until_state,
)
from tests.conftest import wait_for


def double(x: int) -> int:
    return 2 * x


@agent("kid")
async def kid(ctx: Context, x: int) -> int:
    return await ctx.step(double, x)


@agent("parent")
async def parent(ctx: Context, x: int) -> int:
    result: int = await ctx.child("kid", x, type=int)
    return result


@agent("fanout")
async def fanout(ctx: Context, n: int) -> list[int]:
    handles = [await ctx.start_child(kid, i) for i in range(n)]
    return [await h.result(type=int) for h in handles]


@agent("failing_kid")
async def failing_kid(ctx: Context, x: int) -> int:
    raise ValueError(f"kid broke on {x}")


class Ask(msgspec.Struct, frozen=True):
    agent: str
    input: Any = None


@agent("careful")
async def careful(ctx: Context, ask: Ask) -> dict[str, Any]:
    try:
        out = await ctx.child(ask.agent, ask.input)
    except ChildRunError as e:
        return {"status": e.status, "child": e.child_run_id, "message": str(e)}
    return {"status": "completed", "output": out}


@agent("careless")
async def careless(ctx: Context, x: int) -> int:
    result: int = await ctx.child("failing_kid", x, type=int)
    return result


@agent("sleepy_kid")
async def sleepy_kid(ctx: Context, _: None) -> str:
    await ctx.sleep(120)
    return "rested"


@agent("middle")
async def middle(ctx: Context, _: None) -> str:
    result: str = await ctx.child("sleepy_kid", None, type=str)
    return result


@agent("grandparent")
async def grandparent(ctx: Context, _: None) -> str:
    result: str = await ctx.child("middle", None, type=str)
    return result


changed_code: set[str] = set()
"""Run ids whose agent code "changed" since their last activation (to provoke a replay error)."""


def before_deploy() -> str:
    return "old"


def after_deploy() -> str:
    return "new"


@agent("fickle_kid")
async def fickle_kid(ctx: Context, _: None) -> Any:
    await ctx.step(after_deploy if ctx.run_id in changed_code else before_deploy)
    return await ctx.wait_for("go")


AGENTS: list[Agent[Any, Any]] = [
    kid,
    parent,
    fanout,
    failing_kid,
    careful,
    careless,
    sleepy_kid,
    middle,
    grandparent,
    fickle_kid,
]


@pytest_asyncio.fixture
async def worker(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Worker]:
    async with Worker(AGENTS, nats=nats_server.url, settings=settings) as w:
        yield w


async def test_child_result_reaches_the_parent(worker: Worker, client: Client) -> None:
    run_id = await client.start("parent", 21, run_id="fam-1", wait=True)
    assert await client.result(run_id, timeout=30) == 42
    child_id = "fam-1-c0"
    assert await client.result(child_id, timeout=30) == 42
    child_events = await events_of(client, child_id)
    first = child_events[0]
    assert isinstance(first, RunStarted) and first.parent_run_id == run_id
    assert first.agent == "kid"
    events = await events_of(client, run_id)
    started = [e for e in events if isinstance(e, ChildStarted)]
    assert [(e.position, e.child_run_id, e.agent) for e in started] == [(0, child_id, "kid")]
    done = [e for e in events if isinstance(e, WaitCompleted)]
    assert [(e.position, e.key) for e in done] == [(1, f"child:{child_id}")]
    assert (await client.state(run_id)).children == (child_id,)


async def test_handles_start_several_children_and_await_them_all(
    worker: Worker, client: Client
) -> None:
    run_id = await client.start("fanout", 4, run_id="fan-1", wait=True)
    assert await client.result(run_id, timeout=30) == [0, 2, 4, 6]
    kids = [f"fan-1-c{i}" for i in range(4)]
    assert (await client.state(run_id)).children == tuple(kids)
    for i, child_id in enumerate(kids):
        assert await client.result(child_id, timeout=30) == 2 * i
        starts = [e for e in await events_of(client, child_id) if isinstance(e, RunStarted)]
        assert len(starts) == 1 and starts[0].parent_run_id == run_id


async def test_failed_child_raises_child_run_error_in_the_parent(
    worker: Worker, client: Client
) -> None:
    caught = await client.start("careful", Ask(agent="failing_kid", input=3), run_id="fail-1")
    out = await client.result(caught, timeout=30)
    assert out["status"] == "failed" and out["child"] == "fail-1-c0", out
    assert "ValueError: kid broke on 3" in out["message"], out
    assert (await client.state("fail-1-c0")).status == "failed"

    uncaught = await client.start("careless", 5, run_id="fail-2", wait=True)
    with pytest.raises(RunFailedError, match="ChildRunError") as info:
        await client.result(uncaught, timeout=30)
    assert info.value.error is not None
    assert "fail-2-c0" in info.value.error.message
    assert "kid broke on 5" in info.value.error.message


async def test_rejected_child_raises_child_run_error_with_status_rejected(
    worker: Worker, client: Client
) -> None:
    bad_input = await client.start(
        "careful", Ask(agent="kid", input="not a number"), run_id="rej-1"
    )
    out = await client.result(bad_input, timeout=30)
    assert out["status"] == "rejected" and out["child"] == "rej-1-c0", out
    assert "invalid_input" in out["message"], out
    assert await client.store.last_seq("rej-1-c0") == 0  # the child was never created
    record = await dead_letter(client, "start")
    assert record.code == "invalid_input"

    no_agent = await client.start("careful", Ask(agent="nosuch", input=1), run_id="rej-2")
    out = await client.result(no_agent, timeout=30)
    assert out["status"] == "rejected" and "unknown_agent" in out["message"], out


async def test_cancelling_a_parent_cancels_its_children_and_theirs(
    worker: Worker, client: Client
) -> None:
    run_id = await client.start("grandparent", None, run_id="gp", wait=True)
    mid, leaf = "gp-c0", "gp-c0-c0"
    st = await until_state(client, run_id, is_waiting, what="the parent's wait")
    assert st.waiting_on == (f"signal:sojourn-child.{mid}", f"run:{mid}")
    await until_state(client, mid, is_waiting, what="the child's wait")
    leaf_state = await until_state(client, leaf, is_waiting, what="the grandchild's sleep")
    assert leaf_state.waiting_on == ("timer",)
    assert await stored_timer(client, leaf, 0) is not None

    await client.cancel(run_id, "no longer needed")
    with pytest.raises(RunCancelledError, match="no longer needed"):
        await client.result(run_id, timeout=30)
    for child_id in (mid, leaf):
        with pytest.raises(RunCancelledError):
            await client.result(child_id, timeout=30)
        assert await client.status(child_id) == "cancelled"
    cancelled = [e for e in await events_of(client, leaf) if isinstance(e, RunCancelled)]
    assert len(cancelled) == 1 and mid in cancelled[0].reason
    assert await client.status(run_id) == "cancelled"

    async def timer_gone() -> bool:
        return await stored_timer(client, leaf, 0) is None

    await wait_for(timer_gone, timeout=10, what="the grandchild's timer to be removed")


async def test_parent_replayed_after_sigkills_starts_its_child_once(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> None:
    log = tmp_path / "steps.log"
    url, prefix = nats_server.url, settings.prefix
    parent_id, child_id = "guard", "guard-c0"
    starts: list[bytes] = []

    async def on_start(msg: Delivery) -> None:
        starts.append(msg.data)

    # Every publish of a start for the child's agent, deduplicated by the broker or not.
    sub = await client.broker.subscribe(client.names.spawn("gated_kid", "*"), cb=on_start)
    procs: list[WorkerProc] = []
    try:
        procs.append(WorkerProc(url, prefix, tmp_path, "w1", log=log, slow=3.0))
        await procs[-1].ready()
        await client.start("guardian", 7, run_id=parent_id, wait=True)

        async def slow_running() -> bool:
            return any(r[:2] == ("exec", "slow") for r in executions(log))

        await wait_for(slow_running, what="the parent's slow step to start")
        procs[-1].kill()  # mid-step, after the child was started

        procs.append(WorkerProc(url, prefix, tmp_path, "w2", log=log, slow=0.2))
        await procs[-1].ready()
        st = await until_state(
            client,
            parent_id,
            lambda s: s.status == "waiting" and s.waiting_on[-1:] == (f"run:{child_id}",),
            what="the replayed parent to wait for its child",
        )
        assert st.waiting_on == (f"signal:sojourn-child.{child_id}", f"run:{child_id}")
        await until_state(client, child_id, is_waiting, what="the child's wait")
        procs[-1].kill()  # while the parent waits on its child

        procs.append(WorkerProc(url, prefix, tmp_path, "w3", log=log, slow=0.2))
        await procs[-1].ready()
        await client.signal(child_id, "go", 6)
        assert await client.result(parent_id, timeout=60) == 42
    finally:
        await sub.unsubscribe()
        for p in procs:
            p.stop()

    assert len(starts) == 1, starts  # the replays never published the child's start again
    child_starts = [e for e in await events_of(client, child_id) if isinstance(e, RunStarted)]
    assert len(child_starts) == 1 and child_starts[0].parent_run_id == parent_id
    parent_events = await events_of(client, parent_id)
    assert [e.child_run_id for e in parent_events if isinstance(e, ChildStarted)] == [child_id]
    assert (await client.state(parent_id)).children == (child_id,)
    for other in ("guard-c1", "guard-c2", "guard-c3"):
        assert await client.store.last_seq(other) == 0
    execs = Counter((name, key) for ev, name, key, _ in executions(log) if ev == "exec")
    assert execs[("slow", "guard/1")] == 2  # in doubt after the first kill: ran again
    assert execs[("times", "guard-c0/1")] == 1


async def test_parent_with_a_long_run_id_learns_its_childs_fate(
    worker: Worker, client: Client
) -> None:
    """Run ids may have 128 characters; the child's id ``<parent>-c0`` is then longer."""
    run_id = "p" * 126
    await client.start("careful", Ask(agent="kid", input=1), run_id=run_id, wait=True)
    try:
        out = await client.result(run_id, timeout=10)
    except RunFailedError:
        return  # failing the parent with a clear error is an acceptable answer too
    assert out["status"] in ("completed", "rejected"), out


async def test_suspended_child_is_not_reported_as_ended(worker: Worker, client: Client) -> None:
    """A suspended run has not ended (a human may resume it); its parent must keep waiting
    and, once the child is resumed and completes, get its real result."""
    run_id = await client.start("careful", Ask(agent="fickle_kid"), run_id="susp-1", wait=True)
    child_id = "susp-1-c0"
    await until_state(client, child_id, is_waiting, what="the child's wait")
    await until_state(client, run_id, is_waiting, what="the parent's wait")
    changed_code.add(child_id)  # a deploy changed the child's code
    worker.sticky.drop(child_id)  # a deploy is a new process: nothing of the old code is kept
    await client.signal(child_id, "go", 1)
    await until_state(client, child_id, lambda s: s.status == "suspended", what="suspension")

    async def child_rested() -> bool:
        return child_id not in worker._active  # its activation (and its end's side jobs) done

    await wait_for(child_rested, what="the child's activation to finish")
    # A marker signal queued behind anything the child's activation sent the parent.
    await client.signal(run_id, "marker", 1, signal_id="marker-1")

    async def settled() -> bool:
        st = await client.state(run_id)
        return st.terminal or any(s.signal_id == "marker-1" for s in st.signals)

    await wait_for(settled, what="the marker to reach the parent")
    st = await client.state(run_id)
    assert st.status == "waiting", (st.status, st.output and bytes(st.output))
    received = [e for e in await events_of(client, run_id) if isinstance(e, SignalReceived)]
    assert [e.name for e in received] == ["marker"]
    # The fix is deployed and the child resumed: it takes its buffered "go" and completes,
    # and the parent gets the child's real result.
    changed_code.discard(child_id)
    await client.resume(child_id, "fixed", by="ops")
    assert await client.result(child_id, timeout=30) == 1
    assert await client.result(run_id, timeout=30) == {"status": "completed", "output": 1}


async def test_cancel_cascade_reaches_a_child_whose_start_is_still_queued(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    """The child's agent is served by another pool that is down when the parent is cancelled."""
    url = nats_server.url
    async with Worker([kid], nats=url, settings=settings):
        pass  # the kid pool has served "kid" once: the deployment knows the agent
    async with Worker([parent], nats=url, settings=settings):
        run_id = await client.start("parent", 4, run_id="orphan", wait=True)
        child_id = "orphan-c0"
        await until_state(client, run_id, is_waiting, what="the parent's wait for its child")
        assert await client.store.last_seq(child_id) == 0  # queued: no kid worker is up
        await client.cancel(run_id, "stop everything")
        with pytest.raises(RunCancelledError):
            await client.result(run_id, timeout=30)
        # The kid pool stays down until the intake has given up on the cascade's cancel for
        # the child (dead-lettered as an unknown run), or 8 s at most.
        names = client.names
        give_up = time.monotonic() + 8.0

        async def outage_over() -> bool:
            m = await client.broker.direct_get_last(names.dlq_stream, names.dlq("cancel"))
            if m is not None and decode_dead_letter(m.data).subject == names.cancel(child_id):
                return True
            return time.monotonic() >= give_up

        await wait_for(outage_over, timeout=20, interval=0.1, what="the outage to end")
    async with Worker([kid], nats=url, settings=settings):
        await intake_idle(client)  # the queued start (and anything else) has been handled

        async def settled() -> bool:
            return await client.store.last_seq(child_id) == 0 or (
                (await client.state(child_id)).terminal
            )

        await wait_for(settled, what="the child to be refused or to end")
    if await client.store.last_seq(child_id) > 0:
        assert await client.status(child_id) == "cancelled"  # not run to completion, orphaned


async def intake_idle(client: Client) -> None:
    """Wait until the intake consumer has nothing pending or unacknowledged."""
    names = client.names

    async def idle() -> bool:
        info = await client.broker.api(
            f"$JS.API.CONSUMER.INFO.{names.inbox_stream}.{names.intake_consumer}"
        )
        pending: int = info["num_pending"]
        unacked: int = info["num_ack_pending"]
        return pending == 0 and unacked == 0

    await wait_for(idle, timeout=30, interval=0.1, what="the intake to drain")
