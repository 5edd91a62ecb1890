"""``ctx.continue_as_new`` on a real nats-server: chains, signals and cancels sent to the first
id, a parent told once, ``Client.result`` on any id, a SIGKILL between the next run's start and
the old run's end."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio

from sojourn.actors import Agent, Client, RunCancelledError, Worker
from sojourn.actors.cli._projector import running_projector
from sojourn.actors.client.watching import follow_history
from sojourn.actors.history.chain import chain_run_id, current_run
from sojourn.broker import EmbeddedServer
from sojourn.broker.connection import ConnectOptions
from sojourn.broker.topology import ensure_topology
from sojourn.schemas import RunCompleted, RunStarted, SignalReceived, WaitCompleted
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import InvalidName
from sojourn.schemas.names import CHAIN_RUN_ID, reserved_run_id
from tests.actors.agents.test_waits import events_of, until_state
from tests.apps import chains
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for
from tests.procs import WorkerProc

AGENTS: list[Agent[Any, Any]] = [
    chains.chat,
    chains.looper,
    chains.chain_parent,
    chains.catcher,
]


@pytest_asyncio.fixture
async def worker(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Worker]:
    async with Worker(AGENTS, nats=nats_server.url, settings=settings) as w:
        yield w


def test_chain_ids_are_valid_deterministic_and_reserved() -> None:
    assert chain_run_id("conv-1", 2) == "conv-1-g2"
    long = "x" * 128
    ids = {chain_run_id(long, g) for g in range(2, 50)}
    assert len(ids) == 48
    for rid in ids:
        assert len(rid) <= 128 and CHAIN_RUN_ID.fullmatch(rid)
    assert chain_run_id(long, 7) == chain_run_id(long, 7)
    assert reserved_run_id("conv-1-g2") is not None
    assert reserved_run_id("conv-1-g1") is None  # generation 1 is the root's own id
    assert reserved_run_id("conv-g") is None and reserved_run_id("order-2") is None


async def test_client_refuses_a_chain_form_run_id(client: Client) -> None:
    with pytest.raises(InvalidName, match="continue_as_new"):
        await client.start("chat", chains.Talk(), run_id="mine-g2")


async def test_a_chain_of_three_with_signals_sent_to_the_first_id(
    worker: Worker, client: Client
) -> None:
    root = await client.start("chat", chains.Talk(until=3), run_id="conv-1", wait=True)
    await until_state(client, root, lambda s: s.status == "waiting", what="waiting")
    await client.signal(root, "say", "a")
    g2 = await until_state(client, "conv-1-g2", lambda s: s.status == "waiting")
    # The first run ended, saying where the conversation went; its handle still works.
    first = await client.state(root)
    assert first.status == "completed" and first.continued_as == "conv-1-g2"
    assert g2.chain_root == root and g2.generation == 2 and g2.previous_run_id == root
    await client.signal(root, "say", "b")  # to the first id: forwarded to generation 2
    await until_state(client, "conv-1-g3", lambda s: s.status == "waiting")
    await client.signal(root, "say", "c")  # two hops now
    assert await client.result(root, timeout=30) == ["a", "b", "c"]
    assert await client.result("conv-1-g2", timeout=30) == ["a", "b", "c"]
    # Each run's history starts afresh; every signal was recorded once, in the run that took it.
    for rid, said in ((root, "a"), ("conv-1-g2", "b"), ("conv-1-g3", "c")):
        events = await events_of(client, rid)
        assert sum(isinstance(e, RunStarted) for e in events) == 1
        received = [e for e in events if isinstance(e, SignalReceived)]
        assert [bytes(e.payload) for e in received] == [f'"{said}"'.encode()], rid
    last = (await events_of(client, "conv-1-g3"))[0]
    assert isinstance(last, RunStarted)
    assert (last.chain_root, last.generation, last.previous_run_id) == (root, 3, "conv-1-g2")
    found, _ = await current_run(client.broker, client.names, root)
    assert found == "conv-1-g3" == await client.current_run("conv-1-g2")


async def test_a_signal_waiting_at_the_continue_is_carried_to_the_next_run(
    worker: Worker, client: Client
) -> None:
    root = await client.start("chat", chains.Talk(until=2), run_id="carry-1", wait=True)
    await until_state(client, root, lambda s: s.status == "waiting", what="waiting")
    # Two signals at once: the first run takes one, the other must not be lost.
    await client.signal(root, "say", "x", signal_id="s-x")
    await client.signal(root, "say", "y", signal_id="s-y")
    assert await client.result(root, timeout=30) == ["x", "y"]
    g2 = await events_of(client, "carry-1-g2")
    taken = [e for e in g2 if isinstance(e, WaitCompleted)]
    assert [e.signal_id for e in taken] == ["s-y"]


async def test_a_cancel_sent_to_the_first_id_reaches_the_current_run(
    worker: Worker, client: Client
) -> None:
    root = await client.start("chat", chains.Talk(until=5), run_id="stop-1", wait=True)
    await until_state(client, root, lambda s: s.status == "waiting", what="waiting")
    await client.signal(root, "say", "a")
    await until_state(client, "stop-1-g2", lambda s: s.status == "waiting")
    await client.cancel(root, "enough")
    await until_state(client, "stop-1-g2", lambda s: s.status == "cancelled")
    with pytest.raises(RunCancelledError):
        await client.result(root, timeout=30)


async def test_a_child_that_continues_as_new_notifies_its_parent_once(
    worker: Worker, client: Client
) -> None:
    run_id = await client.start("chain_parent", None, run_id="fam-9", wait=True)
    assert await client.result(run_id, timeout=30) == 30
    kid = "fam-9-c0"
    # looper: 0 -> 1 (continue) -> 2 (continue) -> 3 (return 30): three runs.
    assert (await client.state(kid)).continued_as == "fam-9-c0-g2"
    assert (await client.state("fam-9-c0-g2")).continued_as == "fam-9-c0-g3"
    last = await client.state("fam-9-c0-g3")
    assert last.parent_run_id == run_id and last.chain_root == kid
    assert await client.result(kid, timeout=30) == 30
    events = await events_of(client, run_id)
    notices = [e for e in events if isinstance(e, SignalReceived)]
    done = [e for e in events if isinstance(e, WaitCompleted)]
    assert len(done) == 1 and done[0].key == f"child:{kid}"
    # One end notice at most (the parent may also have read the chain's end directly).
    assert len(notices) <= 1
    assert all(e.name == f"sojourn-child.{kid}" for e in notices)


async def test_continue_as_new_cannot_be_caught_by_except_exception(
    worker: Worker, client: Client
) -> None:
    run_id = await client.start("catcher", None, run_id="catch-1", wait=True)
    assert await client.result(run_id, timeout=30) == "second"
    assert (await client.state(run_id)).continued_as == "catch-1-g2"


async def test_a_sigkill_between_the_next_start_and_the_end_starts_the_next_run_once(
    nats_server: EmbeddedServer, client: Client, settings: Settings
) -> None:
    crashing = WorkerProc(
        nats_server.url,
        settings.prefix,
        "tests.apps.chains",
        SOJOURN_FAULTS="continued",
        SOJOURN_FAULT_RATE="1",
    )
    await crashing.ready()
    try:
        root = await client.start("looper", 1, run_id="crash-1")

        async def died() -> bool:
            return crashing.proc.poll() is not None

        await wait_for(died, timeout=60, what="the worker to die at the seam")
    finally:
        crashing.kill()
    # The next run exists, the old one has not recorded its end.
    assert (await client.state(root)).status == "running"
    assert (await client.state("crash-1-g2")).previous_run_id == root
    healthy = await WorkerProc(nats_server.url, settings.prefix, "tests.apps.chains").ready()
    try:
        assert await client.result(root, timeout=60) == 30
    finally:
        healthy.stop()
    g2 = await events_of(client, "crash-1-g2")
    assert sum(isinstance(e, RunStarted) for e in g2) == 1
    ends = [e for e in await events_of(client, root) if isinstance(e, RunCompleted)]
    assert [e.continued_as for e in ends] == ["crash-1-g2"]
    assert (await client.state("crash-1-g2")).continued_as is None  # 2 -> 3: returned 30


async def test_the_history_watch_follows_the_chain(worker: Worker, client: Client) -> None:
    root = await client.start("looper", 0, run_id="watch-1", wait=True)
    assert await client.result(root, timeout=30) == 30
    seen: list[RunStarted] = []
    ends: list[RunCompleted] = []
    async for d in follow_history(client.broker, client.names, root):
        seen += [e for e in d.events if isinstance(e, RunStarted)]
        ends += [e for e in d.events if isinstance(e, RunCompleted)]
    assert [e.run_id for e in seen] == [root, "watch-1-g2", "watch-1-g3"]
    assert [e.continued_as for e in ends] == ["watch-1-g2", "watch-1-g3", None]


async def test_a_long_chain_is_crossed_by_probing_not_run_by_run(client: Client) -> None:
    """A chain of 40 runs written directly: from its first id, ``current_run`` finds the
    40th with a few dozen direct gets (the walk stops after ``WALK`` runs and probes)."""
    await ensure_topology(client.broker, client.names, client.settings, consumers=False)
    store = client.store
    root = "long-1"
    ids = [root] + [chain_run_id(root, g) for g in range(2, 41)]
    for g, rid in enumerate(ids, 1):
        started = RunStarted(
            run_id=rid,
            agent="chat",
            input=msgspec.Raw(b"null"),
            chain_root=None if g == 1 else root,
            previous_run_id=None if g == 1 else ids[g - 2],
            generation=g,
        )
        seq = await store.append(rid, [started], expected_seq=0, writer="test")
        if g < 40:
            end = RunCompleted(output=msgspec.Raw(b"null"), continued_as=ids[g])
            await store.append(rid, [end], expected_seq=seq, writer="test")
    reads = 0
    real = client.broker.direct_get_last

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return await real(*args, **kwargs)

    client.broker.direct_get_last = counted  # type: ignore[method-assign]
    try:
        found, last = await current_run(client.broker, client.names, root)
    finally:
        client.broker.direct_get_last = real  # type: ignore[method-assign]
    assert found == ids[-1] and last is not None
    assert reads <= 20, reads  # one by one it would be 40


async def test_cli_commands_sent_to_the_first_id_follow_the_chain(
    worker: Worker, client: Client, nats_server: EmbeddedServer, settings: Settings
) -> None:
    root = await client.start("chat", chains.Talk(until=3), run_id="cli-1", wait=True)
    await until_state(client, root, lambda s: s.status == "waiting", what="waiting")
    await client.signal(root, "say", "a")
    await until_state(client, "cli-1-g2", lambda s: s.status == "waiting")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        opts = ["--nats", nats_server.url, "--prefix", settings.prefix]
        return subprocess.run(
            [PYTHON, "-m", "sojourn.actors.cli", *args, *opts],
            capture_output=True,
            text=True,
            env=subprocess_env(),
            cwd=ROOT,
        )

    said = await asyncio.to_thread(cli, "signal", root, "say", "--payload", '"b"')
    assert said.returncode == 0, said.stderr
    assert "its chain's current run is cli-1-g2" in said.stdout
    await until_state(client, "cli-1-g3", lambda s: s.status == "waiting")
    stopped = await asyncio.to_thread(cli, "cancel", root, "--reason", "enough")
    assert stopped.returncode == 0, stopped.stderr
    assert "cli-1-g3" in stopped.stdout and "nothing to cancel" not in stopped.stdout
    await until_state(client, "cli-1-g3", lambda s: s.status == "cancelled")


async def test_client_watch_follows_the_chain_to_its_last_run(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> None:
    opts = ConnectOptions(url=nats_server.url)
    async with (
        running_projector(opts, settings, sqlite=tmp_path / "runs.sqlite3"),
        Worker(AGENTS, nats=nats_server.url, settings=settings),
    ):
        root = await client.start("looper", 0, run_id="watched-1", wait=True)
        seen: list[tuple[str, str]] = []
        async with contextlib.aclosing(client.watch(root, timeout=60)) as views:
            async for view in views:
                seen.append((view.run_id, view.status))
    assert seen[-1][1] == "completed" and seen[-1][0] != root  # the chain's last run
    assert (root, "completed") in seen  # the first run's end, then on
    assert await client.result(root, timeout=30) == 30
