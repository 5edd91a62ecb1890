"""Version 2 of ``signup`` (see ``deploy_v1``): the welcome is now an SMS, behind a patch.

Runs that sent the e-mail under v1 replay the old branch; runs that reach the change under v2
take the new one. The output says which branch the run took.
"""

from __future__ import annotations

from sojourn.actors import Context, agent
from tests.apps.deploy_v1 import Signup, create_account, finish, park, send_welcome
from tests.apps.effects import _log


def send_welcome_sms(user: str) -> str:
    _log("exec")
    return f"sms-{user}"


@agent("signup")
async def signup(ctx: Context, req: Signup) -> str:
    await ctx.step(create_account, req.user)
    if ctx.patched("welcome-sms"):
        await ctx.step(send_welcome_sms, req.user)
        branch = "new"
    else:
        await ctx.step(send_welcome, req.user)
        branch = "old"
    await park(ctx, req)
    await ctx.step(finish, req.user)
    return branch
