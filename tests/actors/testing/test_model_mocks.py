"""``mock_model`` under ``ctx.llm``: the agent's model replaced for a test by a scripted one
that keeps the model's name (the steps read ``llm:<name>``) and prices (the budget is charged
as in production), every request kept with its step (position, attempt, idempotency key); the
real model is back after the block, however it ends."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sojourn.actors import Agent, Context, RetryPolicy, agent, step
from sojourn.actors.llm import (
    Message,
    ModelRateLimited,
    ModelRequest,
    ModelResponse,
    OnToken,
    PriceTable,
    Tool,
    ToolCall,
    _call,
)
from sojourn.actors.testing import SojournEnv, mock_model, turn
from sojourn.schemas.events import StepCompleted, StepStarted, Usage

PRICES = PriceTable({"gpt-4o-mini*": (0.15, 0.60)})
WEATHER = Tool("get_weather", "The weather in a city.")


class Production:
    """The agent's real model: a test that reaches it fails (not retried: the run fails)."""

    def __init__(self) -> None:
        self.name = "gpt-4o-mini"
        self.prices = PRICES

    async def request(
        self,
        request: ModelRequest,
        *,
        on_token: OnToken | None = None,
        idempotency_key: str | None = None,
    ) -> ModelResponse:
        raise AssertionError("the production model was called")


MODEL = Production()
RETRY = RetryPolicy(retry_on=(ModelRateLimited,), attempts=3, initial_interval=0.01)


@step(kind="tool")
def get_weather(arguments: str) -> str:
    return f"sunny in {json.loads(arguments)['city']}"


@agent("chat_mocked")
async def chat(ctx: Context, question: str) -> str:
    messages = [Message.system("Answer about the weather."), Message.user(question)]
    while True:
        answer = await ctx.llm(MODEL, messages, tools=[WEATHER], retry=RETRY)
        messages.append(answer.message())
        if not answer.tool_calls:
            return answer.text
        for call in answer.tool_calls:
            messages.append(Message.tool(call.id, await ctx.step(get_weather, call.arguments)))


@agent("inline_model_mocked")
async def inline(ctx: Context, prompt: str) -> str:
    return (await ctx.llm(Production(), prompt)).text


@pytest.fixture
def sojourn_agents() -> list[Agent[Any, Any]]:
    return [chat, inline]


async def test_a_scripted_turn_calls_a_tool_and_the_next_answers(sojourn_env: SojournEnv) -> None:
    script = [
        turn(calls=[("get_weather", {"city": "Lisbon"})], tokens=(200, 20)),
        turn("Sunny in Lisbon.", tokens=(1000, 500)),
    ]
    with mock_model(MODEL, script) as model:
        run_id = await sojourn_env.start(chat, "Weather in Lisbon?")
        assert await sojourn_env.result(run_id) == "Sunny in Lisbon."
    assert _call.MODEL_STAND_INS == []  # the real model is back

    first, second = model.calls
    assert [m.role for m in first.request.messages] == ["system", "user"]
    assert first.request.messages[-1].content == "Weather in Lisbon?"
    assert [t.name for t in first.request.tools] == ["get_weather"]
    assert first.response is not None and first.error is None
    (tool_call,) = first.response.tool_calls
    assert (tool_call.id, json.loads(tool_call.arguments)) == ("call-1-1", {"city": "Lisbon"})
    assert second.request.messages[-1] == Message.tool("call-1-1", "sunny in Lisbon")
    for call in model.calls:
        assert call.run_id == run_id and call.attempt == 1 and not call.in_doubt
        assert call.idempotency_key == f"{run_id}/{call.position}"
    assert (first.position, second.position) == (0, 2)

    history = await sojourn_env.history(run_id)
    started = [e.name for e in history if isinstance(e, StepStarted)]
    assert started == ["llm:gpt-4o-mini", "get_weather", "llm:gpt-4o-mini"]
    llm = [e for e in history if isinstance(e, StepCompleted) and e.name.startswith("llm:")]
    usages = [e.usage for e in llm]
    assert [(u.input_tokens, u.output_tokens) for u in usages if u] == [(200, 20), (1000, 500)]
    # Priced by the production model's own table, as production would be.
    expected = PRICES.cost("gpt-4o-mini", 200, 20) + PRICES.cost("gpt-4o-mini", 1000, 500)
    state = await sojourn_env.state(run_id)
    assert state.spent_usd == pytest.approx(expected) and state.spent_usd > 0
    assert state.spent_tokens == 1720 and state.model_calls == 2


async def test_a_scripted_429_is_retried_under_the_same_key(sojourn_env: SojournEnv) -> None:
    with mock_model(MODEL, ["Sunny."], fail={1: 0.01}) as model:
        run_id = await sojourn_env.start(chat, "Weather?")
        assert await sojourn_env.result(run_id) == "Sunny."
    failed, answered = model.calls
    assert isinstance(failed.error, ModelRateLimited) and failed.response is None
    assert (failed.attempt, answered.attempt) == (1, 2)
    assert failed.idempotency_key == answered.idempotency_key == f"{run_id}/0"
    assert answered.response is not None and answered.response.text == "Sunny."


async def test_a_model_named_stands_in_for_every_model_of_that_name(
    sojourn_env: SojournEnv,
) -> None:
    """A model the agent builds in its code is not one object a test can name: its name is."""
    with mock_model("gpt-4o-mini", [lambda request: f"echo {request.messages[0].content}"]) as m:
        run_id = await sojourn_env.start(inline, "hello there")
        assert await sojourn_env.result(run_id) == "echo hello there"
    (call,) = m.calls
    assert call.response is not None and call.response.usage.model == "gpt-4o-mini"
    completed = [e for e in await sojourn_env.history(run_id) if isinstance(e, StepCompleted)]
    assert [e.name for e in completed] == ["llm:gpt-4o-mini"]
    # The made-up usage of ScriptedModel: the words of the request and of the answer.
    assert completed[0].usage is not None
    assert (completed[0].usage.input_tokens, completed[0].usage.output_tokens) == (2, 3)


async def test_an_exhausted_script_fails_the_run_and_names_the_model(
    sojourn_env: SojournEnv,
) -> None:
    with mock_model(MODEL, [turn(calls={"get_weather": {"city": "Oslo"}})]) as model:
        run_id = await sojourn_env.start(chat, "Weather in Oslo?")
        with pytest.raises(Exception, match="has 1 answers"):
            await sojourn_env.result(run_id)
    assert len(model.calls) == 2 and model.calls[1].error is not None


def test_the_stand_in_is_taken_away_however_the_block_ends() -> None:
    with pytest.raises(RuntimeError, match="boom"), mock_model(MODEL, ["x"]):
        assert len(_call.MODEL_STAND_INS) == 1
        raise RuntimeError("boom")
    assert _call.MODEL_STAND_INS == []
    m = mock_model(MODEL, ["x"])
    with m, pytest.raises(RuntimeError, match="already in place"):
        m.__enter__()
    assert _call.MODEL_STAND_INS == []
    with pytest.raises(TypeError):
        mock_model(object(), ["x"])


def test_a_stand_in_keeps_the_targets_name_and_prices_unless_told() -> None:
    m = mock_model(MODEL, ["x"])
    stand_in = m._stand_in_for(MODEL)
    assert stand_in is not None and stand_in.name == "gpt-4o-mini"
    assert getattr(stand_in, "prices", None) is PRICES
    assert m._stand_in_for(Production()) is None  # another object of the same name
    free = PriceTable({"*": (0, 0)})
    other = mock_model(MODEL, ["x"], prices=free)._stand_in_for(MODEL)
    assert getattr(other, "prices", None) is free
    answer = turn("hi", calls={"a": {"x": 1}}, tokens=(3, 4), cost=0.5)
    assert answer == ModelResponse(
        text="hi",
        tool_calls=(ToolCall(id="", name="a", arguments='{"x": 1}'),),
        usage=Usage(input_tokens=3, output_tokens=4, requests=1),
        cost=0.5,
    )
