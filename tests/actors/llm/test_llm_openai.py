"""The OpenAI-compatible client against a local server that speaks the protocol
(tests/llm_server.py): answers, streams, tool calls, the error mapping (429 with Retry-After,
5xx, timeouts, 4xx), hostile answers failing cleanly, and an agent run end to end on a real
nats-server whose recorded usage and cost are what the server reported and the price table
says, with the same idempotency key on every attempt."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import msgspec
import pytest

from sojourn.actors import Client, Context, RetryableError, RetryPolicy, Worker, agent, step
from sojourn.actors.llm import (
    Message,
    ModelProtocolError,
    ModelRateLimited,
    ModelRequest,
    ModelRequestRejected,
    ModelUnavailable,
    OpenAIChat,
    PriceTable,
    Tool,
)
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.events import StepCompleted, StepFailed, StepStarted
from tests.llm_server import (
    Forever,
    Hang,
    LlmServer,
    Reply,
    Stream,
    completion,
    stream_events,
)

HELLO = ModelRequest(messages=(Message.system("be brief"), Message.user("hello")))
WEATHER = Tool(
    name="weather",
    description="the weather in a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


def chat(server: LlmServer, **kw: object) -> OpenAIChat:
    return OpenAIChat("test-model", base_url=server.url, api_key="sk-test", **kw)  # type: ignore[arg-type]


async def test_an_answer_is_decoded_with_its_usage_and_the_model_that_answered() -> None:
    async with LlmServer() as server:
        server.push(Reply(completion("Hi!", prompt_tokens=11, completion_tokens=2, cost=None)))
        async with chat(server) as model:
            got = await model.request(HELLO, idempotency_key="run-1/0")
        (seen,) = server.seen
    assert got.text == "Hi!" and got.finish_reason == "stop" and got.id == "chatcmpl-1"
    assert (got.usage.input_tokens, got.usage.output_tokens, got.usage.requests) == (11, 2, 1)
    assert got.model == got.usage.model == "test-model-2026-01-01"
    assert got.cost is None
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == "Bearer sk-test"
    assert seen.headers["idempotency-key"] == "run-1/0"
    assert seen.body == {
        "model": "test-model",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello"},
        ],
    }


async def test_request_options_and_tools_are_sent_and_tool_calls_come_back() -> None:
    request = ModelRequest(
        messages=(Message.user("weather in Paris?"),),
        tools=(WEATHER,),
        max_tokens=50,
        temperature=0.0,
        stop=("\n\n",),
        tool_choice="weather",
        extra={"seed": 7},
    )
    async with LlmServer() as server:
        answer = completion(
            None,
            tool_calls=[("call_a", "weather", '{"city": "Paris"}')],
            finish_reason="tool_calls",
        )
        server.push(Reply(answer))
        async with chat(server) as model:
            got = await model.request(request)
        body = server.seen[0].body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "the weather in a city",
                "parameters": WEATHER.parameters,
            },
        }
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert (body["max_tokens"], body["temperature"], body["stop"], body["seed"]) == (
        50,
        0.0,
        ["\n\n"],
        7,
    )
    assert got.text == "" and got.finish_reason == "tool_calls"
    (call,) = got.tool_calls
    assert (call.id, call.name, json.loads(call.arguments)) == (
        "call_a",
        "weather",
        {"city": "Paris"},
    )
    # the assistant message goes back into the conversation as the provider expects it
    follow = ModelRequest(
        messages=(*request.messages, got.message(), Message.tool("call_a", "18C"))
    )
    async with LlmServer() as server:
        async with chat(server) as model:
            await model.request(follow)
        sent = server.seen[0].body["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    assert sent[2] == {"role": "tool", "content": "18C", "tool_call_id": "call_a"}


async def test_a_streamed_answer_hands_out_its_text_as_it_comes_and_reads_the_usage() -> None:
    pieces: list[str] = []

    async def on_token(text: str) -> None:
        pieces.append(text)

    async with LlmServer() as server:
        events = stream_events(
            ["Dur", "able ", "exec", "ution."], prompt_tokens=9, completion_tokens=4
        )
        server.push(Stream(events, delay=0.02))
        async with chat(server) as model:
            got = await model.request(HELLO, on_token=on_token)
        body = server.seen[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "".join(pieces) == got.text == "Durable execution."
    assert len(pieces) >= 2  # delivered as they came, not at the end
    assert (got.usage.input_tokens, got.usage.output_tokens) == (9, 4)
    assert got.finish_reason == "stop" and got.model == "test-model-2026-01-01"


async def test_streamed_tool_calls_are_put_together_from_their_fragments() -> None:
    async def on_token(text: str) -> None:
        pass

    async with LlmServer() as server:
        calls = [("c1", "weather", ['{"ci', 'ty": "Par', 'is"}']), ("c2", "weather", ["{}"])]
        server.push(Stream(stream_events([], tool_calls=calls, completion_tokens=5)))
        async with chat(server) as model:
            got = await model.request(HELLO, on_token=on_token)
    assert [(c.id, c.name, c.arguments) for c in got.tool_calls] == [
        ("c1", "weather", '{"city": "Paris"}'),
        ("c2", "weather", "{}"),
    ]
    assert got.finish_reason == "tool_calls" and got.usage.output_tokens == 5


async def test_a_provider_reported_cost_is_kept() -> None:
    async with LlmServer() as server:
        server.push(Reply(completion("x", prompt_tokens=1, completion_tokens=1, cost=0.0042)))
        server.push(Reply(completion("y"), headers={"x-litellm-response-cost": "0.5"}))
        async with chat(server) as model:
            assert (await model.request(HELLO)).cost == 0.0042
            assert (await model.request(HELLO)).cost == 0.5


@pytest.mark.parametrize(
    ("status", "headers", "error", "retry_after"),
    [
        (429, {"Retry-After": "7"}, ModelRateLimited, 7.0),
        (429, {"retry-after-ms": "1500"}, ModelRateLimited, 1.5),
        (429, {"Retry-After": "999999"}, ModelRateLimited, 3600.0),  # bounded
        (429, {"Retry-After": "soon"}, ModelRateLimited, None),  # unreadable: the policy's
        (429, {}, ModelRateLimited, None),
        (503, {"Retry-After": "3"}, ModelRateLimited, 3.0),
        (500, {}, ModelUnavailable, None),
        (502, {}, ModelUnavailable, None),
        (408, {}, ModelUnavailable, None),
    ],
)
async def test_statuses_worth_another_attempt_are_retryable(
    status: int, headers: dict[str, str], error: type[Exception], retry_after: float | None
) -> None:
    async with LlmServer() as server:
        server.push(Reply({"error": {"message": "slow down"}}, status=status, headers=headers))
        async with chat(server) as model:
            with pytest.raises(error) as got:
                await model.request(HELLO)
    assert isinstance(got.value, RetryableError)
    assert got.value.retry_after == retry_after
    assert f"answered {status}: slow down" in str(got.value)


async def test_a_retry_after_http_date_is_read_as_the_seconds_until_it() -> None:
    when = datetime.now(UTC) + timedelta(seconds=30)
    async with LlmServer() as server:
        server.push(
            Reply({}, status=429, headers={"Retry-After": format_datetime(when, usegmt=True)})
        )
        async with chat(server) as model:
            with pytest.raises(ModelRateLimited) as got:
                await model.request(HELLO)
    assert got.value.retry_after is not None and 25 <= got.value.retry_after <= 30


async def test_other_client_errors_are_terminal_with_the_providers_message_clipped() -> None:
    async with LlmServer() as server:
        message = "Incorrect API key provided: sk-te\x1b[31m****" + "x" * 10_000
        server.push(Reply({"error": {"message": message, "code": "invalid_api_key"}}, status=401))
        server.push(Reply(b"<html>no such model</html>", status=404))
        async with chat(server) as model:
            with pytest.raises(ModelRequestRejected) as got:
                await model.request(HELLO)
            with pytest.raises(ModelRequestRejected, match="404: <html>no such model"):
                await model.request(HELLO)
    text = str(got.value)
    assert got.value.status == 401 and "Incorrect API key provided" in text
    assert "\x1b" not in text and len(text) < 700


async def test_a_request_that_hangs_past_the_timeout_is_retryable() -> None:
    async with LlmServer() as server:
        server.push(Hang(30))
        async with chat(server, timeout=0.3) as model:
            with pytest.raises(ModelUnavailable, match="timed out"):
                await model.request(HELLO)


async def test_a_refused_connection_is_retryable() -> None:
    async with LlmServer() as server:
        url = server.url
    async with OpenAIChat("m", base_url=url, api_key="") as model:
        with pytest.raises(ModelUnavailable, match="ConnectError"):
            await model.request(HELLO)


# --- hostile answers fail the attempt cleanly --------------------------------------------


async def test_a_10_mb_body_is_refused_with_or_without_its_length() -> None:
    huge = completion("a" * (10 * 1024 * 1024))
    async with LlmServer() as server:
        server.push(Reply(huge), Reply(huge, length=False))
        async with chat(server) as model:
            with pytest.raises(ModelProtocolError, match="bytes"):
                await model.request(HELLO)
            with pytest.raises(ModelProtocolError, match="passed"):
                await model.request(HELLO)


async def test_a_never_ending_stream_is_cut_at_its_size_bound_and_its_duration() -> None:
    async def on_token(text: str) -> None:
        pass

    async with LlmServer() as server:
        server.push(Forever(), Forever(event=b": keep-alive\n\n", delay=0.01))
        # The size bound with time to spare (a loaded machine must not reach the duration
        # first), then the duration bound on the stream that never grows.
        async with chat(server, max_stream_bytes=256 * 1024, max_duration=120.0) as model:
            with pytest.raises(ModelProtocolError, match="event stream passed 262144 bytes"):
                await model.request(HELLO, on_token=on_token)
        async with chat(server, max_stream_bytes=256 * 1024, max_duration=1.0) as model:
            with pytest.raises(ModelUnavailable, match="no complete answer within 1 s"):
                await model.request(HELLO, on_token=on_token)


@pytest.mark.parametrize(
    "behaviour",
    [
        Reply(b"{not json"),
        Reply(b'{"choices": []}'),
        Reply(b'{"choices": [{"message": {"content": 7}}]}'),
        Reply(completion("x", prompt_tokens=-5, completion_tokens=1)),
        Reply(completion("x", prompt_tokens=10**18)),
        Stream(["{not json"]),
        Stream(stream_events(["a"]), done=False),  # the finish came: accepted, see below
        Stream([{"choices": [{"index": 0, "delta": {"content": "cut"}}]}], done=False),
        Stream(['{"choices": [{"index": 999, "delta": {"tool_calls": [{"index": 500}]}}]}']),
        Stream(["x" * (2 * 1024 * 1024)]),
    ],
    ids=[
        "invalid-json",
        "no-choices",
        "wrong-type",
        "negative-tokens",
        "absurd-tokens",
        "invalid-json-chunk",
        "no-done-after-finish",
        "stream-cut",
        "tool-index",
        "long-line",
    ],
)
async def test_a_malformed_answer_is_a_protocol_error(behaviour: Reply | Stream) -> None:
    async def on_token(text: str) -> None:
        pass

    async with LlmServer() as server:
        server.push(behaviour)
        async with chat(server) as model:
            stream = on_token if isinstance(behaviour, Stream) else None
            if isinstance(behaviour, Stream) and not behaviour.done and len(behaviour.events) > 2:
                got = await model.request(HELLO, on_token=stream)  # ended after its finish
                assert got.text == "a"
                return
            with pytest.raises(ModelProtocolError):
                await model.request(HELLO, on_token=stream)


# --- end to end: a run on a real nats-server ------------------------------------------------

PRICES = PriceTable({"test-model*": (2.0, 8.0), "other": (1.0, 1.0)})
FAST = RetryPolicy(retry_on=(RetryableError,), attempts=6, initial_interval=0.05, max_interval=0.1)
SERVER: dict[str, LlmServer] = {}
MODELS: dict[str, OpenAIChat] = {}


@step(kind="tool")
def weather(arguments: str) -> str:
    city = json.loads(arguments)["city"]
    return f"18C and sunny in {city}"


@agent("llm-e2e")
async def llm_e2e(ctx: Context, question: str) -> dict[str, object]:
    model = MODELS[ctx.agent]
    first = await ctx.llm(model, question, tools=[WEATHER], stream=True, retry=FAST)
    messages = [Message.user(question), first.message()]
    for call in first.tool_calls:
        messages.append(Message.tool(call.id, await ctx.step(weather, call.arguments)))
    final = await ctx.llm(model, messages, retry=FAST, max_tokens=100)
    return {"first": first.text, "final": final.text, "usd": first.usage.usd + final.usage.usd}


async def test_an_agent_run_records_the_servers_usage_and_the_tables_cost_through_retries(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    async with LlmServer() as server:
        pieces = ["Let me ", "check the ", "weather."]
        calls = [("call_1", "weather", ['{"city"', ': "Paris"}'])]
        server.push(
            Reply({"error": {"message": "rate limited"}}, status=429, headers={"Retry-After": "1"}),
            Reply({"error": {"message": "boom"}}, status=500),
            Hang(30),  # past the client's timeout
            Stream(stream_events(pieces, tool_calls=calls, prompt_tokens=31, completion_tokens=17)),
            Reply(completion("It is 18C in Paris.", prompt_tokens=64, completion_tokens=9)),
        )
        model = OpenAIChat("test-model", base_url=server.url, timeout=0.5, prices=PRICES)
        MODELS["llm-e2e"] = model
        try:
            async with Worker([llm_e2e], nats=nats_server.url, settings=settings):
                run_id = await client.start("llm-e2e", "weather in Paris?", wait=True)
                out = await client.result(run_id, timeout=60)
        finally:
            await model.aclose()
        seen = list(server.seen)

    first_cost = (31 * 2.0 + 17 * 8.0) / 1e6
    final_cost = (64 * 2.0 + 9 * 8.0) / 1e6
    assert out == {
        "first": "Let me check the weather.",
        "final": "It is 18C in Paris.",
        "usd": pytest.approx(first_cost + final_cost),
    }
    events = [e for d in await client.history(run_id) for e in d.events]
    started = [e for e in events if isinstance(e, StepStarted)]
    assert [(e.name, e.kind, e.attempt) for e in started] == [
        ("llm:test-model", "llm", 1),
        ("llm:test-model", "llm", 2),
        ("llm:test-model", "llm", 3),
        ("llm:test-model", "llm", 4),
        ("weather", "tool", 1),
        ("llm:test-model", "llm", 1),
    ]
    failed = [e for e in events if isinstance(e, StepFailed)]
    assert [f.error.type for f in failed] == [
        "ModelRateLimited",
        "ModelUnavailable",
        "ModelUnavailable",
    ]
    assert "answered 429: rate limited" in failed[0].error.message
    assert "timed out" in failed[2].error.message
    # the 429's Retry-After is the delay: recorded, and waited before the next attempt
    assert failed[0].retry_at is not None and failed[0].retry_at - failed[0].at >= 1.0 - 1e-3
    assert started[1].at >= failed[0].retry_at - 1e-3
    assert seen[1].at - seen[0].at >= 1.0 - 0.05  # the server's own clock agrees
    assert all(f.usage is None for f in failed)  # the failed requests reported nothing

    done = [e for e in events if isinstance(e, StepCompleted) and e.name.startswith("llm:")]
    usages = [e.usage for e in done]
    assert usages[0] is not None and usages[1] is not None
    assert (usages[0].input_tokens, usages[0].output_tokens, usages[0].requests) == (31, 17, 1)
    assert (usages[1].input_tokens, usages[1].output_tokens) == (64, 9)
    assert usages[0].usd == pytest.approx(first_cost) and usages[1].usd == pytest.approx(final_cost)
    assert usages[0].model == "test-model-2026-01-01"
    recorded = msgspec.json.decode(bytes(done[0].result))
    assert recorded["usage"]["usd"] == pytest.approx(first_cost)

    # the same idempotency key on every attempt of a step, another for the next step
    keys = [s.headers["idempotency-key"] for s in seen]
    assert keys[:4] == [f"{run_id}/0"] * 4
    assert keys[4] == f"{run_id}/2"
    assert "authorization" not in seen[0].headers or seen[0].headers["authorization"]
    state = await client.state(run_id)
    assert state.spent_usd == pytest.approx(first_cost + final_cost)
    assert (state.spent_input_tokens, state.spent_output_tokens) == (95, 26)

    # the streamed attempt's text is on the run's output stream
    text: list[str] = []
    async with client.stream(run_id, follow=False) as chunks:
        async for chunk in chunks:
            if chunk.kind == "text":
                text.append(chunk.text)
    assert "".join(text) == "Let me check the weather."
