"""``onboarding`` with its welcome step swapped for another without ``ctx.patched``: the
deliberate change that ``sojourn replay`` must report against the golden histories."""

from __future__ import annotations

from examples.onboarding import Hire, Onboarded, it_provision, send_welcome_packet
from sojourn.actors import Context, agent

__all__ = ["it_provision", "onboarding"]


def send_welcome_email(hire: Hire) -> str:
    return send_welcome_packet(hire)


@agent("onboarding")
async def onboarding(ctx: Context, hire: Hire) -> Onboarded:
    await ctx.step(send_welcome_email, hire)
    raise AssertionError("replay stops at the divergence above")
