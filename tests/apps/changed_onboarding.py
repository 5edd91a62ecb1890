"""``onboarding`` with its welcome step swapped for another without ``ctx.patched``: the
deliberate change that ``sojourn replay`` must report against the golden histories."""

from __future__ import annotations

from examples.onboarding import (
    MODEL,
    Hire,
    Onboarded,
    it_provision,
    send_welcome_packet,
    welcome_prompt,
)
from sojourn.actors import Context, agent

__all__ = ["it_provision", "onboarding"]


def send_welcome_email(hire: Hire, note: str, link: str | None = None) -> str:
    return send_welcome_packet(hire, note, link)


@agent("onboarding")
async def onboarding(ctx: Context, hire: Hire) -> Onboarded:
    note = (await ctx.llm(MODEL, welcome_prompt(hire), max_tokens=200)).text
    await ctx.step(send_welcome_email, hire, note)
    raise AssertionError("replay stops at the divergence above")
