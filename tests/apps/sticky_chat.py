"""A conversation agent for the sticky-activation crash test
(``tests/actors/worker/test_sticky.py``):
each signal ``msg`` is a turn with one step; ``bye`` ends the run with what was said."""

from __future__ import annotations

from sojourn.actors import Context, agent


async def answer(turn: int, text: str) -> str:
    return f"{turn}:{text}"


@agent("sticky-chat")
async def sticky_chat(ctx: Context) -> list[str]:
    said: list[str] = []
    while True:
        text = await ctx.wait_for("msg")
        if text == "bye":
            return said
        said.append(await ctx.step(answer, len(said) + 1, str(text)))
