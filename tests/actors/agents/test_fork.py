"""Forking a run (``sojourn fork``, decision 0041) on a real nats-server with real workers.

The proof: a ten-step run fails at position 7 (a bug, while a test-owned file exists); its
worker is stopped, the bug fixed (the file removed), a new worker process started, and the
run forked from position 7 completes there, positions 0 to 6 having run once in all (every
step execution is a row in a SQLite database the test owns). The original's stored history
is the same, byte for byte, before and after. And the refusals: a position beyond the history,
an unknown run, ``--from-failure`` of a run that did not fail, asked of the client and, past
its checks, of the intake; a live run forked while it waits, left waiting.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from sojourn.actors import Client, Worker
from sojourn.actors.cli import main as cli_main
from sojourn.actors.cli._projector import running_projector
from sojourn.actors.client.base import TriggerRejected
from sojourn.actors.client.reports import status_report
from sojourn.broker import EmbeddedServer
from sojourn.broker import headers as h
from sojourn.broker.connection import ConnectOptions
from sojourn.schemas.codec import encode, to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import RunNotFound
from sojourn.schemas.events import ForkOrigin, RunStarted, SignalReceived
from sojourn.schemas.wire import ForkBody, IntakeError, StartTrigger
from tests.actors.agents.test_waits import until_state
from tests.apps import forked
from tests.conftest import wait_for
from tests.procs import WorkerProc

TEN = [f"a:{i}" for i in range(10)]


def effects(db: Path) -> list[tuple[str, int, int]]:
    """Every step execution so far: (run, position, attempt)."""
    with sqlite3.connect(db, timeout=30) as c:
        return list(c.execute("SELECT run, position, attempt FROM effects ORDER BY rowid"))


async def stored(client: Client, run_id: str) -> list[tuple[int, bytes, dict[str, str]]]:
    """The run's stored messages as the broker holds them: sequence, bytes, headers."""
    msgs = await client.broker.direct_get_range(
        client.names.events_stream, client.names.events(run_id), 1
    )
    return [(m.seq, bytes(m.data), dict(m.headers or {})) for m in msgs]


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """The effects database and the bug's flag file (present: the bug strikes)."""
    db, bug = tmp_path / "effects.sqlite", tmp_path / "bug"
    bug.touch()
    monkeypatch.setenv("SOJOURN_TEST_FORK_DB", str(db))
    monkeypatch.setenv("SOJOURN_TEST_FORK_BUG", str(bug))
    return db, bug


@pytest_asyncio.fixture
async def worker(
    nats_server: EmbeddedServer, settings: Settings, files: tuple[Path, Path]
) -> AsyncIterator[Worker]:
    async with Worker([forked.ten, forked.waiter], nats=nats_server.url, settings=settings) as w:
        yield w


@pytest.mark.usefixtures("processes")
async def test_a_run_failed_at_step_7_forked_after_the_fix_completes_reusing_steps_0_to_6(
    nats_server: EmbeddedServer, settings: Settings, client: Client, files: tuple[Path, Path]
) -> None:
    db, bug = files
    # The worker processes find the database and the flag file in the environment (``files``).
    buggy = await WorkerProc(nats_server.url, settings.prefix, "tests.apps.forked").ready()
    try:
        await client.start("ten", "a", run_id="orig", wait=True)
        failed = await until_state(client, "orig", lambda s: s.terminal, what="the run's end")
    finally:
        buggy.stop()
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.type == "StepError" and "bug in step 7" in failed.error.message
    assert [p for r, p, _ in effects(db) if r == "orig"] == list(range(8))
    before = await stored(client, "orig")

    bug.unlink()  # the fix, deployed: a new worker process serves the agent
    fixed = await WorkerProc(nats_server.url, settings.prefix, "tests.apps.forked").ready()
    try:
        fork = await client.fork("orig", from_step=7, fork_id="orig-fixed")
        assert fork == "orig-fixed"
        assert await client.result(fork, timeout=60) == TEN
        # --from-failure picks the failed step, position 7.
        again = await client.fork("orig", from_failure=True)
        assert again.startswith("orig-fork-")
        assert await client.result(again, timeout=60) == TEN
        # The same fork id asked for again is the same fork: nothing new.
        receipt = await client.trigger_fork("orig", from_step=3, fork_id="orig-fixed")
        assert receipt.run_id == "orig-fixed" and receipt.created is False
    finally:
        fixed.stop()

    rows = effects(db)
    for position in range(7):  # reused in both forks, never executed again
        assert [r for r, p, _ in rows if p == position] == ["orig"], position
    assert [p for r, p, _ in rows if r == fork] == [7, 8, 9]
    assert [p for r, p, _ in rows if r == again] == [7, 8, 9]
    assert await stored(client, "orig") == before  # the original, byte for byte

    state = await client.state(fork)
    assert state.forked_from == ForkOrigin(run_id="orig", position=7, copied=14)
    assert (await client.state(again)).forked_from == ForkOrigin(
        run_id="orig", position=7, copied=14
    )
    first = (await client.history(fork))[0].events
    assert isinstance(first[0], RunStarted) and first[0].input == failed.input
    assert len(first) == 15  # RunStarted and the copied events of positions 0-6, one message
    report = await status_report(client, fork)
    assert report["forked_from"] == {"run_id": "orig", "position": 7}
    assert report["status"] == "completed"


async def test_refusals_are_clear_and_change_nothing(
    worker: Worker, client: Client, files: tuple[Path, Path]
) -> None:
    db, bug = files
    bug.unlink()
    await client.start("ten", "a", run_id="done", wait=True)
    assert await client.result("done", timeout=30) == TEN
    before = await stored(client, "done")

    with pytest.raises(RunNotFound, match="no run with id 'nobody'"):
        await client.fork("nobody", from_step=0)
    with pytest.raises(TriggerRejected, match="positions 0 to 9") as beyond:
        await client.fork("done", from_step=11)
    assert beyond.value.code == "invalid_fork"
    with pytest.raises(TriggerRejected, match="has not failed") as not_failed:
        await client.fork("done", from_failure=True)
    assert not_failed.value.code == "invalid_fork"
    with pytest.raises(ValueError, match="not both"):
        await client.fork("done", from_step=1, from_failure=True)

    # Past the client's checks, the intake refuses the same (a foreign client, an older one).
    async def asked(fork: ForkBody, agent: str = "ten") -> IntakeError:
        body = encode(StartTrigger(input=to_raw(None), run_id="f-raw", fork=fork))
        subject = client.names.start(agent, None, "f-raw")
        reply = await client._publish_answered(
            subject, body, {h.MSG_ID: f"raw:{fork.run_id}:{fork.from_step}:{agent}"}, 10
        )
        assert isinstance(reply, IntakeError), reply
        return reply

    assert (await asked(ForkBody(run_id="done", from_step=11))).error.code == "invalid_fork"
    assert (await asked(ForkBody(run_id="nobody", from_step=0))).error.code == "unknown_run"
    assert (await asked(ForkBody(run_id="done", from_failure=True))).error.code == "invalid_fork"
    other = await asked(ForkBody(run_id="done", from_step=1), agent="waiter")
    assert other.error.code == "invalid_fork" and "agent 'ten'" in other.error.message
    assert await client.store.last_seq("f-raw") == 0  # nothing was made
    assert await stored(client, "done") == before

    # From the last position plus one: everything recorded is reused, nothing runs again.
    whole = await client.fork("done", from_step=10, fork_id="done-all")
    assert await client.result(whole, timeout=30) == TEN
    assert not [p for r, p, _ in effects(db) if r == whole]


async def test_a_live_run_forked_with_a_signal_goes_on_untouched(
    worker: Worker, client: Client, files: tuple[Path, Path]
) -> None:
    db, _ = files
    await client.start("waiter", "w", run_id="live", wait=True)
    await until_state(client, "live", lambda s: s.status == "waiting", what="the wait")
    before = await stored(client, "live")
    fork = await client.fork("live", from_step=3, signal=("go", "now"), fork_id="live-f")
    assert await client.result(fork, timeout=30) == ["w:0", "w:1", "w:2", "now:3"]
    head = (await client.history(fork))[0].events
    assert isinstance(head[-1], SignalReceived) and head[-1].name == "go"
    # The original still waits, its history as it was; then it goes on by itself.
    assert (await client.state("live")).status == "waiting"
    assert await stored(client, "live") == before
    await client.signal("live", "go", "later")
    assert await client.result("live", timeout=30) == ["w:0", "w:1", "w:2", "later:3"]
    rows = effects(db)
    assert sorted(p for r, p, _ in rows if r == "live") == [0, 1, 2, 4]  # 3: the wait
    assert [p for r, p, _ in rows if r == fork] == [4]

    # A new input: the fork's steps from position 3 on see it; what came before is reused.
    other = await client.fork("live", from_step=0, input="n", fork_id="live-n")
    assert (await client.state(other)).forked_from == ForkOrigin(
        run_id="live", position=0, copied=0
    )
    await until_state(client, other, lambda s: s.status == "waiting", what="the fork's wait")
    await client.signal(other, "go", "x")
    assert await client.result(other, timeout=30) == ["n:0", "n:1", "n:2", "x:3"]


async def test_the_cli_forks_and_status_and_the_view_show_the_link(
    worker: Worker,
    client: Client,
    files: tuple[Path, Path],
    nats_server: EmbeddedServer,
    settings: Settings,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    opts = ConnectOptions(url=nats_server.url)
    async with running_projector(opts, settings, sqlite=tmp_path / "runs.sqlite3"):
        await the_cli_forks(client, files, nats_server, settings, capsys)

        async def viewed() -> bool:
            view = await client.view("cli-fork")
            return view is not None and view.status == "completed"

        await wait_for(viewed, what="the fork's view")
        view = await client.view("cli-fork")
        assert view is not None and (view.forked_from, view.forked_at) == ("cli-orig", 7)
        original = await client.view("cli-orig")
        assert original is not None and original.forked_from is None


async def the_cli_forks(
    client: Client,
    files: tuple[Path, Path],
    nats_server: EmbeddedServer,
    settings: Settings,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await client.start("ten", "a", run_id="cli-orig", wait=True)
    await until_state(client, "cli-orig", lambda s: s.status == "failed", what="the failure")
    files[1].unlink()
    deploy = ["--nats", nats_server.url, "--prefix", settings.prefix]
    argv = ["fork", "cli-orig", "--from-failure", "--run-id", "cli-fork", *deploy]
    assert await asyncio.to_thread(cli_main, argv) == 0
    assert "run_id: cli-fork" in capsys.readouterr().out
    assert await client.result("cli-fork", timeout=30) == TEN
    assert await asyncio.to_thread(cli_main, ["status", "cli-fork", *deploy]) == 0
    shown = [line for line in capsys.readouterr().out.splitlines() if "forked from" in line]
    assert len(shown) == 1 and shown[0].endswith("cli-orig at pos=7"), shown
    code = await asyncio.to_thread(cli_main, ["fork", "cli-orig", "--from-step", "40", *deploy])
    assert code == 1
    assert "invalid_fork" in capsys.readouterr().err


@pytest.mark.usefixtures("processes")
async def test_a_worker_killed_right_after_storing_a_fork_leaves_one_fork_that_runs_once(
    nats_server: EmbeddedServer, settings: Settings, client: Client, files: tuple[Path, Path]
) -> None:
    db, bug = files
    url, prefix = nats_server.url, settings.prefix
    first = await WorkerProc(
        url, prefix, "tests.apps.forked", SOJOURN_FAULTS="forked", SOJOURN_FAULT_RATE="1"
    ).ready()
    try:
        await client.start("ten", "a", run_id="k-orig", wait=True)
        await until_state(client, "k-orig", lambda s: s.status == "failed", what="the failure")
        bug.unlink()
        fork = await client.fork("k-orig", from_step=7, fork_id="k-fork", wait=False)
        await asyncio.to_thread(first.proc.wait, 30)  # it killed itself at the seam
        assert first.proc.returncode == -9
    finally:
        first.kill()
    history = await client.history(fork)
    assert len(history) == 1  # stored whole, not yet executed
    assert not [p for r, p, _ in effects(db) if r == fork]
    second = await WorkerProc(url, prefix, "tests.apps.forked").ready()
    try:
        assert await client.result(fork, timeout=60) == TEN
    finally:
        second.stop()
    rows = effects(db)
    assert [p for r, p, _ in rows if r == fork] == [7, 8, 9]
    for position in range(7):
        assert [r for r, p, _ in rows if p == position] == ["k-orig"], position
    assert isinstance((await client.history(fork))[0].events[0], RunStarted)
