"""Version 1 of ``signup``, the agent of the rolling-deploy test (v2 is ``deploy_v2``).

Each step logs ``exec <step> <idempotency key>`` to ``$SOJOURN_TEST_LOG``, so the test can
tell which branch every run took and that no effect ran twice. A run parks on a timer
(``park="timer"``, until ``until``) or on the signal ``confirm``.
"""

from __future__ import annotations

import msgspec

from sojourn.actors import Context, agent
from tests.apps.effects import _log


class Signup(msgspec.Struct, frozen=True):
    user: str
    park: str  # "timer" or "signal"
    until: float = 0.0


def create_account(user: str) -> str:
    _log("exec")
    return f"acct-{user}"


def send_welcome(user: str) -> str:
    """The step v2 replaces with ``send_welcome_sms``."""
    _log("exec")
    return f"mail-{user}"


def finish(user: str) -> str:
    _log("exec")
    return user


async def park(ctx: Context, req: Signup) -> None:
    if req.park == "timer":
        await ctx.sleep(max(req.until - ctx.now().timestamp(), 0.0))
    else:
        await ctx.wait_for("confirm")


@agent("signup")
async def signup(ctx: Context, req: Signup) -> str:
    await ctx.step(create_account, req.user)
    await ctx.step(send_welcome, req.user)
    await park(ctx, req)
    await ctx.step(finish, req.user)
    return "v1"
