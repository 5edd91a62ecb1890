"""Oversized data fails visibly, on a real nats-server (max_payload 8 MiB).

- A step result over ``Settings.max_value`` (2 MiB, and 9 MiB: over the server's limit too)
  fails the step with ``PayloadTooLarge`` recorded in history, not retried; the agent sees a
  ``StepError`` it may catch; the step never runs again on replay.
- A run output over the limit fails the run; a child with such an output fails, and its
  parent gets ``ChildRunError`` instead of waiting forever.
- Values of exactly the limit pass, also through a parent reading its child's last event.
- A decision larger than one message (buffered signal payloads) is split, in order.
- An append the broker refuses (a healthy JetStream answering with an error) is not
  swallowed: nothing more is written, the run is retried from its last recorded event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio

from sojourn.actors import Agent, Client, RunFailedError, Worker
from sojourn.actors.core.state import fold
from sojourn.actors.core.steps import error_info
from sojourn.actors.worker.activation import Activation
from sojourn.actors.worker.children import child_outcome, outcome_of
from sojourn.broker import EmbeddedServer
from sojourn.broker.topology import ensure_topology, stream_configs
from sojourn.schemas import (
    ChildStarted,
    ErrorInfo,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunStarted,
    StepCompleted,
    StepFailed,
    StepStarted,
    WaitCompleted,
    encode,
    encode_events,
    from_raw,
    to_raw,
)
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import RunNotFound
from sojourn.schemas.wire import ChildOutcome
from tests.apps.payloads import (
    GATE,
    ParentSpec,
    Spec,
    blob,
    blob_output,
    blob_parent,
    blob_step,
    blob_step_retrying,
    executions,
    gated,
    many_signals,
)
from tests.conftest import wait_for

MiB = 1024 * 1024
LIMIT = Settings().max_value


async def events_of(client: Client, run_id: str) -> list[RunEvent]:
    return [e for d in await client.history(run_id) for e in d.events]


def assert_no_silent_steps(events: list[RunEvent]) -> None:
    """A run that ended shows every step it started completed or failed for good."""
    if not any(isinstance(e, (RunCompleted, RunFailed)) for e in events):
        return
    started = {e.position for e in events if isinstance(e, StepStarted)}
    ended = {e.position for e in events if isinstance(e, StepCompleted)} | {
        e.position for e in events if isinstance(e, StepFailed) and e.retry_at is None
    }
    assert started <= ended, f"steps started but never ended: {sorted(started - ended)}"


def assert_too_large(failed: StepFailed | RunFailed, size: int) -> None:
    assert failed.error.type == "PayloadTooLarge"
    assert f"is {size} bytes" in failed.error.message
    assert f"limit for one stored value is {LIMIT} bytes" in failed.error.message


@pytest_asyncio.fixture
async def worker(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Worker]:
    agents: list[Agent[Any, Any]] = [
        blob_step,
        blob_step_retrying,
        blob_output,
        blob_parent,
        many_signals,
        gated,
    ]
    async with Worker(agents, nats=nats_server.url, settings=settings) as w:
        yield w


@pytest.mark.parametrize("size", [9 * MiB, 2 * MiB], ids=["9MiB", "2MiB"])
async def test_too_large_step_result_fails_the_step_and_the_run(
    worker: Worker, client: Client, tmp_path: Path, size: int
) -> None:
    log = str(tmp_path / "executions")
    # The pause lets a completion be flushed alone: the flush that used to drop it silently.
    run_id = await client.start("blob_step", Spec(size=size, log=log, pause=0.2), wait=True)
    with pytest.raises(RunFailedError) as info:
        await client.result(run_id, timeout=30)
    assert info.value.error is not None and info.value.error.type == "StepError"
    assert "PayloadTooLarge" in info.value.error.message
    events = await events_of(client, run_id)
    assert [type(e).__name__ for e in events] == [
        "RunStarted",
        "StepStarted",
        "StepFailed",
        "RunFailed",
    ]
    failed = events[2]
    assert isinstance(failed, StepFailed) and failed.retry_at is None
    assert_too_large(failed, size)
    assert_no_silent_steps(events)
    assert executions(log) == 1


@pytest.mark.parametrize("size", [9 * MiB, 2 * MiB], ids=["9MiB", "2MiB"])
async def test_caught_too_large_step_result_is_the_same_error_on_replay(
    worker: Worker, client: Client, tmp_path: Path, size: int
) -> None:
    log = str(tmp_path / "executions")
    run_id = await client.start("blob_step", Spec(size=size, log=log, catch=True), wait=True)

    async def waiting() -> bool:
        return await client.status(run_id) == "waiting"

    await wait_for(waiting, what="the run to wait for 'go' after catching the StepError")
    await client.signal(run_id, "go")  # wakes it: the code replays from the top
    out: dict[str, Any] = await client.result(run_id, timeout=30)
    events = await events_of(client, run_id)
    failed = [e for e in events if isinstance(e, StepFailed)]
    assert len(failed) == 1 and failed[0].retry_at is None
    assert_too_large(failed[0], size)
    # The code that returned ran in the replaying activation: the replay raised it.
    assert out["error_type"] == "PayloadTooLarge"
    expected = "step 'make_blob' failed after 1 attempt(s): PayloadTooLarge: "
    assert out["message"] == expected + failed[0].error.message
    assert len([e for e in events if isinstance(e, StepStarted)]) == 1
    assert isinstance(events[-1], RunCompleted)
    assert_no_silent_steps(events)
    assert executions(log) == 1


async def test_too_large_result_is_not_retried_whatever_the_policy(
    worker: Worker, client: Client, tmp_path: Path
) -> None:
    log = str(tmp_path / "executions")
    run_id = await client.start("blob_step_retrying", Spec(size=2 * MiB, log=log), wait=True)
    with pytest.raises(RunFailedError):
        await client.result(run_id, timeout=30)
    events = await events_of(client, run_id)
    failed = [e for e in events if isinstance(e, StepFailed)]
    assert len(failed) == 1 and failed[0].retry_at is None
    assert executions(log) == 1


async def test_values_of_exactly_the_limit_pass(
    worker: Worker, client: Client, tmp_path: Path
) -> None:
    log = str(tmp_path / "executions")
    step_run = await client.start("blob_step", Spec(size=LIMIT, log=log), wait=True)
    assert await client.result(step_run, timeout=30) == {"length": LIMIT - 2}
    done = [e for e in await events_of(client, step_run) if isinstance(e, StepCompleted)]
    # A value this large is stored by reference (Settings.value_inline_max): its size counts.
    ref = done[0].result_ref if len(done) == 1 else None
    assert ref is not None and ref.size == LIMIT and bytes(done[0].result) == b"null"

    output_run = await client.start("blob_output", LIMIT, wait=True)
    assert len(await client.result(output_run, timeout=30)) == LIMIT - 2

    over = await client.start("blob_step", Spec(size=LIMIT + 1, log=log), wait=True)
    with pytest.raises(RunFailedError):
        await client.result(over, timeout=30)


async def test_too_large_run_output_fails_the_run(worker: Worker, client: Client) -> None:
    run_id = await client.start("blob_output", 2 * MiB, wait=True)
    with pytest.raises(RunFailedError) as info:
        await client.result(run_id, timeout=30)
    assert info.value.error is not None and info.value.error.type == "PayloadTooLarge"
    events = await events_of(client, run_id)
    assert not any(isinstance(e, RunCompleted) for e in events)
    last = events[-1]
    assert isinstance(last, RunFailed)
    assert_too_large(last, 2 * MiB)


async def test_parent_of_a_child_with_too_large_output_does_not_wait_forever(
    worker: Worker, client: Client
) -> None:
    run_id = await client.start("blob_parent", ParentSpec(size=2 * MiB), wait=True)
    out = await client.result(run_id, timeout=30)
    assert out["status"] == "failed"
    assert "PayloadTooLarge" in out["message"]
    child = f"{run_id}-c0"
    child_end = (await events_of(client, child))[-1]
    assert isinstance(child_end, RunFailed) and child_end.error.type == "PayloadTooLarge"


async def test_child_output_of_exactly_the_limit_reaches_its_parent(
    worker: Worker, client: Client
) -> None:
    """The child has ended when the parent evaluates its wait: the parent takes the outcome
    from the end notice or from the child's last event, whichever it finds first."""
    run_id = await client.start("blob_parent", ParentSpec(size=LIMIT, gate=True), wait=True)
    child = f"{run_id}-c0"

    async def child_done() -> bool:
        try:
            return await client.status(child) == "completed"
        except RunNotFound:
            return False  # its trigger is still on its way

    await wait_for(child_done, what="the child to complete")
    await client.signal(run_id, "go")
    assert await client.result(run_id, timeout=30) == {"status": "completed", "length": LIMIT - 2}
    waits = [e for e in await events_of(client, run_id) if isinstance(e, WaitCompleted)]
    child_wait = [w for w in waits if w.key == f"child:{child}"]
    assert len(child_wait) == 1
    outcome = msgspec.json.decode(bytes(child_wait[0].payload), type=ChildOutcome)
    assert outcome.status == "completed" and len(outcome.output) == LIMIT


async def test_parent_reads_a_limit_sized_output_from_its_childs_last_event(
    client: Client, settings: Settings
) -> None:
    """No end notice at all: the parent's wait finds the child's end in its history."""
    store = client.store
    await ensure_topology(client.broker, client.names, settings)
    parent, child = "reader", "reader-c0"
    output = to_raw(blob(LIMIT))
    await store.append(
        child,
        [
            RunStarted(
                run_id=child, agent="blob_output", input=to_raw(LIMIT), parent_run_id=parent
            ),
            RunCompleted(output=output),
        ],
        expected_seq=0,
        writer="test",
    )
    spec = to_raw(ParentSpec(size=LIMIT))
    started = ChildStarted(position=0, child_run_id=child, agent="blob_output")
    seq = await store.append(
        parent,
        [RunStarted(run_id=parent, agent="blob_parent", input=spec), started],
        expected_seq=0,
        writer="test",
    )
    found = await child_outcome(store, child)
    assert found is not None and found.output == output
    # ``Activation`` takes ``Agent[object, object]``; the worker passes its ``Agent[Any, Any]``.
    any_parent: Agent[Any, Any] = blob_parent
    act = Activation(
        agent=any_parent,
        run_id=parent,
        store=store,
        history=await store.load(parent),
        writer="reader-activation",
    )
    assert await act.run() == "completed"
    events = [e for d in await store.load(parent, after_seq=seq) for e in d.events]
    assert [type(e).__name__ for e in events] == ["WaitCompleted", "RunCompleted"]
    wait = events[0]
    assert isinstance(wait, WaitCompleted) and wait.outcome == "child"
    outcome = msgspec.json.decode(bytes(wait.payload), type=ChildOutcome)
    assert outcome.output == output
    assert from_raw(events[1].output) == {"status": "completed", "length": LIMIT - 2}  # type: ignore[union-attr]


async def test_a_decision_larger_than_one_message_is_split_in_order(
    worker: Worker, client: Client
) -> None:
    n, size = 9, 1_000_000  # nine buffered wait outcomes of ~1 MB: one decision of ~9 MB
    run_id = await client.start("many_signals", n, wait=True)
    for i in range(n):
        await client.signal(run_id, "data", chr(ord("a") + i) * size)
    await client.signal(run_id, "go")
    assert await client.result(run_id, timeout=60) == n * size
    history = await client.history(run_id)
    limit = client.broker.max_payload
    assert all(len(encode_events(d.events)) <= limit for d in history)
    carrying = [d for d in history if any(isinstance(e, WaitCompleted) for e in d.events)]
    assert len(carrying) >= 2
    events = [e for d in history for e in d.events]
    waits = [e for e in events if isinstance(e, WaitCompleted)]
    assert [w.position for w in waits] == list(range(n + 1))
    payloads = [msgspec.json.decode(bytes(w.payload)) for w in waits[1:]]
    assert [p[0] for p in payloads] == [chr(ord("a") + i) for i in range(n)]
    kinds = [type(e).__name__ for e in events]
    assert kinds[-3:] == ["StepStarted", "StepCompleted", "RunCompleted"]


async def test_a_refused_append_is_not_swallowed(
    worker: Worker, client: Client, settings: Settings, tmp_path: Path
) -> None:
    """The events stream is made to refuse messages over 2 KiB while a step runs: its 5 KB
    completion, flushed alone, is refused. The run must not go on as if it were stored; it
    is retried from its last recorded event (the step is in doubt and runs again) until the
    stream takes it."""
    log = str(tmp_path / "executions")
    names = client.names
    config = stream_configs(names, settings)[0]
    update = f"$JS.API.STREAM.UPDATE.{names.events_stream}"
    GATE.clear()
    run_id = await client.start("gated", Spec(size=5000, log=log, pause=0.3), wait=True)

    def ran(times: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return executions(log) >= times

        return check

    try:
        await wait_for(ran(1), what="the step to start")
        await client.broker.api(update, {**config, "max_msg_size": 2048})
        GATE.set()
        await wait_for(ran(3), what="the refused step to be retried twice")
        events = await events_of(client, run_id)
        assert not any(isinstance(e, (StepCompleted, RunCompleted, RunFailed)) for e in events)
        assert await client.status(run_id) != "completed"
    finally:
        GATE.set()
        await client.broker.api(update, config)
    assert await client.result(run_id, timeout=30) == 4998 + 1
    events = await events_of(client, run_id)
    assert_no_silent_steps(events)
    completed = [e for e in events if isinstance(e, StepCompleted)]
    assert [e.position for e in completed] == [0, 1]
    attempts = [e.attempt for e in events if isinstance(e, StepStarted) and e.position == 0]
    assert attempts == list(range(1, len(attempts) + 1)) and len(attempts) >= 3


def test_max_value_is_validated() -> None:
    assert Settings().max_value == MiB
    assert Settings(max_value=1024).max_child_notice == 1024 + 64 * 1024
    for bad in (0, 1023, 64 * MiB + 1):
        with pytest.raises(ValueError, match="max_value"):
            Settings(max_value=bad)


def test_a_failed_childs_notice_stays_small_whatever_its_error() -> None:
    """Recorded error messages are clipped, so a failed child's end notice is bounded too."""
    huge = "e" * (3 * MiB)
    err = error_info(ValueError(huge))
    assert len(err.message) < 4100 and err.message.startswith("eee")
    state = fold(
        [
            RunStarted(run_id="kid", agent="a", input=to_raw(None), parent_run_id="p"),
            RunFailed(error=ErrorInfo(type="ValueError", message=huge)),
        ]
    )
    notice = encode(outcome_of("kid", state))
    assert len(notice) < Settings().max_child_notice - LIMIT
