"""Agents for concurrency-key tests (decision 0048), run in worker processes and in-process.

``tenant_job`` records, from inside its step, when each run was live (its step's start and
end) in the SQLite file ``$SOJOURN_TEST_LEDGER`` the test owns: the test checks from it that
never more than the key's limit ran at once."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time

import msgspec

from sojourn.actors import Concurrency, Context, agent


class Job(msgspec.Struct, frozen=True):
    tenant: str
    n: int
    work: float = 0.3


def _ledger() -> sqlite3.Connection:
    db = sqlite3.connect(os.environ["SOJOURN_TEST_LEDGER"], timeout=30, isolation_level=None)
    db.execute(
        "CREATE TABLE IF NOT EXISTS live "
        "(run_id TEXT, tenant TEXT, began REAL, ended REAL, pid INTEGER)"
    )
    return db


def _record(run_id: str, tenant: str, began: float, ended: float | None) -> None:
    db = _ledger()
    try:
        db.execute(
            "INSERT INTO live VALUES (?, ?, ?, ?, ?)",
            (run_id, tenant, began, ended, os.getpid()),
        )
    finally:
        db.close()


async def work(run_id: str, tenant: str, seconds: float) -> float:
    began = time.time()
    _record(run_id, tenant, began, None)  # a step cut off by a kill leaves only this row
    await asyncio.sleep(seconds)
    ended = time.time()
    _record(run_id, tenant, began, ended)
    return ended


@agent("tenant_job", concurrency=Concurrency(key=lambda job: job.tenant, limit=2))
async def tenant_job(ctx: Context, job: Job) -> int:
    """A job limited to 2 live runs per tenant (the agent declares its key)."""
    await ctx.step(work, ctx.run_id, job.tenant, job.work)
    return job.n


@agent("ledger_job")
async def ledger_job(ctx: Context, job: Job) -> int:
    """A job started with a concurrency key (``Client.start(..., concurrency=...)``) that
    records when it was live in the test's ledger."""
    await ctx.step(work, ctx.run_id, job.tenant, job.work)
    return job.n


@agent("keyed_wait")
async def keyed_wait(ctx: Context, tag: str) -> str:
    """Lives until it gets the signal ``go``: holds its slot while it waits."""
    await ctx.wait_for("go")
    return tag


@agent("keyed_fast")
async def keyed_fast(ctx: Context, n: int) -> int:
    return n


@agent("keyed_chain")
async def keyed_chain(ctx: Context, n: int) -> int:
    """Waits for ``go``, then continues as new with ``n - 1`` until 0: the chain keeps its
    concurrency slot across its runs."""
    await ctx.wait_for("go")
    if n > 0:
        ctx.continue_as_new(n - 1)
    return n
