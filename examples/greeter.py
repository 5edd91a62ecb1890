"""The smallest agent. Run: ``sojourn dev --app examples.greeter``."""

import msgspec

from sojourn.actors import Context, agent, current_step


class Greeting(msgspec.Struct):
    name: str


def compose(name: str) -> str:
    return f"Hello, {name}!"


async def deliver(text: str) -> None:
    print(text, current_step().idempotency_key)  # a real agent calls an API with this key


@agent("greeter")
async def greeter(ctx: Context, req: Greeting) -> str:
    text = await ctx.step(compose, req.name)  # journaled: a replay returns the recorded text
    await ctx.step(deliver, text)
    return text
