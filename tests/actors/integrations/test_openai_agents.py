"""OpenAI Agents SDK agents inside sojourn runs (issue 32): each model call and each tool call is
a journaled step; a worker SIGKILLed between a tool call and the next model call is resumed by
another without a second model call and with each tool's effect applied once; a tool that
needs approval parks the run until its authenticated approver decides.

The model is the SDK's own chat-completions model against the scripted server
(tests/llm_server.py), which counts the requests it gets; the agents are in
tests/apps/oa_agents.py, served by real worker processes.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest
import pytest_asyncio
from agents import (
    Agent,
    GuardrailFunctionOutput,
    InputGuardrailTripwireTriggered,
    RunConfig,
    RunContextWrapper,
    function_tool,
    input_guardrail,
)
from agents.models.interface import Model, ModelProvider
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.models.openai_provider import OpenAIProvider
from agents.tool import ToolOutputImage, ToolOutputText
from openai import AsyncOpenAI

from sojourn.actors import Budget, Client, Context, Worker, agent
from sojourn.actors.core.replay import replay_run
from sojourn.actors.core.state import fold
from sojourn.actors.integrations.openai_agents import (
    SojournRunner,
    approval_name,
    capture_tool_output,
    dump_response,
    durable_tool,
    load_response,
    replay_tool_output,
    run_context,
)
from sojourn.broker import EmbeddedServer
from sojourn.schemas.auth import Role
from sojourn.schemas.config import Settings
from sojourn.schemas.events import (
    RunEvent,
    RunSuspended,
    StepCompleted,
    StepStarted,
    WaitCompleted,
)
from tests import procs
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for
from tests.deployments import authenticated_server, passwords
from tests.llm_server import LlmServer, Reply, Seen, Stream, completion, stream_events

PREFIX = "oaagents"
SETTINGS = Settings(prefix=PREFIX, lease_ttl=2.0)
USERS: dict[str, Role] = {"alice": "client", "worker": "worker"}
PASSWORDS = passwords(USERS)
DEADLINE = 90.0
MODEL = "llm:scripted-model"


def answer(seen: Seen) -> Reply:
    """The scripted model: look the order up, then refund it, then say so."""
    tools = [m for m in seen.body["messages"] if m.get("role") == "tool"]
    if not tools:
        call = ("call-1", "lookup_order", json.dumps({"order": "A1"}))
        return Reply(
            completion(
                None,
                tool_calls=[call],
                prompt_tokens=7,
                completion_tokens=3,
                model="scripted-model",
                finish_reason="tool_calls",
            )
        )
    if len(tools) == 1:
        call = ("call-2", "refund", json.dumps({"order": "A1", "amount": 20}))
        return Reply(
            completion(
                None,
                tool_calls=[call],
                prompt_tokens=11,
                completion_tokens=5,
                model="scripted-model",
                finish_reason="tool_calls",
            )
        )
    return Reply(
        completion(
            f"done: {tools[-1]['content']}",
            prompt_tokens=13,
            completion_tokens=4,
            model="scripted-model",
        )
    )


@pytest_asyncio.fixture(scope="module")
async def server(
    processes: None, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[EmbeddedServer]:
    store = tmp_path_factory.mktemp("nats-oa-agents")
    async with authenticated_server(store, USERS, PASSWORDS, PREFIX) as srv:
        yield srv


async def events_of(client: Client, run_id: str) -> list[RunEvent]:
    return [e for d in await client.history(run_id) for e in d.events]


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    if not db.exists():
        return []
    with sqlite3.connect(db) as c:
        try:
            return c.execute(sql).fetchall()
        except sqlite3.OperationalError:  # no table yet
            return []


def OaWorker(
    server: EmbeddedServer, llm: LlmServer, db: Path, crash_after: str = ""
) -> procs.WorkerProc:
    return procs.WorkerProc(
        server.url_for("worker"),
        PREFIX,
        "tests.apps.oa_agents",
        SOJOURN_OA_LLM_URL=llm.url,
        SOJOURN_OA_DB=str(db),
        SOJOURN_OA_CRASH_AFTER=crash_after,
    )


async def test_sigkill_after_a_tool_call_resumes_on_another_worker_with_each_effect_once(
    server: EmbeddedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "effects.db"
    alice = await Client.connect(server.url_for("alice"), settings=SETTINGS)
    first = second = None
    try:
        async with LlmServer(default=answer) as llm:
            first = OaWorker(server, llm, db, crash_after="tool:lookup_order")
            await first.ready()
            run_id = await alice.start(
                "oa-support", "refund order A1", run_id="oa-crash", wait=True
            )

            # The worker kills itself once lookup_order has run, before its step is recorded.
            async def killed() -> bool:
                return first.proc.poll() is not None

            await wait_for(killed, DEADLINE, what="the worker to kill itself")
            assert rows(db, "SELECT tool FROM executions") == [("lookup_order",)]
            assert len(llm.seen) == 1  # no model call after the tool

            second = OaWorker(server, llm, db)
            await second.ready()

            async def waiting() -> bool:
                state = await alice.state(run_id)
                return "signal:approval.refund" in state.waiting_on

            await wait_for(waiting, DEADLINE, what="the run to wait for approval.refund")
            assert rows(db, "SELECT tool FROM effects") == [("lookup_order",)]  # refund waits
            await alice.signal(run_id, "approval.refund", {"approve": True, "by": "mallory"})
            out = await alice.result(run_id, timeout=DEADLINE)
            calls = len(llm.seen)
    finally:
        await alice.close()
        for w in (first, second):
            if w is not None:
                w.stop()

    assert out["output"] == "done: refunded 20 on A1"
    assert calls == 3  # one model call per turn, none repeated by the crash or the approval
    execs = Counter(rows(db, "SELECT tool, key FROM executions"))
    effects = rows(db, "SELECT tool, key FROM effects ORDER BY tool")
    assert execs == {("lookup_order", "oa-crash/1"): 2, ("refund", "oa-crash/7"): 1}, execs
    assert effects == [("lookup_order", "oa-crash/1"), ("refund", "oa-crash/7")]

    alice = await Client.connect(server.url_for("alice"), settings=SETTINGS)
    try:
        events = await events_of(alice, run_id)
        state = await alice.state(run_id)
    finally:
        await alice.close()
    starts = [(e.position, e.name, e.kind, e.attempt) for e in events if isinstance(e, StepStarted)]
    assert [s for s in starts if s[2] in ("llm", "tool")] == [
        (0, MODEL, "llm", 1),
        (1, "tool:lookup_order", "tool", 1),
        (1, "tool:lookup_order", "tool", 2),  # cut off by the kill, run again: same key
        (2, MODEL, "llm", 1),
        # 3-6: ctx.approval's own records (its clock readings and the wait)
        (7, "tool:refund", "tool", 1),
        (8, MODEL, "llm", 1),
    ], starts
    # The approval is recorded with its authenticated approver: alice, whatever she claimed.
    (decided,) = [e for e in events if isinstance(e, WaitCompleted) and e.outcome == "signal"]
    assert (decided.signal, decided.sent_by, decided.sender_verified) == (
        "approval.refund",
        "alice",
        True,
    )
    # Usage: each model call's tokens charged once, priced, and equal to the SDK's own count.
    usage = [e.usage for e in events if isinstance(e, StepCompleted) and e.usage is not None]
    assert [(u.input_tokens, u.output_tokens, u.requests) for u in usage] == [
        (7, 3, 1),
        (11, 5, 1),
        (13, 4, 1),
    ]
    assert out["usage"] == {"input_tokens": 31, "output_tokens": 12, "requests": 3}
    assert state.model_calls == 3
    assert state.spent_usd == pytest.approx((31 * 2.0 + 12 * 8.0) / 1e6)

    # The whole history replays against the code (``sojourn replay``): no request, no tool.
    from tests.apps import oa_agents

    monkeypatch.setenv("SOJOURN_OA_LLM_URL", "http://127.0.0.1:9/v1")  # never asked
    result = replay_run(oa_agents.oa_support, events)
    assert result.ok, result.describe()
    assert result.checked == len(fold(events).ops)
    assert Counter(rows(db, "SELECT tool, key FROM executions")) == execs


# --- in one process ------------------------------------------------------------------------


def test_a_recorded_response_is_rebuilt_identical() -> None:
    from agents.items import ModelResponse
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall

    response = ModelResponse(
        output=[
            ResponseFunctionToolCall(
                arguments='{"a": 1}', call_id="c1", name="t", type="function_call", id="x"
            )
        ],
        usage=Usage(requests=1, input_tokens=3, output_tokens=2, total_tokens=5),
        response_id="r1",
    )
    recorded = json.loads(json.dumps(dump_response(response)))
    again = load_response(recorded)
    assert dump_response(again) == recorded
    (call,) = again.output
    assert isinstance(call, ResponseFunctionToolCall) and call.call_id == "c1"
    assert again.usage.output_tokens == 2


@pytest.mark.parametrize(
    "value",
    [
        "text",
        3,
        2.5,
        None,
        True,
        {"a": [1, "b", None]},
        [1, 2],
        (1, 2),
        {"k": (1,)},
        float("nan"),
        object,
    ],
)
def test_a_tool_output_round_trips_to_what_the_sdk_sends(value: Any) -> None:
    from agents.items import ItemHelpers

    recorded = json.loads(json.dumps(capture_tool_output(value)))
    again = replay_tool_output(recorded)
    assert ItemHelpers._convert_tool_output(again) == ItemHelpers._convert_tool_output(value)


def test_structured_tool_outputs_round_trip() -> None:
    one = ToolOutputText(text="hi")
    both = [one, ToolOutputImage(image_url="https://example.com/a.png")]
    assert replay_tool_output(json.loads(json.dumps(capture_tool_output(one)))) == one
    assert replay_tool_output(json.loads(json.dumps(capture_tool_output(both)))) == both
    with pytest.raises(TypeError):
        replay_tool_output({"kind": "nonsense"})


def test_options_are_checked() -> None:
    assert approval_name("refund") == "refund"
    assert approval_name("mcp.send mail!") == "mcp_send_mail_"
    assert approval_name("") == "tool"
    with pytest.raises(ValueError, match="approver"):
        SojournRunner(approvers=())
    with pytest.raises(ValueError, match="approver"):
        SojournRunner(approvers="alice")


async def test_an_agent_holding_a_model_object_is_refused() -> None:
    """Its calls would bypass the journal."""
    model = OpenAIChatCompletionsModel("m", AsyncOpenAI(api_key="x", base_url="http://127.0.0.1:9"))
    inner = Agent(name="inner", model=model)
    outer = Agent(name="outer", model="m", handoffs=[inner])

    ctx = cast(Context, object())  # never used: refused before anything runs
    with pytest.raises(TypeError, match="'inner' holds a Model object"):
        await SojournRunner().run(ctx, outer, "hi")
    with pytest.raises(TypeError, match=r"run_config\.model"):
        await SojournRunner().run(ctx, Agent(name="a"), "hi", run_config=RunConfig(model=model))


def test_sojourn_actors_does_not_import_the_sdk(processes: None) -> None:
    """The extra is optional: ``import sojourn.actors`` never needs it."""
    code = (
        "import sys, sojourn.actors, sojourn.actors.integrations; "
        "assert 'agents' not in sys.modules and 'openai' not in sys.modules, 'imported'"
    )
    subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=subprocess_env(), check=True, timeout=60)


# --- handoffs, guardrails, a tool that waits, streaming: one worker in this process ---------

LLM: list[LlmServer] = []
"""The scripted server of the running test (the agents below ask it)."""


@input_guardrail
async def no_passwords(
    wrapper: RunContextWrapper[Any], agent: Agent[Any], input: Any
) -> GuardrailFunctionOutput:
    """A deterministic guardrail: agent code, run again on every activation."""
    text = input if isinstance(input, str) else json.dumps(input)
    return GuardrailFunctionOutput(output_info=None, tripwire_triggered="password" in text)


@durable_tool
@function_tool
async def wait_for_payment(order: str) -> str:
    """Wait durably for the payment signal, then a timer, then record the payment once."""
    ctx = run_context()
    paid = await ctx.wait_for(f"paid-{order}", timeout=3600)
    await ctx.sleep(0.2)

    def book(amount: int) -> str:
        return f"booked {amount}"

    booked = await ctx.step(book, paid["amount"])
    return f"{order} paid {paid['amount']}, {booked}"


billing = Agent(
    name="billing", instructions="billing", model="scripted-model", tools=[wait_for_payment]
)
triage = Agent(
    name="triage",
    instructions="triage",
    model="scripted-model",
    handoffs=[billing],
    input_guardrails=[no_passwords],
)


def triage_answer(seen: Seen) -> Reply | Stream:
    """Triage hands off to billing; billing waits for the payment, then says so."""
    system = seen.body["messages"][0]["content"]
    tools = [m for m in seen.body["messages"] if m.get("role") == "tool"]
    stream = bool(seen.body.get("stream"))
    if system == "triage":
        call = ("h-1", "transfer_to_billing", "{}")
        if stream:
            return Stream(
                stream_events(
                    [],
                    tool_calls=[(*call[:2], ["{}"])],
                    prompt_tokens=3,
                    completion_tokens=1,
                    model="scripted-model",
                )
            )
        return Reply(
            completion(
                None,
                tool_calls=[call],
                prompt_tokens=3,
                completion_tokens=1,
                model="scripted-model",
                finish_reason="tool_calls",
            )
        )
    if len(tools) == 1:
        call = ("w-1", "wait_for_payment", json.dumps({"order": "A1"}))
        if stream:
            return Stream(
                stream_events(
                    [],
                    tool_calls=[(*call[:2], [call[2]])],
                    prompt_tokens=5,
                    completion_tokens=2,
                    model="scripted-model",
                )
            )
        return Reply(
            completion(
                None,
                tool_calls=[call],
                prompt_tokens=5,
                completion_tokens=2,
                model="scripted-model",
                finish_reason="tool_calls",
            )
        )
    words = ["billing: ", tools[-1]["content"]]
    if stream:
        return Stream(
            stream_events(words, prompt_tokens=7, completion_tokens=3, model="scripted-model")
        )
    return Reply(
        completion("".join(words), prompt_tokens=7, completion_tokens=3, model="scripted-model")
    )


@agent("oa-triage")
async def oa_triage(ctx: Context, question: dict[str, Any]) -> dict[str, Any]:
    provider = OpenAIProvider(api_key="test", base_url=LLM[0].url, use_responses=False)
    runner = SojournRunner(provider)
    try:
        result = await runner.run(
            ctx,
            triage,
            question["text"],
            stream=question["stream"],
            run_config=RunConfig(tracing_disabled=True),
        )
    except InputGuardrailTripwireTriggered:
        return {"output": "refused", "agent": None}
    return {"output": result.final_output, "agent": result.last_agent.name}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_handoff_a_guardrail_and_a_tool_that_waits_for_a_signal_and_a_timer(
    nats_server: EmbeddedServer, settings: Settings, client: Client, stream: bool
) -> None:
    async with (
        LlmServer(default=triage_answer) as llm,
        Worker([oa_triage], nats=nats_server.url, settings=settings),
    ):
        LLM[:] = [llm]
        refused = await client.start("oa-triage", {"text": "my password is x", "stream": stream})
        assert (await client.result(refused, timeout=DEADLINE))["output"] == "refused"
        asked = len(llm.seen)  # the guardrail runs beside the first model call

        run_id = await client.start("oa-triage", {"text": "I paid", "stream": stream}, wait=True)

        async def waiting() -> bool:
            return "signal:paid-A1" in (await client.state(run_id)).waiting_on

        await wait_for(waiting, DEADLINE, what="the tool to wait for the payment")
        before = len(llm.seen) - asked
        assert before == 2  # triage, then billing: no worker holds the run while it waits
        await client.signal(run_id, "paid-A1", {"amount": 20})
        out = await client.result(run_id, timeout=DEADLINE)
        text = []
        async with client.stream(run_id) as chunks:
            async for chunk in chunks:
                text.append(chunk.text)
        calls = len(llm.seen) - asked

    assert out == {"output": "billing: A1 paid 20, booked 20", "agent": "billing"}
    assert calls == 3  # once per turn, though the run was activated again after each wait
    events = await events_of(client, run_id)
    kinds = [(e.name, e.kind) for e in events if isinstance(e, StepStarted)]
    assert kinds == [(MODEL, "llm"), (MODEL, "llm"), ("book", "step"), (MODEL, "llm")], kinds
    waits = [e.key for e in events if isinstance(e, WaitCompleted)]
    assert waits[0] == "signal:paid-A1" and len(waits) == 2
    if stream:
        assert "".join(t for t in text if t) == out["output"]
    else:
        assert not any(text)
    result = replay_run(oa_triage, events)
    assert result.ok, result.describe()
    assert result.checked == len(fold(events).ops)


async def test_the_example_runs_offline_and_parks_for_its_approval(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    import examples.openai_agents as example

    async with Worker([example.support_desk], nats=nats_server.url, settings=settings):
        run_id = await client.start("support-desk", "Please refund order A1", wait=True)

        async def waiting() -> bool:
            return "signal:approval.refund" in (await client.state(run_id)).waiting_on

        await wait_for(waiting, DEADLINE, what="the refund to wait for its approval")
        await client.signal(run_id, "approval.refund", {"approve": True, "by": "ada"})
        out = await client.result(run_id, timeout=DEADLINE)
    assert out == f"Done: refunded 20 on A1 (ref {run_id}/8)"  # 4-7: the approval
    events = await events_of(client, run_id)
    steps = [e.name for e in events if isinstance(e, StepStarted)]
    assert steps == [
        "llm:scripted-support",  # triage: hand off
        "llm:scripted-support",  # refunds: look the order up
        "tool:lookup_order",
        "llm:scripted-support",  # refund (interrupted for the approval)
        "tool:refund",
        "llm:scripted-support",
    ], steps
    result = replay_run(example.support_desk, events)
    assert result.ok, result.describe()


@pytest.mark.parametrize(
    ("limit", "budget", "steps_before"),
    [
        # the first two model calls use 32 and 52 tokens: the tool call after them waits
        ("tokens", Budget(tokens=60), ["llm", "llm"]),
        # the refund, approved, is the second tool call
        ("tool_calls", Budget(tool_calls=1), ["llm", "llm", "tool", "llm"]),
    ],
)
async def test_a_budget_suspends_the_agent_and_a_raise_resumes_it_without_repeating_a_call(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    limit: str,
    budget: Budget,
    steps_before: list[str],
) -> None:
    import examples.openai_agents as example

    async def status() -> str:
        state = await client.state(run_id)
        if "signal:approval.refund" in state.waiting_on:
            return "approval"
        return state.status

    async def asked() -> bool:
        return await status() == "approval"

    async with Worker([example.support_desk], nats=nats_server.url, settings=settings):
        run_id = await client.start("support-desk", "Refund A1", budget=budget, wait=True)
        if limit == "tool_calls":
            await wait_for(asked, DEADLINE, what="the refund to wait for its approval")
            await client.signal(run_id, "approval.refund", {"approve": True, "by": "ada"})

        async def suspended() -> bool:
            return await status() == "suspended"

        await wait_for(suspended, DEADLINE, what="the budget to suspend the agent")
        events = await events_of(client, run_id)
        (suspension,) = [e for e in events if isinstance(e, RunSuspended)]
        assert (suspension.reason, suspension.limit) == ("budget", limit)
        assert [e.kind for e in events if isinstance(e, StepStarted)] == steps_before

        await client.set_budget(run_id, msgspec.structs.replace(budget, **{limit: 10_000}))
        if limit == "tokens":
            await wait_for(asked, DEADLINE, what="the refund to wait for its approval")
            await client.signal(run_id, "approval.refund", {"approve": True, "by": "ada"})
        out = await client.result(run_id, timeout=DEADLINE)
    assert out.startswith("Done: refunded 20 on A1")
    events = await events_of(client, run_id)
    started = [(e.position, e.attempt) for e in events if isinstance(e, StepStarted)]
    assert len(started) == len(set(started)) == 6  # every call once, across the suspension


def test_the_documented_path_imports_the_same_names() -> None:
    from sojourn.actors import openai_agents as documented
    from sojourn.actors.integrations import openai_agents as code

    assert (documented.SojournRunner, documented.durable_tool, documented.run_context) == (
        code.SojournRunner,
        code.durable_tool,
        code.run_context,
    )
    with pytest.raises(RuntimeError, match="only known inside"):
        run_context()
    with pytest.raises(TypeError, match="FunctionTool"):
        durable_tool(cast(Any, len))


# --- an agent used as a tool, sharing a journaled tool ---------------------------------------

CALLS: list[str] = []


@function_tool
def stock(item: str) -> int:
    """How many are in stock."""
    CALLS.append(item)
    return 3


def helper_model() -> Any:
    from agents.testing import ModelStep, ScriptedModel, assistant_message
    from agents.testing import function_call as call

    return ScriptedModel(
        [
            ModelStep(output=[call("stock", {"item": "kettle"}, call_id="s1")]),
            ModelStep(output=[assistant_message("3 kettles")]),
        ]
    )


class _Outer(ModelProvider):
    """The outer agent asks its helper (an agent as a tool), then answers with its result."""

    def get_model(self, model_name: str | None) -> Model:
        from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message
        from agents.testing import function_call as call

        def respond(request: ModelCall) -> ModelStep:
            items = request.input if isinstance(request.input, list) else []
            outs = [
                i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"
            ]
            if not outs:
                return ModelStep(output=[call("stock", {"item": "lamp"}, call_id="o1")])
            if len(outs) == 1:
                return ModelStep(output=[call("helper", {"input": "kettles?"}, call_id="o2")])
            return ModelStep(output=[assistant_message(f"helper says {outs[-1]['output']}")])

        return ScriptedModel([ModelStep.respond(respond)])


@agent("oa-nested")
async def oa_nested(ctx: Context, _: None) -> str:
    helper = Agent(name="helper", model=helper_model(), tools=[stock])
    outer = Agent(
        name="outer", model="outer", tools=[stock, helper.as_tool("helper", "asks the helper")]
    )
    result = await SojournRunner(_Outer()).run(
        ctx, outer, "go", run_config=RunConfig(tracing_disabled=True)
    )
    return str(result.final_output)


async def test_an_agent_used_as_a_tool_is_one_step_and_its_tools_run_inside_it(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    CALLS.clear()
    async with Worker([oa_nested], nats=nats_server.url, settings=settings):
        run_id = await client.start("oa-nested", None, wait=True)
        out = await client.result(run_id, timeout=DEADLINE)
    assert out == "helper says 3 kettles"
    assert CALLS == ["lamp", "kettle"]  # the shared tool: journaled outside, plain inside
    events = await events_of(client, run_id)
    steps = [e.name for e in events if isinstance(e, StepStarted)]
    assert steps == ["llm:outer", "tool:stock", "llm:outer", "tool:helper", "llm:outer"]
