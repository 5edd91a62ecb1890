"""An agent whose answer streams out token by token while its step runs.

Run it::

    sojourn dev --app examples.streaming
    sojourn start answerer --input '{"question": "Why is the sky blue?"}'
    sojourn stream RUN            # the tokens as they come; Ctrl-C, then resume:
    sojourn stream RUN --json     # one line per chunk with its offset
    sojourn stream RUN --after 12 # exactly the chunks after offset 12

The "LLM" is fake (deterministic words with a pause between them), so the example needs no API
key. The step streams each token with ``ctx.stream`` and its progress with ``ctx.progress``,
and returns the whole text: that is what the run's history keeps. If the worker dies
mid-answer, another one executes the step again and streams the answer again under a new
execution, which readers can tell apart (``sojourn stream`` says "step restarted").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec

from sojourn.actors import Context, agent

WORDS = (
    "Sunlight is scattered by the molecules of the air, and blue light, having a shorter "
    "wavelength, is scattered far more than red: so blue reaches your eyes from every part "
    "of the sky, while the sun itself looks a little yellow."
).split(" ")


class Question(msgspec.Struct, frozen=True):
    question: str
    tokens: int = 40
    """How many tokens the fake model writes."""
    delay: float = 0.05
    """Seconds between tokens (a real model's pace)."""


async def fake_llm(q: Question) -> AsyncIterator[str]:
    """The tokens of an answer, one at a time, as a streaming LLM API hands them out."""
    for i in range(q.tokens):
        await asyncio.sleep(q.delay)
        yield ("" if i == 0 else " ") + WORDS[i % len(WORDS)]


@agent("answerer")
async def answerer(ctx: Context, q: Question) -> str:
    async def write_answer() -> str:
        parts: list[str] = []
        async for token in fake_llm(q):
            await ctx.stream(token)  # stored and visible to readers before this returns
            parts.append(token)
            if len(parts) % 10 == 0:
                await ctx.progress({"tokens": len(parts), "of": q.tokens})
        return "".join(parts)  # the final text, recorded in the run's history

    return await ctx.step(write_answer)
