"""An agent with a compensation, for a worker SIGKILLed in the middle of it.

Every step appends ``<step> <attempt>`` to ``$SOJOURN_TEST_LOG`` (fsynced) as it starts. The
main code's second step hangs until cancelled; the compensation's second step hangs on its
first attempt (the test kills the worker there) and finishes on the next.
"""

from __future__ import annotations

import asyncio
import os

from sojourn.actors import Context, agent, current_step


def log(name: str) -> None:
    path = os.environ["SOJOURN_TEST_LOG"]
    with open(path, "a") as f:
        f.write(f"{name} {current_step().attempt}\n")
        f.flush()
        os.fsync(f.fileno())


async def book(order: str) -> str:
    log("book")
    return f"booking-{order}"


async def wait_for_payment(order: str) -> str:
    log("wait_for_payment")
    await asyncio.sleep(3600)
    return "paid"


async def release_booking(booking: str) -> str:
    log("release_booking")
    return f"released {booking}"


async def notify_customer(order: str) -> str:
    log("notify_customer")
    if current_step().attempt == 1:
        await asyncio.sleep(3600)  # the worker is killed here
    return "notified"


async def compensate(ctx: Context, order: str) -> None:
    await ctx.step(release_booking, f"booking-{order}")
    await ctx.step(notify_customer, order)


@agent("compensating", on_cancel=compensate)
async def compensating(ctx: Context, order: str) -> str:
    await ctx.step(book, order)
    return await ctx.step(wait_for_payment, order)
