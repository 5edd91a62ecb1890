"""The agent the Node.js client test drives (tests/test_node_client.py, tests/node/client.mjs).

It streams its input words as output chunks (``ctx.stream``) in two steps and waits for the
signal ``go`` in between: the wait holds the run in ``waiting`` until the client has seen that
view and signals, so the client's watch sees an intermediate status for certain, and the chunks
come from two step executions. The output is the words joined, the text the chunks must add up
to.
"""

from __future__ import annotations

from sojourn.actors import Context, agent


@agent("node_stream")
async def node_stream(ctx: Context, words: list[str]) -> str:
    async def speak(part: list[str]) -> str:
        for word in part:
            await ctx.stream(word)
        return "".join(part)

    half = len(words) // 2
    first = await ctx.step(speak, words[:half])
    await ctx.wait_for("go")
    return first + await ctx.step(speak, words[half:])
