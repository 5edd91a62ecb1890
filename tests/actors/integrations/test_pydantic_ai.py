"""Pydantic AI agents inside sojourn runs (issue 13): each model request and each tool call is a
journaled step; a worker SIGKILLed in the middle of the agent's work is resumed by another
without repeating a completed request or call; the usage recorded in history equals
pydantic-ai's own report; tools that need approval park the run; budgets stop a looping agent.

The models are pydantic-ai ``FunctionModel``s (offline, tests/apps/pai_agents.py); every real
request and tool execution is counted in a log file, across processes.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelRetry, ToolFailed
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturn
from pydantic_ai.usage import RequestUsage

from sojourn.actors import Budget, Client, Worker
from sojourn.actors.core.replay import replay_run
from sojourn.actors.integrations.pydantic_ai import (
    Price,
    SojournAgent,
    approval_name,
    capture_tool_call,
    dump_response,
    load_response,
    replay_tool_call,
)
from sojourn.broker import EmbeddedServer
from sojourn.schemas import StepCompleted, StepStarted
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import RunNotFound
from sojourn.schemas.events import RunEvent, RunSuspended, Usage
from tests import procs
from tests.apps import pai_agents
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for

Row = tuple[str, str, str, int]


def executions(log: Path) -> list[Row]:
    """``(event, step name, idempotency key, attempt)`` of everything that really ran."""
    if not log.exists():
        return []
    rows = []
    for raw in log.read_text().splitlines():
        event, name, key, attempt = raw.split()
        rows.append((event, name, key, int(attempt)))
    return rows


async def events_of(client: Client, run_id: str) -> list[RunEvent]:
    return [e for d in await client.history(run_id) for e in d.events]


def recorded_usage(events: list[RunEvent]) -> Usage:
    total = Usage()
    for e in events:
        if isinstance(e, StepCompleted) and e.usage is not None:
            total = total + e.usage
    return total


def assert_usage_matches(events: list[RunEvent], reported: dict[str, int]) -> None:
    """pydantic-ai's ``result.usage`` equals what the run's history recorded."""
    usage = recorded_usage(events)
    assert reported["input_tokens"] == usage.input_tokens > 0
    assert reported["output_tokens"] == usage.output_tokens > 0
    assert reported["requests"] == usage.requests
    kinds = Counter(e.kind for e in events if isinstance(e, StepStarted))
    done = {e.position for e in events if isinstance(e, StepCompleted)}
    llm = {e.position for e in events if isinstance(e, StepStarted) and e.kind == "llm"}
    assert usage.requests == len(llm & done) == kinds["llm"]


async def until_waiting_on(client: Client, run_id: str, what: str) -> None:
    async def waiting() -> bool:
        with contextlib.suppress(RunNotFound):
            state = await client.state(run_id)
            return any(what in on for on in state.waiting_on)
        return False

    await wait_for(waiting, 60, what=f"run {run_id} to wait on {what}")


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "effects.log"
    monkeypatch.setenv("SOJOURN_TEST_LOG", str(path))
    monkeypatch.delenv("SOJOURN_PAI_GATE", raising=False)
    return path


# --- a crash in the middle ---------------------------------------------------------------


def PaiWorker(url: str, prefix: str, log: Path, gate: Path) -> procs.WorkerProc:
    return procs.WorkerProc(
        url,
        prefix,
        "tests.apps.pai_agents",
        SOJOURN_TEST_LOG=str(log),
        SOJOURN_PAI_GATE=str(gate),
    )


async def test_sigkill_between_tool_calls_resumes_without_repeating_a_request_or_call(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> None:
    log, gate = tmp_path / "effects.log", tmp_path / "gate"
    first = PaiWorker(nats_server.url, settings.prefix, log, gate)
    second: procs.WorkerProc | None = None
    try:
        await first.ready()
        run_id = await client.start("pai-research", "durability", run_id="pai-crash", wait=True)

        async def fetch_running() -> bool:
            return any(r[:2] == ("exec", "tool:fetch") for r in executions(log))

        await wait_for(fetch_running, 60, what="the fetch tool to start")
        # Two model requests and one tool call are done; the second tool call is running.
        first.kill()
        assert ("done", "tool:fetch") not in {r[:2] for r in executions(log)}
        gate.touch()
        second = PaiWorker(nats_server.url, settings.prefix, log, gate)
        await second.ready()
        out = await client.result(run_id, timeout=90)
    finally:
        first.stop()
        if second is not None:
            second.stop()

    assert out["output"] == "report: summary of a long page"
    rows = executions(log)
    ran = Counter((event, name, key) for event, name, key, _ in rows)
    model = "llm:function:research_model:"
    assert ran == {
        ("model", model, "pai-crash/0"): 1,
        ("exec", "tool:search", "pai-crash/1"): 1,
        ("model", model, "pai-crash/2"): 1,
        ("exec", "tool:fetch", "pai-crash/3"): 2,  # cut off by the kill, run again: same key
        ("done", "tool:fetch", "pai-crash/3"): 1,
        ("model", model, "pai-crash/4"): 1,
        ("exec", "tool:summarize", "pai-crash/5"): 1,
        ("model", model, "pai-crash/6"): 1,
    }, rows
    assert [a for e, n, _, a in rows if (e, n) == ("exec", "tool:fetch")] == [1, 2]

    events = await events_of(client, run_id)
    starts = [(e.position, e.name, e.kind, e.attempt) for e in events if isinstance(e, StepStarted)]
    assert starts == [
        (0, model, "llm", 1),
        (1, "tool:search", "tool", 1),
        (2, model, "llm", 1),
        (3, "tool:fetch", "tool", 1),
        (3, "tool:fetch", "tool", 2),
        (4, model, "llm", 1),
        (5, "tool:summarize", "tool", 1),
        (6, model, "llm", 1),
    ]
    assert_usage_matches(events, out["usage"])
    assert out["usage"]["tool_calls"] == 3
    usage = recorded_usage(events)
    price = Price(2.0, 8.0)
    assert usage.usd == pytest.approx(price.usd(usage.input_tokens, usage.output_tokens))
    assert usage.model == "function:research_model:"
    state = await client.state(run_id)
    # sojourn counts tool executions (the budget's unit): the one cut off by the kill too.
    assert (state.model_calls, state.tool_calls) == (4, 4)
    assert state.spent_usd == pytest.approx(usage.usd)


async def test_a_recorded_run_replays_without_running_anything(
    nats_server: EmbeddedServer, settings: Settings, client: Client, log: Path
) -> None:
    """The whole history replays against the code (as ``sojourn replay`` does): every model
    response is rebuilt from its record, no request is sent, no tool runs."""
    async with Worker([pai_agents.pai_research], nats=nats_server.url, settings=settings):
        run_id = await client.start("pai-research", "replay", wait=True)
        out = await client.result(run_id, timeout=60)
    ran = len(executions(log))
    events = await events_of(client, run_id)
    result = replay_run(pai_agents.pai_research, events)
    assert result.ok, result.describe()
    assert result.checked == 7
    assert len(executions(log)) == ran  # the replay ran nothing
    assert_usage_matches(events, out["usage"])


# --- approvals ---------------------------------------------------------------------------


@pytest.mark.parametrize("approve", [True, False], ids=["approved", "denied"])
async def test_a_tool_that_needs_approval_parks_the_run_until_someone_decides(
    nats_server: EmbeddedServer, settings: Settings, client: Client, log: Path, approve: bool
) -> None:
    async with Worker([pai_agents.pai_approve], nats=nats_server.url, settings=settings):
        run_id = await client.start("pai-approve", None, wait=True)
        await until_waiting_on(client, run_id, "signal:approval.publish")
        state = await client.state(run_id)
        assert state.status == "waiting"
        assert ("exec", "tool:publish") not in {r[:2] for r in executions(log)}
        before = Counter(r[:3] for r in executions(log))

        decision = {"approve": approve, "by": "ada", "note": "" if approve else "off-brand"}
        await client.signal(run_id, "approval.publish", decision)
        out = await client.result(run_id, timeout=60)

    ran = Counter(r[:3] for r in executions(log))
    # Nothing done before the approval ran again after it.
    assert all(ran[k] == n for k, n in before.items()), (before, ran)
    assert all(n == 1 for n in ran.values()), ran
    drafts = [r for r in executions(log) if r[1] == "tool:draft"]
    assert len(drafts) == 2  # the ModelRetry went back to the model, which called again
    published = ("exec", "tool:publish") in {r[:2] for r in executions(log)}
    if approve:
        assert published
        assert out["output"] == "publish said: published '50 words on sojourn'"
    else:
        assert not published
        assert out["output"] == ("publish said: The call to publish was denied by ada: off-brand")
    events = await events_of(client, run_id)
    assert_usage_matches(events, out["usage"])
    assert replay_run(pai_agents.pai_approve, events).ok


# --- budgets -----------------------------------------------------------------------------


# The loop model calls ``poke`` six times, then answers. Each request charges its tokens
# (FunctionModel's estimate: the first is 52 in, 4 out; each later one a few more).
BUDGETS = [
    ("tool_calls", Budget(tool_calls=3), 3),
    ("tokens", Budget(tokens=150), 2),
]


@pytest.mark.parametrize(("limit", "budget", "pokes"), BUDGETS, ids=[b[0] for b in BUDGETS])
async def test_a_budget_suspends_a_looping_agent_and_a_raise_resumes_it(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    log: Path,
    limit: str,
    budget: Budget,
    pokes: int,
) -> None:
    async with Worker([pai_agents.pai_loop], nats=nats_server.url, settings=settings):
        run_id = await client.start("pai-loop", None, budget=budget, wait=True)

        async def suspended() -> bool:
            return (await client.state(run_id)).status == "suspended"

        await wait_for(suspended, 60, what="the budget to suspend the loop")
        events = await events_of(client, run_id)
        (suspension,) = [e for e in events if isinstance(e, RunSuspended)]
        assert suspension.reason == "budget" and suspension.limit == limit, suspension
        assert sum(1 for r in executions(log) if r[1] == "tool:poke") == pokes
        before = Counter(r[:3] for r in executions(log))

        await client.set_budget(run_id, msgspec.structs.replace(budget, **{limit: 10_000}))
        out = await client.result(run_id, timeout=60)

    assert out["output"] == "poked 6 times"
    ran = Counter(r[:3] for r in executions(log))
    assert all(n == 1 for n in ran.values()), ran  # nothing ran twice across the suspension
    assert all(ran[k] == 1 for k in before)
    assert_usage_matches(await events_of(client, run_id), out["usage"])


# --- streaming -----------------------------------------------------------------------------


async def test_a_streamed_request_streams_its_text_and_records_the_final_response(
    nats_server: EmbeddedServer, settings: Settings, client: Client, log: Path
) -> None:
    async with Worker([pai_agents.pai_stream], nats=nats_server.url, settings=settings):
        run_id = await client.start("pai-stream", None, wait=True)
        out = await client.result(run_id, timeout=60)
        text = []
        async with client.stream(run_id) as chunks:
            async for chunk in chunks:
                text.append(chunk.text)
    assert out["output"] == "".join(pai_agents.WORDS)
    assert "".join(t for t in text if t) == out["output"]
    events = await events_of(client, run_id)
    assert [e.kind for e in events if isinstance(e, StepStarted)] == ["llm"]
    assert_usage_matches(events, out["usage"])
    assert replay_run(pai_agents.pai_stream, events).ok


# --- what a step records (pure) ------------------------------------------------------------


def test_a_recorded_response_is_rebuilt_identical() -> None:
    response = ModelResponse(
        parts=[TextPart("hi"), ToolCallPart("search", {"q": "x"}, tool_call_id="c1")],
        usage=RequestUsage(input_tokens=7, output_tokens=3),
        model_name="m",
    )
    recorded = msgspec.json.decode(msgspec.json.encode(dump_response(response)))
    assert load_response(recorded) == response
    with pytest.raises(TypeError, match="ModelRequest"):
        load_response([{"kind": "request", "parts": []}])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@given(json_values)
async def test_a_tool_result_round_trips_through_its_record(value: Any) -> None:
    async def tool() -> Any:
        return value

    recorded = await capture_tool_call(tool())
    assert replay_tool_call(msgspec.json.decode(msgspec.json.encode(recorded))) == value


@pytest.mark.parametrize(
    "signal",
    [
        ModelRetry("try again"),
        ApprovalRequired(metadata={"why": "money"}),
        CallDeferred(metadata={"job": 1}),
        ToolFailed("broken"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_a_tools_control_flow_signal_is_recorded_and_raised_again(
    signal: Exception,
) -> None:
    async def tool() -> Any:
        raise signal

    recorded = msgspec.json.decode(msgspec.json.encode(await capture_tool_call(tool())))
    with pytest.raises(type(signal)) as raised:
        replay_tool_call(recorded)
    for attr in ("message", "metadata"):
        assert getattr(raised.value, attr, None) == getattr(signal, attr, None)


async def test_a_tool_return_object_round_trips() -> None:
    async def tool() -> ToolReturn:
        return ToolReturn(return_value={"n": 1}, content="see this", metadata={"m": 2})

    back = replay_tool_call(await capture_tool_call(tool()))
    assert isinstance(back, ToolReturn)
    assert (back.return_value, back.content, back.metadata) == ({"n": 1}, "see this", {"m": 2})
    with pytest.raises(TypeError, match="recorded"):
        replay_tool_call({"kind": "nonsense"})


def test_prices_and_approval_names() -> None:
    assert Price(2.0, 8.0).usd(1_000_000, 500_000) == pytest.approx(6.0)
    for bad in ((-1.0, 1.0), (float("nan"), 1.0), (1.0, float("inf"))):
        with pytest.raises(ValueError):
            Price(*bad)
    assert approval_name("publish") == "publish"
    assert approval_name("mcp.send mail!") == "mcp_send_mail_"
    assert approval_name("") == "tool"
    with pytest.raises(ValueError, match="approver"):
        SojournAgent(pai_agents.research, approvers=())


def test_sojourn_actors_does_not_import_pydantic_ai(processes: None) -> None:
    """The extra is optional: ``import sojourn.actors`` never needs it."""
    code = "import sys, sojourn.actors; assert 'pydantic_ai' not in sys.modules, 'imported'"
    subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=subprocess_env(), check=True, timeout=60)


def test_a_price_table_or_function_prices_a_response() -> None:
    response = ModelResponse(
        parts=[TextPart("x")], usage=RequestUsage(input_tokens=1000, output_tokens=100)
    )
    table = SojournAgent(pai_agents.research, prices={"m": (1.0, 10.0)})
    assert table._usd(response, "m") == pytest.approx(0.002)
    assert table._usd(response, "unknown") == 0.0
    assert SojournAgent(pai_agents.research, prices=lambda r: 0.5)._usd(response, "m") == 0.5
    assert SojournAgent(pai_agents.research, prices=lambda r: None)._usd(response, "m") == 0.0
    for bad in (-1.0, float("nan")):

        def price(r: ModelResponse, usd: float = bad) -> float:
            return usd

        with pytest.raises(ValueError, match="price function"):
            SojournAgent(pai_agents.research, prices=price)._usd(response, "m")


def test_sojourns_control_flow_is_unwrapped_from_task_groups() -> None:
    from sojourn.actors.core.actions import Parked
    from sojourn.actors.integrations.pydantic_ai import _control

    parked = Parked()
    group = BaseExceptionGroup("tools", [ValueError("x"), BaseExceptionGroup("inner", [parked])])
    assert _control(group) is parked
    plain = ExceptionGroup("tools", [ValueError("x")])
    assert _control(plain) is plain
