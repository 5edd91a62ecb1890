"""LangGraph graphs inside sojourn runs (issue 32): each node a journaled step, each interrupt
a durable wait resumed by a signal (or an approval, decided by its authenticated sender).

The proof: a graph with two tools and one human approval, whose worker process is SIGKILLed
after a tool's effect and before the next model call, completes on another worker with each
tool's effect applied once (a SQLite database this test owns), the model called once per turn
(the scripted OpenAI-compatible server counts the requests) and the approval recorded with the
approver the broker authenticated. The graphs are in tests/apps/lg_agents.py.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from hypothesis import example, given
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.types import Command, Send

from sojourn.actors import Budget, Client, Worker
from sojourn.actors.core.replay import replay_run
from sojourn.actors.integrations._langgraph_chat import SojournChatModel, to_messages
from sojourn.actors.integrations._langgraph_values import TAG
from sojourn.actors.integrations.langgraph import SojournGraph, from_json, to_json
from sojourn.actors.llm import Message, ScriptedModel, ToolCall
from sojourn.broker import EmbeddedServer
from sojourn.schemas.auth import Role
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import RunNotFound
from sojourn.schemas.events import (
    RunEvent,
    RunSuspended,
    SignalReceived,
    StepCompleted,
    StepStarted,
    ValueRecorded,
)
from tests import procs
from tests.apps import lg_agents
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for
from tests.deployments import authenticated_server, passwords
from tests.llm_server import LlmServer, Reply, Seen, completion

DEADLINE = 90.0


async def events_of(client: Client, run_id: str) -> list[RunEvent]:
    return [e for d in await client.history(run_id) for e in d.events]


async def until_waiting_on(client: Client, run_id: str, what: str) -> None:
    async def waiting() -> bool:
        with contextlib.suppress(RunNotFound):
            state = await client.state(run_id)
            return any(what in on for on in state.waiting_on)
        return False

    await wait_for(waiting, DEADLINE, what=f"run {run_id} to wait on {what}")


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
        try:
            return list(conn.execute(sql))
        except sqlite3.OperationalError:  # the tables are not made yet
            return []


def scripted_turn(seen: Seen) -> Reply:
    """The model: reserve stock, then invoice, then answer; from the conversation so far."""
    done = [m.get("name") or "" for m in seen.body["messages"] if m["role"] == "tool"]
    tool_ids = [m["tool_call_id"] for m in seen.body["messages"] if m["role"] == "tool"]
    n = len(seen.body["messages"])
    if not done:
        call = ("c-reserve", "reserve_stock", json.dumps({"item": "widget", "quantity": 3}))
        return Reply(completion(None, tool_calls=[call], prompt_tokens=n, completion_tokens=5))
    if tool_ids == ["c-reserve"]:
        call = ("c-invoice", "send_invoice", json.dumps({"customer": "acme", "amount": 120}))
        return Reply(completion(None, tool_calls=[call], prompt_tokens=n, completion_tokens=6))
    last = seen.body["messages"][-1]["content"]
    return Reply(completion(f"done: {last}", prompt_tokens=n, completion_tokens=7))


# --- the proof: SIGKILL between a tool and the next model call, on an authenticated broker --

PREFIX = "lgauth"
SETTINGS = Settings(prefix=PREFIX, lease_ttl=2.0)
USERS: dict[str, Role] = {"alice": "client", "mallory": "client", "worker": "worker"}
PASSWORDS = passwords(USERS)


@pytest_asyncio.fixture(scope="module")
async def auth_server(
    processes: None, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[EmbeddedServer]:
    store = tmp_path_factory.mktemp("nats-langgraph")
    async with authenticated_server(store, USERS, PASSWORDS, PREFIX) as srv:
        yield srv


@pytest.mark.timeout(240)
async def test_a_graph_killed_between_a_tool_and_the_model_completes_elsewhere_exactly_once(
    auth_server: EmbeddedServer, tmp_path: Path
) -> None:
    db, gate = tmp_path / "effects.sqlite", tmp_path / "gate"
    alice = await Client.connect(auth_server.url_for("alice"), settings=SETTINGS)
    mallory = await Client.connect(auth_server.url_for("mallory"), settings=SETTINGS)
    first: procs.WorkerProc | None = None
    second: procs.WorkerProc | None = None
    async with LlmServer(default=scripted_turn) as model:
        url = auth_server.url_for("worker")

        def worker() -> procs.WorkerProc:
            return procs.WorkerProc(
                url,
                PREFIX,
                "tests.apps.lg_agents",
                SOJOURN_LG_MODEL_URL=model.url,
                SOJOURN_LG_DB=str(db),
                SOJOURN_LG_GATE=str(gate),
            )

        try:
            first = await worker().ready()
            run_id = await alice.start("lg-invoice", "ship 3 widgets to acme", wait=True)

            async def at_the_gate() -> bool:
                return bool(rows(db, "SELECT * FROM executions WHERE what = 'gate'"))

            await wait_for(at_the_gate, DEADLINE, what="the second model turn to be reached")
            # reserve_stock's effect is applied; the model's second turn is not asked yet.
            assert rows(db, "SELECT tool FROM effects") == [("reserve_stock",)]
            assert len(model.seen) == 1
            first.kill()
            gate.touch()
            second = await worker().ready()
            await until_waiting_on(alice, run_id, "signal:approval.send_invoice")
            state = await alice.state(run_id)
            assert state.status == "waiting"
            assert rows(db, "SELECT tool FROM effects") == [("reserve_stock",)]

            # mallory claims to be alice: the broker says who sent it, and it is refused.
            await mallory.signal(run_id, "approval.send_invoice", {"approve": True, "by": "alice"})

            async def refused() -> bool:
                evs = await events_of(alice, run_id)
                return any(isinstance(e, ValueRecorded) and e.kind == "refusal" for e in evs)

            await wait_for(refused, DEADLINE, what="mallory's approval to be refused")
            assert rows(db, "SELECT tool FROM effects") == [("reserve_stock",)]
            await alice.signal(run_id, "approval.send_invoice", {"approve": True, "by": "bob"})
            out = await alice.result(run_id, timeout=DEADLINE)
        finally:
            for p in (first, second):
                if p is not None:
                    p.stop()
            await alice.close()
            await mallory.close()

    assert out["answer"] == "done: invoiced acme 120 EUR"
    # The approval: alice, as the broker authenticated her (her payload's "by" is ignored).
    assert out["approvals"] == [{"approved": True, "by": "alice", "verified": True}]
    # Each tool's effect once, each tool executed once; the model once per turn (3 turns).
    effects = sorted(rows(db, "SELECT tool, args FROM effects"))
    assert effects == [
        ("reserve_stock", '{"item": "widget", "quantity": 3}'),
        ("send_invoice", '{"amount": 120, "customer": "acme"}'),
    ]
    ran = rows(db, "SELECT what, attempt FROM executions ORDER BY rowid")
    assert [w for w, _ in ran if w.startswith("tool:")] == [
        "tool:reserve_stock",
        "tool:send_invoice",
    ]
    assert len(model.seen) == 3
    # The model step cut off by the kill ran again (attempt 2) and asked the model then.
    assert [(w, a) for w, a in ran if w in ("model", "gate")] == [
        ("model", 1),
        ("gate", 1),
        ("model", 2),
        ("model", 1),
    ]
    assert [m.body["messages"][-1]["role"] for m in model.seen] == ["user", "tool", "tool"]

    async with await Client.connect(auth_server.url_for("alice"), settings=SETTINGS) as reader:
        events = await events_of(reader, run_id)
        view = await reader.state(run_id)
    starts = [(e.name, e.kind, e.attempt) for e in events if isinstance(e, StepStarted)]
    assert starts == [
        ("node:agent", "llm", 1),
        ("node:tools", "tool", 1),
        ("node:agent", "llm", 1),
        ("node:agent", "llm", 2),  # the in-doubt attempt after the kill
        ("node:review", "step", 1),  # interrupted: the approval
        ("node:review", "step", 1),  # run again with the decision
        ("node:tools", "tool", 1),
        ("node:agent", "llm", 1),
    ]
    signals = [
        (e.name, e.sent_by, e.sender_verified) for e in events if isinstance(e, SignalReceived)
    ]
    assert signals == [
        ("approval.send_invoice", "mallory", True),
        ("approval.send_invoice", "alice", True),
    ]
    # Usage of the three model turns charged to the run, as the server reported it.
    usage = [e.usage for e in events if isinstance(e, StepCompleted) and e.usage is not None]
    assert [u.requests for u in usage] == [1, 1, 1]
    assert view.model_calls == 4  # node steps of kind llm, the cut-off attempt included
    assert view.spent_tokens == sum(u.input_tokens + u.output_tokens for u in usage)
    # The final state is the run's output, as recorded JSON the state rebuilds from.
    rebuilt = from_json(out["state"])
    assert [type(m).__name__ for m in rebuilt["messages"]] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
    ]
    assert "graph_interrupt" not in view.attributes
    # The whole history replays against the code without running a node or asking the model.
    result = replay_run(lg_agents.lg_invoice, events)
    assert result.ok, result.describe()
    assert result.checked == len(view.ops)
    assert len(model.seen) == 3 and len(rows(db, "SELECT * FROM executions")) == len(ran)


# --- interrupts resumed by signals, in one process --------------------------------------------


async def test_a_plain_interrupt_and_an_ask_are_resumed_by_signals(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    async with Worker([lg_agents.lg_ask], nats=nats_server.url, settings=settings):
        run_id = await client.start("lg-ask", None, wait=True)
        await until_waiting_on(client, run_id, "signal:resume")

        async def shown() -> bool:
            return (await client.state(run_id)).attributes.get("graph_interrupt") == "who"

        await wait_for(shown, DEADLINE, what="the interrupted node in the run's attributes")
        await client.signal(run_id, "resume", "Ada")

        async def second() -> bool:
            return (await client.state(run_id)).attributes.get("graph_interrupt") == "colour"

        await wait_for(second, DEADLINE, what="the second interrupt")
        await client.signal(run_id, "resume", "teal")
        out = await client.result(run_id, timeout=DEADLINE)
    # Without authentication, ``ask`` reports the signal's claimed sender (none here).
    assert out == {"name": "Ada", "asked_by": None, "colour": "teal"}
    events = await events_of(client, run_id)
    names = [e.name for e in events if isinstance(e, StepStarted)]
    assert names == ["node:who", "node:who", "node:colour", "node:colour"]
    # The whole history replays against the code (as ``sojourn replay`` does).
    result = replay_run(lg_agents.lg_ask, events)
    assert result.ok, result.describe()


# --- values and messages (pure) ----------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


def holds_tag(value: Any) -> bool:
    """Whether a dict anywhere in ``value`` has the key ``to_json`` marks its records with."""
    if isinstance(value, list):
        return any(holds_tag(v) for v in value)
    if isinstance(value, dict):
        return TAG in value or any(holds_tag(v) for v in value.values())
    return False


@given(json_values)
@example({TAG: None})
@example([{"a": {TAG: "dict", "items": []}}])
def test_json_is_recorded_as_itself(value: Any) -> None:
    """Plain JSON is recorded as itself, but for a dict that holds the tag key, recorded as
    its items (else it would read back as a record); either way it reads back equal."""
    if not holds_tag(value):
        assert to_json(value) == value
    assert from_json(msgspec.json.decode(msgspec.json.encode(to_json(value)))) == value


def test_messages_commands_and_sends_round_trip_through_their_record() -> None:
    call = {"name": "x", "args": {"a": 1}, "id": "c1", "type": "tool_call"}
    values = [
        {"messages": [HumanMessage("hi"), AIMessage("", tool_calls=[call])]},
        Command(update={"n": 1}, goto="next"),
        [Send("node", {"n": 2})],
        ToolMessage("ok", tool_call_id="c1"),
        {"__lg__": "a user's key", "t": (1, 2)},
        {1: "a non-string key"},
    ]
    for value in values:
        recorded = msgspec.json.decode(msgspec.json.encode(to_json(value)))
        assert from_json(recorded) == value
    assert to_json({"m": HumanMessage("hi")})["m"]["message"]["data"]["content"] == "hi"
    with pytest.raises(ValueError, match="not a recorded"):
        from_json({"__lg__": "nonsense"})


def test_langchain_messages_become_chat_completions_messages() -> None:
    call = {"name": "search", "args": {"q": "x"}, "id": "c1", "type": "tool_call"}
    sent = to_messages(
        [
            SystemMessage("be brief"),
            HumanMessage([{"type": "text", "text": "find "}, "x"]),
            AIMessage("", tool_calls=[call]),
            ToolMessage("found", tool_call_id="c1"),
        ]
    )
    assert sent == (
        Message.system("be brief"),
        Message.user("find x"),
        Message.assistant(None, (ToolCall("c1", "search", '{"q": "x"}'),)),
        Message.tool("c1", "found"),
    )


async def test_the_chat_model_answers_with_tool_calls_and_usage() -> None:
    from sojourn.actors.llm import ModelResponse

    answer = ModelResponse(tool_calls=(ToolCall("c9", "reserve_stock", '{"item": "a"}'),))
    scripted = ScriptedModel([answer, "plain text"], name="s")
    llm = SojournChatModel(model=scripted).bind_tools([lg_agents.reserve_stock])
    first = await llm.ainvoke([HumanMessage("reserve a")])
    assert isinstance(first, AIMessage)
    assert first.tool_calls == [
        {"name": "reserve_stock", "args": {"item": "a"}, "id": "c9", "type": "tool_call"}
    ]
    (request,) = scripted.requests
    assert [t.name for t in request.tools] == ["reserve_stock"]
    assert request.tools[0].parameters["required"] == ["item", "quantity"]
    second = await SojournChatModel(model=scripted).ainvoke("hello there")
    assert second.content == "plain text"
    assert second.usage_metadata is not None and second.usage_metadata["input_tokens"] == 2


def test_a_graph_needs_its_nodes_and_an_approver() -> None:
    with pytest.raises(ValueError, match="no node"):
        SojournGraph(lg_agents.invoice_graph, kinds={"nope": "llm"})
    with pytest.raises(ValueError, match="kind"):
        SojournGraph(lg_agents.invoice_graph, kinds={"agent": "model"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="approver"):
        SojournGraph(lg_agents.invoice_graph, approvers=())


def test_sojourn_actors_does_not_import_langgraph(processes: None) -> None:
    """The extra is optional: ``import sojourn.actors`` (and its LLM client) never needs it."""
    code = (
        "import sys, sojourn.actors, sojourn.actors.llm, sojourn.actors.integrations; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('langgraph', 'langchain_core')]; "
        "assert not bad, bad"
    )
    subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=subprocess_env(), check=True, timeout=60)


# --- the example -----------------------------------------------------------------------------


@pytest.mark.parametrize("approve", [True, False], ids=["approved", "denied"])
async def test_the_example_parks_inside_a_tool_node_until_its_approval(
    nats_server: EmbeddedServer, settings: Settings, client: Client, approve: bool
) -> None:
    import examples.langgraph_agent as example

    async with Worker([example.travel_agent], nats=nats_server.url, settings=settings):
        run_id = await client.start("travel-agent", "a flight to Lisbon on May 4", wait=True)
        await until_waiting_on(client, run_id, "signal:approval.book_flight")
        assert (await client.state(run_id)).attributes["graph_interrupt"] == "tools"
        decision = {"approve": approve, "by": "ada", "note": "" if approve else "too dear"}
        await client.signal(run_id, "approval.book_flight", decision)
        out = await client.result(run_id, timeout=DEADLINE)
    events = await events_of(client, run_id)
    steps = [e.name for e in events if isinstance(e, StepStarted)]
    assert steps == [
        "node:agent",
        "node:tools",  # search_flights
        "node:agent",
        "node:tools",  # book_flight, interrupted for the approval
        "node:tools",  # run again with the decision
        "node:agent",
    ]
    if approve:
        assert (
            out["answer"] == f"Done. booked SJ106 (ref {run_id}/10, approved by ada)"
        )  # 4-9: the wait
    else:
        assert out["answer"] == "Done. not booked: ada said no too dear"
    assert [type(m).__name__ for m in from_json(out["state"])["messages"]][-2:] == [
        "ToolMessage",
        "AIMessage",
    ]
    result = replay_run(example.travel_agent, events)
    assert result.ok, result.describe()


async def test_parallel_interrupts_are_resumed_one_after_another(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    async with Worker([lg_agents.lg_fan], nats=nats_server.url, settings=settings):
        run_id = await client.start("lg-fan", None, wait=True)

        async def stopped(at: str) -> bool:
            return (await client.state(run_id)).attributes.get("graph_interrupt") == at

        await wait_for(lambda: stopped("left"), DEADLINE, what="the left node's interrupt")
        await client.signal(run_id, "resume", "L")
        await wait_for(lambda: stopped("right"), DEADLINE, what="the right node's interrupt")
        await client.signal(run_id, "resume", "R")
        out = await client.result(run_id, timeout=DEADLINE)
    assert sorted(out) == ["joined", "left=L", "right=R"] and out[-1] == "joined"
    events = await events_of(client, run_id)
    steps = [e.name for e in events if isinstance(e, StepStarted)]
    assert steps == ["node:left", "node:right", "node:left", "node:right", "node:join"]
    result = replay_run(lg_agents.lg_fan, events)
    assert result.ok, result.describe()


async def test_a_budget_suspends_the_graph_and_a_raise_resumes_it(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    import examples.langgraph_agent as example

    async with Worker([example.travel_agent], nats=nats_server.url, settings=settings):
        budget = Budget(tool_calls=1)
        run_id = await client.start("travel-agent", "a flight to Oslo", budget=budget, wait=True)

        async def suspended() -> bool:
            return (await client.state(run_id)).status == "suspended"

        await wait_for(suspended, DEADLINE, what="the budget to suspend the graph")
        events = await events_of(client, run_id)
        (suspension,) = [e for e in events if isinstance(e, RunSuspended)]
        assert suspension.reason == "budget" and suspension.limit == "tool_calls"
        steps = [e.name for e in events if isinstance(e, StepStarted)]
        assert steps == ["node:agent", "node:tools", "node:agent"]  # the second tools: refused
        await client.set_budget(run_id, Budget(tool_calls=10))
        await until_waiting_on(client, run_id, "signal:approval.book_flight")
        await client.signal(run_id, "approval.book_flight", {"approve": True, "by": "ada"})
        out = await client.result(run_id, timeout=DEADLINE)
    assert out["answer"].startswith("Done. booked SJ104")


async def test_a_cancel_interrupts_a_waiting_graph(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    async with Worker([lg_agents.lg_ask], nats=nats_server.url, settings=settings):
        run_id = await client.start("lg-ask", None, wait=True)
        await until_waiting_on(client, run_id, "signal:resume")
        await client.cancel(run_id)

        async def cancelled() -> bool:
            return (await client.state(run_id)).status == "cancelled"

        await wait_for(cancelled, DEADLINE, what="the run to be cancelled")


def test_the_documented_import_path_is_the_integration() -> None:
    from sojourn.actors import langgraph as documented
    from sojourn.actors.integrations import langgraph as code

    for name in documented.__all__:
        assert getattr(documented, name) is getattr(code, name)
    assert set(documented.__all__) <= set(code.__all__)


async def test_a_node_that_interrupts_twice_gets_each_answer_in_its_place(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    """The second answer reaches a new worker, which replays the node's first two executions:
    the replay answers the node's first interrupt from history before it stops at the second,
    as the first execution did (else the city would get the name's answer)."""
    async with Worker([lg_agents.lg_form], nats=nats_server.url, settings=settings):
        run_id = await client.start("lg-form", None, wait=True)
        await until_waiting_on(client, run_id, "signal:resume")
        await client.signal(run_id, "resume", "Ada")

        async def second_wait() -> bool:
            state = await client.state(run_id)
            return state.status == "waiting" and sum(op.kind == "wait" for op in state.ops) == 2

        await wait_for(second_wait, DEADLINE, what="the second interrupt's wait")
    async with Worker([lg_agents.lg_form], nats=nats_server.url, settings=settings):
        await client.signal(run_id, "resume", "Lisbon")
        out = await client.result(run_id, timeout=DEADLINE)
    assert out == {"name": "Ada", "city": "Lisbon"}
    events = await events_of(client, run_id)
    assert [e.name for e in events if isinstance(e, StepStarted)] == ["node:fill"] * 3
    result = replay_run(lg_agents.lg_form, events)
    assert result.ok, result.describe()
