"""The README's agent. Run: ``sojourn dev --app examples.greeter``."""

import msgspec

from sojourn.actors import Context, agent, current_step


class Greeting(msgspec.Struct):
    name: str
    email: str


def compose(name: str) -> str:
    return f"Hello, {name}!"


async def send(email: str, text: str) -> str:
    key = current_step().idempotency_key  # same on every retry: give it to your email API
    return f"sent to {email} with key {key}"


@agent("greeter")
async def greeter(ctx: Context, req: Greeting) -> str:
    text = await ctx.step(compose, req.name)  # journaled: a replay returns the recorded text
    return await ctx.step(send, req.email, text)
