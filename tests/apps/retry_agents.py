"""Agents for the retry, in-doubt and fencing tests that need real worker processes.

Every step body appends ``<event> <pid> <step> <idempotency key> <attempt>`` lines to
``$SOJOURN_TEST_LOG`` (fsynced), so a test can tell which process ran which attempt of which
step, across kills, stops and take-overs. The first attempt of a *slow* step takes
``$SOJOURN_SLOW_STEP`` seconds (default 30): the window in which a test kills or stops the
worker running it. Later attempts are quick, so a worker taking over finishes at once (unless
``$SOJOURN_SLOW_ATTEMPTS``, a comma-separated list, names more slow attempts than "1").

``$SOJOURN_TEST_LEDGER`` is the "external system" of the reconcile agent: ``<key> <value>``
lines, one per effect that happened.
"""

from __future__ import annotations

import os
import time
from typing import Any

from sojourn.actors import NOT_DONE, Context, RetryableError, StepError, agent, current_step, step


def _write(path_var: str, line: str) -> None:
    with open(os.environ[path_var], "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _log(event: str) -> None:
    info = current_step()
    _write(
        "SOJOURN_TEST_LOG",
        f"{event} {os.getpid()} {info.name} {info.idempotency_key} {info.attempt}",
    )


def _maybe_slow() -> None:
    """Announce the attempt; on a slow attempt, take long enough to be killed or stopped."""
    _log("exec")
    slow_attempts = os.environ.get("SOJOURN_SLOW_ATTEMPTS", "1").split(",")
    if str(current_step().attempt) in slow_attempts:
        deadline = time.monotonic() + float(os.environ.get("SOJOURN_SLOW_STEP", "30"))
        while time.monotonic() < deadline:
            time.sleep(0.02)
    _log("done")


def quick(n: int) -> int:
    _log("exec")
    return n * 10


def slow(n: int) -> int:
    _maybe_slow()
    return n * 10


# --- a retry schedule across a crash --------------------------------------------------------


def throttled(n: int) -> int:
    """Attempt 1 is answered "429, retry after $SOJOURN_RETRY_AFTER seconds"."""
    _log("exec")
    if current_step().attempt == 1:
        raise RetryableError(
            "429 Too Many Requests", retry_after=float(os.environ.get("SOJOURN_RETRY_AFTER", "4"))
        )
    return n * 10


@agent("throttled")
async def throttled_agent(ctx: Context, n: int) -> list[int]:
    return [await ctx.step(quick, n), await ctx.step(throttled, n + 1)]


# --- in-doubt policies ------------------------------------------------------------------------


@agent("doubt_retry")
async def doubt_retry(ctx: Context, n: int) -> list[int]:
    """``quick, slow, quick, quick``: the slow step (position 1) has the default policy."""
    return [
        await ctx.step(quick, n),
        await ctx.step(slow, n + 1),
        await ctx.step(quick, n + 2),
        await ctx.step(quick, n + 3),
    ]


@step(name="charge_ask", in_doubt="ask")
def charge_ask(cents: int) -> str:
    _maybe_slow()
    return f"ch_{cents}_attempt{current_step().attempt}"


@agent("doubt_ask")
async def doubt_ask(ctx: Context, cents: int) -> dict[str, Any]:
    """Position 0 quick, 1 an in-doubt="ask" charge, 2 quick (only if the charge did not fail)."""
    await ctx.step(quick, 0)
    try:
        charge = await ctx.step(charge_ask, cents)
    except StepError as e:
        return {"charge": None, "error": e.error_type}
    await ctx.step(quick, 2)
    return {"charge": charge, "error": None}


def _ledger() -> dict[str, str]:
    path = os.environ["SOJOURN_TEST_LEDGER"]
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return dict(line.split(" ", 1) for line in f.read().splitlines() if line)


def reconcile_charge(key: str) -> Any:
    """Ask the "payment provider" whether the charge with this idempotency key happened."""
    found = _ledger().get(key)
    _write("SOJOURN_TEST_LOG", f"reconcile {os.getpid()} charge_reconciled {key} {found or '-'}")
    return NOT_DONE if found is None else found


@step(name="charge_reconciled", in_doubt=reconcile_charge)
def charge_reconciled(effect_first: bool) -> str:
    """With ``effect_first`` the charge lands before the slow part (a kill then leaves the
    effect done but unrecorded); otherwise it lands only at the end."""
    info = current_step()
    value = f"ch_{info.attempt}"
    if effect_first:
        _write("SOJOURN_TEST_LEDGER", f"{info.idempotency_key} {value}")
    _maybe_slow()
    if not effect_first:
        _write("SOJOURN_TEST_LEDGER", f"{info.idempotency_key} {value}")
    return value


@agent("doubt_reconcile")
async def doubt_reconcile(ctx: Context, effect_first: bool) -> list[Any]:
    return [
        await ctx.step(quick, 0),
        await ctx.step(charge_reconciled, effect_first),
        await ctx.step(quick, 2),
    ]
