"""``ScriptedModel`` and ``ctx.llm`` in runs: scripted answers with consistent usage,
streaming, injected 429s honoured as the retry delay, replay returning recorded responses
without calling the model again, and a token budget suspending a looping chat agent with the
limit named (raising it resumes the loop where it stopped)."""

from __future__ import annotations

import contextlib

import pytest

from sojourn.actors import Budget, Client, Context, StepError, Worker, agent
from sojourn.actors.core.replay import replay_run
from sojourn.actors.llm import (
    Message,
    ModelRateLimited,
    ModelRequest,
    ModelResponse,
    PriceTable,
    ScriptedModel,
    ToolCall,
)
from sojourn.actors.llm._call import model_request
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import RunNotFound, TerminalError
from sojourn.schemas.events import RunSuspended, StepCompleted, StepFailed, StepStarted
from tests.conftest import wait_for

ASK = ModelRequest(messages=(Message.system("you are terse"), Message.user("say three words")))


async def test_answers_come_in_order_with_words_as_tokens() -> None:
    model = ScriptedModel(["one two three", ModelResponse(text="four", finish_reason="length")])
    first = await model.request(ASK, idempotency_key="r/0")
    second = await model.request(ASK, idempotency_key="r/1")
    assert (first.text, first.finish_reason, first.model) == ("one two three", "stop", "scripted")
    assert (first.usage.input_tokens, first.usage.output_tokens, first.usage.requests) == (6, 3, 1)
    assert (second.text, second.finish_reason, second.usage.output_tokens) == ("four", "length", 1)
    assert model.calls == 2 and model.keys == ["r/0", "r/1"] and model.requests == [ASK, ASK]
    with pytest.raises(TerminalError, match="has 2 answers; request 3 has none"):
        await model.request(ASK)


async def test_a_function_answers_every_request_and_tool_calls_count_as_output() -> None:
    def answer(request: ModelRequest) -> ModelResponse:
        n = len(request.messages)
        call = ToolCall(id=f"c{n}", name="look", arguments='{"q": "a b"}')
        return ModelResponse(text=f"turn {n}", tool_calls=(call,))

    model = ScriptedModel(answer, name="fn")
    got = await model.request(ASK)
    assert got.text == "turn 2" and got.finish_reason == "tool_calls"
    assert got.usage.output_tokens == 2 + 3  # "turn 2", and the arguments split on spaces
    assert got.usage.model == "fn" and got.id == "scripted-1"


async def test_it_streams_word_by_word_and_fails_the_calls_it_is_told_to() -> None:
    model = ScriptedModel(["a b c"], fail={1: 2.5})
    pieces: list[str] = []

    async def on_token(text: str) -> None:
        pieces.append(text)

    with pytest.raises(ModelRateLimited) as got:
        await model.request(ASK, on_token=on_token)
    assert got.value.retry_after == 2.5 and got.value.status == 429
    assert (await model.request(ASK, on_token=on_token)).text == "a b c"
    assert pieces == ["a", " b", " c"]


def test_a_prompt_is_one_user_message_and_options_are_checked() -> None:
    assert model_request("hi", None, {}).messages == (Message("user", "hi"),)
    assert model_request("hi", None, {"max_tokens": 5}).max_tokens == 5
    with pytest.raises(TypeError, match=r"ctx\.llm options are"):
        model_request("hi", None, {"max_tokns": 5})
    with pytest.raises(TypeError, match="non-empty sequence of Message"):
        model_request([], None, {})
    with pytest.raises(TypeError, match="non-empty sequence of Message"):
        model_request([{"role": "user"}], None, {})  # type: ignore[list-item]


# --- in runs ---------------------------------------------------------------------------------

MODEL = ScriptedModel(
    lambda r: f"echo {r.messages[-1].content}",
    name="echo",
    prices=PriceTable({"echo": (1000.0, 2000.0)}),
)


@agent("scripted-waiter")
async def scripted_waiter(ctx: Context, prompt: str) -> list[str]:
    first = await ctx.llm(MODEL, prompt, stream=True)
    more = await ctx.wait_for("more", type=str)
    second = await ctx.llm(MODEL, [Message.user(prompt), first.message(), Message.user(more)])
    return [first.text, second.text]


async def history(client: Client, run_id: str) -> list[object]:
    return [e for d in await client.history(run_id) for e in d.events]


async def test_replay_returns_the_recorded_responses_without_calling_the_model(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    before = MODEL.calls
    async with Worker([scripted_waiter], nats=nats_server.url, settings=settings):
        run_id = await client.start("scripted-waiter", "hello there", wait=True)

        async def waiting() -> bool:
            return any("more" in w for w in (await client.state(run_id)).waiting_on)

        await wait_for(waiting, 60, what="the wait for 'more'")
    assert MODEL.calls == before + 1
    # a new worker: the next activation replays the first request from history
    async with Worker([scripted_waiter], nats=nats_server.url, settings=settings):
        await client.signal(run_id, "more", "and more")
        out = await client.result(run_id, timeout=60)
    assert out == ["echo hello there", "echo and more"]
    assert MODEL.calls == before + 2

    events = await history(client, run_id)
    done = [e for e in events if isinstance(e, StepCompleted)]
    assert [e.name for e in done] == ["llm:echo", "llm:echo"]
    assert done[0].usage is not None and done[1].usage is not None
    assert (done[0].usage.input_tokens, done[0].usage.output_tokens) == (2, 3)
    assert done[0].usage.usd == pytest.approx((2 * 1000 + 3 * 2000) / 1e6)
    # "hello there", "echo hello there", "and more" in; "echo and more" out
    assert (done[1].usage.input_tokens, done[1].usage.output_tokens) == (7, 3)

    # and sojourn replay's check of the whole history calls nothing either
    result = replay_run(scripted_waiter, events)  # type: ignore[arg-type]
    assert result.ok, result.describe()
    assert MODEL.calls == before + 2

    chunks: list[str] = []
    async with client.stream(run_id, follow=False) as reader:
        async for c in reader:
            chunks.append(c.text)
    assert chunks == ["echo", " hello", " there"]


FLAKY = ScriptedModel(["fine", "never"], name="flaky", fail={1: 0.3, 2: None})


@agent("scripted-flaky")
async def scripted_flaky(ctx: Context, prompt: str) -> str:
    return (await ctx.llm(FLAKY, prompt)).text


EMPTY = ScriptedModel([], name="empty")


@agent("scripted-empty")
async def scripted_empty(ctx: Context, prompt: str) -> str:
    try:
        return (await ctx.llm(EMPTY, prompt)).text
    except StepError as e:
        return f"{e.error_type}: {e}"


async def test_a_429_waits_its_retry_after_and_a_terminal_error_fails_at_once(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    async with Worker([scripted_flaky, scripted_empty], nats=nats_server.url, settings=settings):
        run_id = await client.start("scripted-flaky", "go", wait=True)
        assert await client.result(run_id, timeout=60) == "fine"
        empty = await client.start("scripted-empty", "go", wait=True)
        said = await client.result(empty, timeout=60)
    events = await history(client, run_id)
    failed = [e for e in events if isinstance(e, StepFailed)]
    assert [f.error.type for f in failed] == ["ModelRateLimited", "ModelRateLimited"]
    assert failed[0].retry_at is not None
    assert failed[0].retry_at - failed[0].at == pytest.approx(0.3, abs=1e-3)  # Retry-After
    assert failed[1].retry_at is not None  # no Retry-After: the policy's backoff
    starts = [e for e in events if isinstance(e, StepStarted)]
    assert [s.attempt for s in starts] == [1, 2, 3] and starts[1].at >= failed[0].retry_at - 1e-3
    assert FLAKY.keys[-3:] == [f"{run_id}/0"] * 3
    assert said.startswith("TerminalError: step 'llm:empty' failed after 1 attempt(s)")


CHATTY = ScriptedModel(lambda r: "sure, here are five words", name="chatty")


@agent("scripted-looper")
async def scripted_looper(ctx: Context, turns: int) -> int:
    """A chat that keeps going: its context (and so each request's tokens) grows every turn."""
    messages = [Message.user("go on")]
    for _ in range(turns):
        answer = await ctx.llm(CHATTY, messages)
        messages += [answer.message(), Message.user("go on")]
    return len(messages)


async def test_a_token_budget_suspends_a_looping_chat_naming_the_limit(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    before = CHATTY.calls
    async with Worker([scripted_looper], nats=nats_server.url, settings=settings):
        run_id = await client.start("scripted-looper", 100, budget=Budget(tokens=40), wait=True)
        got: list[RunSuspended] = []

        async def suspended() -> bool:
            with contextlib.suppress(RunNotFound):
                if (await client.state(run_id)).status == "suspended":
                    got.extend(
                        e for e in await history(client, run_id) if isinstance(e, RunSuspended)
                    )
                    return True
            return False

        await wait_for(suspended, 60, what="the budget suspension")
        (suspension,) = got
        assert suspension.reason == "budget" and suspension.limit == "tokens"
        assert "budget tokens used up: 42 of 40" in suspension.detail, suspension.detail
        # turns use 2+5, 9+5, 16+5 tokens: 42 after 3 requests, so the 4th never starts
        assert CHATTY.calls == before + 3
        state = await client.state(run_id)
        assert state.spent_tokens == 42 and state.model_calls == 3

        await client.set_budget(run_id, Budget(tokens=10_000))

        async def moving() -> bool:
            return CHATTY.calls > before + 3

        await wait_for(moving, 60, what="the loop to resume")
        await client.cancel(run_id)
    events = await history(client, run_id)
    starts = [e for e in events if isinstance(e, StepStarted)]
    assert all(s.attempt == 1 and s.kind == "llm" for s in starts)
    assert len({s.position for s in starts}) == len(starts)  # nothing ran twice
