"""The smallest sojourn agent. Try: ``sojourn dev --app examples.greeter``, then
``sojourn start greeter --input '{"name": "Ada"}' --wait``."""

import msgspec

from sojourn.actors import Context, agent


class Greeting(msgspec.Struct):
    name: str


def compose(name: str) -> str:
    return f"Hello, {name}!"


async def deliver(text: str) -> int:
    print(text)  # a real agent calls an API here, passing current_step().idempotency_key
    return len(text)


@agent("greeter")
async def greeter(ctx: Context, req: Greeting) -> str:
    text = await ctx.step(compose, req.name)  # recorded: never composed twice
    await ctx.step(deliver, text)
    return text
