"""``signup`` changed without a patch: what ``sojourn replay`` must catch before a deploy."""

from __future__ import annotations

from sojourn.actors import Context, agent
from tests.apps.deploy_v1 import Signup, create_account, finish, park
from tests.apps.deploy_v2 import send_welcome_sms


@agent("signup")
async def signup(ctx: Context, req: Signup) -> str:
    await ctx.step(create_account, req.user)
    await ctx.step(send_welcome_sms, req.user)
    await park(ctx, req)
    await ctx.step(finish, req.user)
    return "v3"
