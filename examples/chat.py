"""A chat agent with a tool: each model request and each tool call is a journaled step.

Run it offline (a scripted model answers)::

    sojourn dev --app examples.chat
    sojourn start chat --input '{"question": "What is the weather in Paris?"}' --wait
    sojourn stream RUN            # the answer's tokens, as they were streamed
    sojourn status RUN            # spend: the tokens and cost of every request

or against a real model: set ``OPENAI_API_KEY`` (OpenAI), or ``SOJOURN_OPENAI_BASE_URL`` for any
OpenAI-compatible server (``http://localhost:11434/v1`` for Ollama), and ``SOJOURN_OPENAI_MODEL``
(default ``gpt-4o-mini``). The loop: ask the model; if it asks for tools, run each as a step and
ask again with the results; stop at its answer or after ``max_turns`` requests. A worker killed
mid-conversation resumes it on another worker, no completed request or tool call sent again.
"""

from __future__ import annotations

import json
import os

import msgspec

from sojourn.actors import Budget, Context, agent, step
from sojourn.actors.llm import (
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    OpenAIChat,
    PriceTable,
    ScriptedModel,
    Tool,
    ToolCall,
)

PRICES = PriceTable(
    {
        "gpt-4o-mini*": (0.15, 0.60),  # USD per million input / output tokens
        "gpt-4o*": (2.50, 10.00),
        "scripted-chat": (0.15, 0.60),  # the offline model, priced like a small one
    }
)

WEATHER = Tool(
    name="get_weather",
    description="The current weather in a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string", "description": "the city's name"}},
        "required": ["city"],
    },
)

CITIES = {"Paris": "18 °C, sunny", "Lisbon": "22 °C, clear", "Oslo": "4 °C, light rain"}


class Chat(msgspec.Struct, frozen=True):
    question: str
    max_turns: int = 6


class Answer(msgspec.Struct, frozen=True):
    text: str
    turns: int
    tool_calls: int


def scripted(request: ModelRequest) -> ModelResponse:
    """The offline model: asks for the weather of the city the question names, then answers
    from the tool's result. Deterministic, so the example's recorded runs replay."""
    last = request.messages[-1]
    if last.role == "tool":
        return ModelResponse(text=f"Right now it is {last.content}.")
    question = last.content or ""
    city = next((c for c in CITIES if c.lower() in question.lower()), "Paris")
    arguments = json.dumps({"city": city})
    return ModelResponse(
        tool_calls=(ToolCall(id="call_1", name=WEATHER.name, arguments=arguments),)
    )


def model_from_env() -> Model:
    base_url = os.environ.get("SOJOURN_OPENAI_BASE_URL")
    if base_url or os.environ.get("OPENAI_API_KEY"):
        return OpenAIChat(
            os.environ.get("SOJOURN_OPENAI_MODEL", "gpt-4o-mini"),
            base_url=base_url or "https://api.openai.com/v1",
            prices=PRICES,
        )
    return ScriptedModel(scripted, name="scripted-chat", prices=PRICES)


MODEL = model_from_env()


@step(kind="tool")
def get_weather(arguments: str) -> str:
    """The tool (a real one would call a weather API, with ``idempotency_headers()``)."""
    try:
        city = str(json.loads(arguments)["city"])
    except (ValueError, KeyError, TypeError):
        return "error: arguments must be a JSON object with a 'city'"
    return CITIES.get(city, f"no weather known for {city}")


@agent("chat", budget=Budget(usd=0.50, tokens=200_000))
async def chat(ctx: Context, chat: Chat) -> Answer:
    messages = [
        Message.system("You answer questions about the weather. Use get_weather."),
        Message.user(chat.question),
    ]
    calls = 0
    for turn in range(1, chat.max_turns + 1):
        answer = await ctx.llm(MODEL, messages, tools=[WEATHER], stream=True, max_tokens=400)
        messages.append(answer.message())
        if not answer.tool_calls:
            return Answer(text=answer.text, turns=turn, tool_calls=calls)
        for call in answer.tool_calls:
            calls += 1
            if call.name == WEATHER.name:
                result = await ctx.step(get_weather, call.arguments)
            else:
                result = f"error: no tool named {call.name!r}"
            messages.append(Message.tool(call.id, result))
    return Answer(text="(no answer within the turn limit)", turns=chat.max_turns, tool_calls=calls)
