"""Agents answering updates (``ctx.on_update``), for tests/actors/worker/test_updates.py.

Every live application of the ``add`` handler inserts a row into the SQLite file named by
``$SOJOURN_TEST_DB`` (not when it is applied again from history: ``ctx.replaying``), so a test
counts how often an update was really applied, across processes and crashes.
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

from sojourn.actors import Context, agent


def _applied(update: str) -> None:
    path = os.environ.get("SOJOURN_TEST_DB")
    if not path:
        return
    with sqlite3.connect(path, timeout=30) as db:
        db.execute("CREATE TABLE IF NOT EXISTS applied (item TEXT)")
        db.execute("INSERT INTO applied (item) VALUES (?)", (update,))


def not_empty(item: str) -> None:
    if not item:
        raise ValueError("an empty item")


def busy(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@agent("cart")
async def cart(ctx: Context, owner: str) -> list[str]:
    """Holds a list of items that updates add to, until the signal ``checkout``."""
    items: list[str] = []

    @ctx.on_update("add", validate=not_empty, type=str)
    def add(item: str) -> dict[str, Any]:
        items.append(item)
        if not ctx.replaying:
            _applied(item)
        return {"count": len(items), "items": list(items)}

    @ctx.on_update("plan")
    async def plan(_: Any) -> str:
        return f"{len(items)} items for {owner}"

    @ctx.on_update("explode")
    def explode(_: Any) -> None:
        items.append("boom")
        raise RuntimeError("the handler broke")

    if owner == "busy":  # a step in flight when the update comes
        await ctx.step(busy, 3.0)
    await ctx.wait_for("checkout")
    return items
