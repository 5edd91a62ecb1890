"""MCP tools as journaled steps (``ctx.mcp``), against a real nats-server and a real stdio MCP
server (``tests/mcp_ledger_server.py``) that records every applied call in a SQLite ledger the
test owns. Server processes are SIGKILLed mid-call for real: with ``in_doubt="retry"`` (an
idempotent tool) the call runs again on a fresh server; with ``in_doubt="ask"`` (at most once)
the run is suspended in doubt and the call is never applied twice. A worker process SIGKILLed
after a call was recorded: the next worker replays it, and does not call the server again.
"""

from __future__ import annotations

import importlib
import os
import signal
import sqlite3
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from sojourn.actors import (
    Agent,
    Client,
    Context,
    RetryPolicy,
    RunFailedError,
    StepError,
    Worker,
)
from sojourn.actors.integrations.mcp import McpCallLost, McpServer, McpToolError
from sojourn.broker import EmbeddedServer
from sojourn.schemas import RunEvent, RunSuspended, StepCompleted, StepFailed, StepStarted
from sojourn.schemas.config import Settings
from tests.apps.mcp_agents import ledger_server
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for
from tests.procs import WorkerProc

FAST = RetryPolicy(retry_on=(McpCallLost,), attempts=3, initial_interval=0.1, jitter=0)


class Ledger:
    """The test's view of the server's SQLite ledger."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        if not self.path.exists():
            return []
        db = sqlite3.connect(self.path, timeout=30)
        try:
            return db.execute(sql, args).fetchall()
        except sqlite3.OperationalError:  # a table not created yet
            return []
        finally:
            db.close()

    def calls(self, tool: str, key: str) -> list[int]:
        """The pid of the server process that applied each call of ``tool`` with ``key``."""
        rows = self._rows("SELECT pid FROM calls WHERE tool = ? AND key = ? ORDER BY id", tool, key)
        return [r[0] for r in rows]

    def servers(self) -> list[int]:
        return [r[0] for r in self._rows("SELECT pid FROM servers ORDER BY rowid")]

    async def kill_blocked(self, tool: str, key: str) -> int:
        """Wait until ``tool`` was applied for ``key`` and its server blocks (mid-call),
        SIGKILL that server; return its pid."""

        async def blocked() -> bool:
            return bool(self._rows("SELECT key FROM blocked WHERE key = ?", key))

        await wait_for(blocked, timeout=60, what=f"{tool} {key} to block in the server")
        (pid,) = self.calls(tool, key)
        os.kill(pid, signal.SIGKILL)
        return pid


def read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (reaped, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def wait_gone(pid: int) -> None:
    async def check() -> bool:
        return gone(pid)

    await wait_for(check, timeout=30, what=f"process {pid} to end")


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.sqlite")


async def events_of(client: Client, run_id: str) -> list[RunEvent]:
    return [e for d in await client.history(run_id) for e in d.events]


async def step_events(client: Client, run_id: str, position: int) -> list[tuple[str, int]]:
    return [
        (type(e).__name__, e.attempt)
        for e in await events_of(client, run_id)
        if isinstance(e, (StepStarted, StepCompleted, StepFailed)) and e.position == position
    ]


def agents(ledger: Ledger) -> list[Agent[Any, Any]]:
    server = ledger_server(str(ledger.path), retry=FAST, cost=0.25)

    async def put(ctx: Context, key: str) -> Any:
        return await ctx.mcp("ledger", "put", {"key": key, "value": "v", "block": True})

    async def charge(ctx: Context, key: str) -> Any:
        args = {"key": key, "cents": 5, "block": True}
        return await ctx.mcp("ledger", "charge", args, in_doubt="ask")

    async def failing(ctx: Context, message: str) -> Any:
        try:
            return await ctx.mcp("ledger", "fail", {"message": message})
        except StepError as e:
            return e.error_type

    async def undeclared(ctx: Context) -> Any:
        return await ctx.mcp("nowhere", "put", {})

    return [
        Agent("mcp_put", put, mcp=[server]),
        Agent("mcp_charge", charge, mcp=[server]),
        Agent("mcp_failing", failing, mcp=[server]),
        Agent("mcp_undeclared", undeclared, mcp=[server]),
    ]


@pytest_asyncio.fixture
async def worker(
    nats_server: EmbeddedServer, settings: Settings, ledger: Ledger
) -> AsyncIterator[Worker]:
    w = Worker(agents(ledger), nats=nats_server.url, settings=settings)
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


async def test_an_idempotent_call_cut_off_by_its_server_dying_runs_again_on_a_fresh_one(
    client: Client, worker: Worker, ledger: Ledger
) -> None:
    run_id = await client.start("mcp_put", "k1", run_id="mcp-put")
    killed = await ledger.kill_blocked("put", "k1")
    result = await client.result(run_id, timeout=60)
    assert result == {"key": "k1", "value": "v", "seen": 2}
    first, second = ledger.calls("put", "k1")
    assert first == killed and second != killed and second in ledger.servers()
    assert await step_events(client, run_id, 0) == [
        ("StepStarted", 1),
        ("StepFailed", 1),
        ("StepStarted", 2),
        ("StepCompleted", 2),
    ]
    events = await events_of(client, run_id)
    (failed,) = [e for e in events if isinstance(e, StepFailed)]
    assert failed.error.type == "McpCallLost" and failed.retry_at is not None
    (started, _) = [e for e in events if isinstance(e, StepStarted)]
    assert started.name == "mcp:ledger.put" and started.kind == "tool"
    (done,) = [e for e in events if isinstance(e, StepCompleted)]
    assert done.usage is not None and done.usage.usd == pytest.approx(0.25)

    # The worker holds the fresh server's session; stopping the worker ends that process.
    assert not gone(second)
    await worker.stop()
    await wait_gone(second)


async def test_an_at_most_once_call_cut_off_is_held_in_doubt_and_never_applied_twice(
    client: Client, worker: Worker, ledger: Ledger
) -> None:
    run_id = await client.start("mcp_charge", "c1", run_id="mcp-charge")
    await ledger.kill_blocked("charge", "c1")

    async def suspended(times: int = 1) -> bool:
        events = await events_of(client, run_id)
        n = sum(isinstance(e, RunSuspended) for e in events)
        return n >= times and (await client.state(run_id)).status == "suspended"

    await wait_for(suspended, timeout=60, what="the run to be suspended in doubt")
    state = await client.state(run_id)
    assert state.suspended_reason == "in_doubt"
    assert "'mcp:ledger.charge'" in (state.suspended_detail or "")
    assert f"{run_id}/0" in (state.suspended_detail or "")
    assert await step_events(client, run_id, 0) == [("StepStarted", 1)]

    # Resumed without a decision, it asks again: the server is not called.
    await client.resume(run_id, "no decision yet")
    await wait_for(lambda: suspended(2), timeout=60, what="the run to be suspended again")
    assert len(ledger.calls("charge", "c1")) == 1

    # The operator looked: the charge went through. Skip records it without calling.
    await client.decide(run_id, 0, "skip", "ch_c1_manual", by="ops")
    assert await client.result(run_id, timeout=60) == "ch_c1_manual"
    assert len(ledger.calls("charge", "c1")) == 1
    assert await step_events(client, run_id, 0) == [("StepStarted", 1), ("StepCompleted", 1)]


async def test_a_tool_error_fails_the_step_and_an_undeclared_server_is_refused(
    client: Client, worker: Worker, ledger: Ledger
) -> None:
    run_id = await client.start("mcp_failing", "no way", run_id="mcp-fail")
    assert await client.result(run_id, timeout=60) == McpToolError.__name__
    assert await step_events(client, run_id, 0) == [("StepStarted", 1), ("StepFailed", 1)]

    other = await client.start("mcp_undeclared", None, run_id="mcp-undeclared")
    with pytest.raises(RunFailedError, match="no MCP server 'nowhere'") as failed:
        await client.result(other, timeout=60)
    assert failed.value.error is not None and failed.value.error.type == "KeyError"
    assert not [e for e in await events_of(client, other) if isinstance(e, StepStarted)]


async def test_a_call_recorded_before_a_worker_sigkill_is_replayed_not_repeated(
    nats_server: EmbeddedServer, client: Client, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    env = {"SOJOURN_TEST_MCP_LEDGER": str(ledger.path), "SOJOURN_TEST_MCP_RELEASE": str(release)}
    module = "tests.apps.mcp_agents"
    first = await WorkerProc(nats_server.url, settings.prefix, module, lease_ttl=2.0, **env).ready()
    survivor: WorkerProc | None = None
    try:
        run_id = await client.start("mcp_then_hold", "w1", run_id="mcp-replay")
        holding = Path(f"{release}.holding")

        async def held() -> bool:
            return read(holding) is not None

        await wait_for(held, timeout=60, what="the run to hold after its first call")
        assert read(holding) == str(first.proc.pid)
        (server,) = ledger.servers()
        assert ledger.calls("charge", "w1") == [server]
        first.kill()
        await wait_gone(server)  # its stdio server ends with it (stdin closed)

        survivor = await WorkerProc(
            nats_server.url, settings.prefix, module, lease_ttl=2.0, **env
        ).ready()
        release.write_text("go")
        result = await client.result(run_id, timeout=60)
        assert result == [{"result": "ch_w1_1"}, {"result": "ch_w1-2_1"}]
        assert len(ledger.calls("charge", "w1")) == 1  # replayed, not called again
        (again,) = ledger.calls("charge", "w1-2")
        assert again != server and again in ledger.servers()
        assert await step_events(client, run_id, 0) == [("StepStarted", 1), ("StepCompleted", 1)]
    finally:
        first.stop()
        if survivor is not None:
            survivor.stop()


def test_mcp_servers_are_declared_checked() -> None:
    with pytest.raises(ValueError, match="command or a url"):
        McpServer("x")
    with pytest.raises(ValueError, match="command or a url"):
        McpServer("x", command=["a"], url="http://h/mcp")
    with pytest.raises(ValueError, match="cost"):
        McpServer("x", command=["a"], cost=-1)
    with pytest.raises(ValueError, match="timeout"):
        McpServer("x", url="http://h/mcp", timeout=0)
    s = McpServer("x", command=["a", "b"], costs={"t": 0.5}, cost=0.1)
    assert s.command == ("a", "b") and s.cost_of("t") == 0.5 and s.cost_of("u") == 0.1

    async def fn(ctx: Context) -> None: ...

    with pytest.raises(ValueError, match="same name"):
        Agent("a", fn, mcp=[s, McpServer("x", url="http://h/mcp")])


def test_sojourn_actors_does_not_import_mcp(processes: None) -> None:
    """The extra is optional: declaring and serving agents never imports the SDK."""
    code = (
        "import sys, sojourn.actors; from sojourn.actors import Worker, agent, Context\n"
        "@agent('a')\nasync def a(ctx: Context) -> None: ...\n"
        "Worker([a]); bad = [m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types')]\n"
        "assert not bad, bad"
    )
    subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=subprocess_env(), check=True, timeout=60)


async def test_a_stopped_worker_leaves_no_server_running(
    nats_server: EmbeddedServer, client: Client, settings: Settings, ledger: Ledger
) -> None:
    server = ledger_server(str(ledger.path))

    async def twice(ctx: Context, key: str) -> list[Any]:
        a = await ctx.mcp("ledger", "put", {"key": key, "value": "1"})
        b = await ctx.mcp(server, "put", {"key": key, "value": "2"})
        return [a["seen"], b["seen"]]

    async with Worker(
        [Agent("mcp_twice", twice, mcp=[server])], nats=nats_server.url, settings=settings
    ):
        run_id = await client.start("mcp_twice", "t1", run_id="mcp-twice")
        assert await client.result(run_id, timeout=60) == [1, 2]
        (pid,) = ledger.servers()  # one session, reused by both calls
        assert not gone(pid)
    await wait_gone(pid)


async def test_the_example_sends_the_idempotency_key_its_server_deduplicates_on(
    nats_server: EmbeddedServer,
    client: Client,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """examples/mcp_tools.py against examples/servers/notes_mcp.py: two notes with the same
    text are two calls with two keys (two notes); the key is what the server saw."""
    db = tmp_path / "notes.sqlite"
    monkeypatch.setenv("NOTES_DB", str(db))
    example = importlib.reload(importlib.import_module("examples.mcp_tools"))
    async with Worker([example.note_taker], nats=nats_server.url, settings=settings):
        run_id = await client.start("note-taker", ["milk", "milk"], run_id="notes")
        assert await client.result(run_id, timeout=60) == "published #1: 2 notes"
    conn = sqlite3.connect(db)
    keys = [k for (k,) in conn.execute("SELECT key FROM notes ORDER BY rowid")]
    conn.close()
    assert keys == [f"{run_id}/0", f"{run_id}/1"]


async def test_a_call_unanswered_within_its_timeout_is_in_doubt(
    nats_server: EmbeddedServer, client: Client, settings: Settings, ledger: Ledger
) -> None:
    server = ledger_server(str(ledger.path), timeout=1.0)

    async def slow(ctx: Context, key: str) -> Any:
        args = {"key": key, "cents": 1, "block": True}
        return await ctx.mcp("ledger", "charge", args, in_doubt="ask")

    async with Worker(
        [Agent("mcp_slow", slow, mcp=[server])], nats=nats_server.url, settings=settings
    ):
        run_id = await client.start("mcp_slow", "s1", run_id="mcp-slow")

        async def suspended() -> bool:
            return any(isinstance(e, RunSuspended) for e in await events_of(client, run_id))

        await wait_for(suspended, timeout=60, what="the run to be suspended in doubt")
        (pid,) = ledger.servers()
    state = await client.state(run_id)
    assert state.suspended_reason == "in_doubt"
    assert await step_events(client, run_id, 0) == [("StepStarted", 1)]
    assert len(ledger.calls("charge", "s1")) == 1
    await wait_gone(pid)  # the stopped worker ended even a server stuck in a call
