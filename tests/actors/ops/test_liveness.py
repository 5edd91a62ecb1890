"""Liveness proofs with real processes: a stopped worker is stalled, a killed one's run resumes
elsewhere, waiting runs are never flagged, a lost timer is overdue and re-woken, a diverged
replay is wedged (issue 5)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sojourn.actors import Client, Context, RunCancelledError, Watchdog, Worker, agent
from sojourn.broker import headers as h
from sojourn.broker.delivery import Delivery
from sojourn.broker.server import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import RunNotFound
from sojourn.schemas.health import Liveness
from tests.actors.cli.test_cli import sojourn
from tests.conftest import PYTHON, ROOT, subprocess_env
from tests.procs import WorkerProc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def gauge_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{name}(?:\{{(.*)\}})? (\S+)$", line)
        if not m:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


class WatchdogProc:
    """``sojourn watchdog`` in its own process, with its /metrics endpoint."""

    def __init__(self, url: str, prefix: str, lease_ttl: float) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "sojourn.actors.cli",
                "watchdog",
                "--nats",
                url,
                "--prefix",
                prefix,
                "--lease-ttl",
                str(lease_ttl),
                "--metrics-port",
                str(self.port),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=subprocess_env(),
        )

    async def metrics(self) -> str:
        return await asyncio.to_thread(scrape, self.port)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


async def until(predicate, timeout: float, what: str, interval: float = 0.1):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = await predicate()
        except (OSError, ConnectionError, RunNotFound):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def parked_on_timer(client: Client, run_id: str) -> None:
    async def parked() -> bool:
        return (await client.state(run_id)).waiting_on == ("timer",)

    await until(parked, 30, "the run to park on its timer")


@pytest.fixture
def procs() -> Iterator[list[WorkerProc | WatchdogProc]]:
    started: list[WorkerProc | WatchdogProc] = []
    yield started
    for p in started:
        if isinstance(p, WorkerProc) and p.proc.poll() is None:
            os.kill(p.proc.pid, signal.SIGCONT)
            p.kill()
        else:
            p.stop()


async def test_a_stopped_worker_is_stalled_and_a_killed_ones_run_resumes_elsewhere(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    procs: list[WorkerProc | WatchdogProc],
) -> None:
    url, prefix, ttl = nats_server.url, settings.prefix, settings.lease_ttl
    a = await WorkerProc(url, prefix, "tests.apps.liveness", lease_ttl=ttl).ready()
    procs.append(a)
    wd = WatchdogProc(url, prefix, ttl)
    procs.append(wd)
    run_id = await client.start("longstep", 7)

    async def running() -> Liveness | None:
        liv = await client.liveness(run_id)
        return liv if liv.state == "running" and liv.details is not None else None

    liv = await until(running, 30, "the step to run and report progress")
    assert liv.step == "long_task" and liv.owner is not None
    assert b'"done"' in bytes(liv.details or b"")

    os.kill(a.proc.pid, signal.SIGSTOP)
    stopped = time.monotonic()

    async def stalled() -> Liveness | None:
        liv = await client.liveness(run_id)
        return liv if liv.state == "stalled" else None

    # How soon is bench.liveness's figure (docs/benchmarks.md); here only that it happens.
    liv = await until(stalled, 60, "the run to show stalled", interval=0.05)
    print(f"\nSIGSTOP -> stalled after {time.monotonic() - stopped:.2f}s")
    assert liv.owner is not None and liv.step == "long_task"
    assert "silent" in (liv.reason or "")

    async def gauge_up() -> bool:
        return gauge_sum(await wd.metrics(), "sojourn_runs", liveness="stalled") >= 1

    await until(gauge_up, 30, "the stalled gauge to rise on /metrics")

    a.kill()
    b = await WorkerProc(url, prefix, "tests.apps.liveness", lease_ttl=ttl).ready()
    procs.append(b)
    assert await client.result(run_id, timeout=60) == 7

    async def gauge_down() -> bool:
        text = await wd.metrics()
        return (
            gauge_sum(text, "sojourn_runs", liveness="stalled") == 0
            and gauge_sum(text, "sojourn_runs") == 0  # the run ended: nothing live is left
        )

    await until(gauge_down, 30, "the stalled gauge to return to 0")
    assert (await client.liveness(run_id)).state == "ended"


# --- in-process agents ---------------------------------------------------------------------


@agent("patient")
async def patient(ctx: Context, kind: str) -> str:
    if kind == "timer":
        await ctx.sleep(timedelta(hours=1))
    elif kind == "signal":
        await ctx.wait_for("never")
    else:  # woken once by a signal, then waits for one that never comes, with a long timeout
        await ctx.wait_for("first")
        await ctx.wait_for("second", timeout=timedelta(days=3))
    return kind


@pytest.fixture
async def watchers(
    nats_server: EmbeddedServer, settings: Settings
) -> AsyncIterator[list[Watchdog]]:
    started: list[Watchdog] = []
    yield started
    for w in started:
        await w.stop()


@pytest.mark.slow(65)
async def test_a_thousand_waiting_runs_raise_no_flag_for_a_minute(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    watchers: list[Watchdog],
) -> None:
    strict = Settings(prefix=settings.prefix, lease_ttl=settings.lease_ttl, overdue_after=1.0)
    flags: list[Liveness] = []

    def seen(liv: Liveness, _before: Liveness | None) -> None:
        if liv.flagged:
            flags.append(liv)

    async with Worker([patient], nats=nats_server.url, settings=settings):
        kinds = ["timer", "signal", "first"] * 333 + ["timer"]
        runs = [await client.start("patient", k) for k in kinds]
        firsts = [r for r, k in zip(runs, kinds, strict=True) if k == "first"]
        wd = await Watchdog(nats=nats_server.url, settings=strict, on_change=seen).start()
        watchers.append(wd)

        async def all_waiting() -> bool:
            await wd.wait_scanned()
            judged = [wd.liveness(r) for r in runs]
            return all(j is not None and j.state == "waiting" for j in judged)

        await until(all_waiting, 120, "1,000 runs to be waiting")
        for r in firsts:
            await client.signal(r, "first", {"go": True})

        async def firsts_moved_on() -> bool:
            states = [await client.state(r) for r in firsts]
            return all(s.waiting_on == ("signal:second", "timer") for s in states)

        await until(firsts_moved_on, 120, "the signalled runs to wait for the next signal")
        watched_from = time.monotonic()
        scans = 0
        while time.monotonic() - watched_from < 60:
            await wd.wait_scanned()
            scans += 1
            judged = [wd.liveness(r) for r in runs]
            assert all(j is not None and j.state == "waiting" for j in judged), [
                j for j in judged if j is None or j.state != "waiting"
            ][:3]
        assert scans >= 30
        assert flags == []
        states = {s.name: s for s in wd.gauges()}
        waiting = sum(
            smp.value
            for smp in states["sojourn_runs"].samples
            if smp.labels["liveness"] == "waiting"
        )
        flagged = sum(
            smp.value
            for smp in states["sojourn_runs"].samples
            if smp.labels["liveness"] in ("stalled", "orphaned", "overdue", "wedged")
        )
        assert (waiting, flagged) == (1000, 0)
        assert wd.actions == 0


@agent("napper")
async def napper(ctx: Context, seconds: float) -> str:
    await ctx.sleep(seconds)
    return "rested"


async def test_a_lost_timer_is_flagged_overdue_and_rewoken_once_by_two_watchdogs(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    watchers: list[Watchdog],
) -> None:
    strict = Settings(prefix=settings.prefix, lease_ttl=settings.lease_ttl, overdue_after=1.0)
    seen: list[tuple[str, str]] = []

    def note(liv: Liveness, _before: Liveness | None) -> None:
        seen.append((liv.run_id, liv.state))

    # No in-process timers: the broker's is the only one, and it is lost.
    broker_only = msgspec.structs.replace(settings, timer_backstop=0.0)
    async with Worker([napper], nats=nats_server.url, settings=broker_only):
        for _ in range(2):
            watchers.append(
                await Watchdog(nats=nats_server.url, settings=strict, on_change=note).start()
            )
        rewakes: list[str] = []

        async def on_wake(msg: Delivery) -> None:
            if msg.header(h.WAKE_REASON).startswith("watchdog"):
                rewakes.append(msg.subject)

        await client.broker.subscribe(f"{client.names.prefix}.wake.>", cb=on_wake)
        run_id = await client.start("napper", 2.0, priority=1)
        await parked_on_timer(client, run_id)
        names = client.names
        purged = await client.broker.api(
            f"$JS.API.STREAM.PURGE.{names.wake_stream}",
            {"filter": f"{names.prefix}.timer.{run_id}.*"},
        )
        assert purged["purged"] == 1  # the timer is gone: nothing will wake the run

        assert await client.result(run_id, timeout=60) == "rested"
    assert (run_id, "overdue") in seen
    assert sum(w.actions for w in watchers) == 1  # two watchdogs, one re-wake
    assert rewakes == [names.wake(run_id, "napper", 1)]  # on the run's lane (priority 1)
    history = await client.history(run_id)
    assert history  # and the run ended normally


FLIP = {"step": "first_version"}


def first_version() -> str:
    return "one"


def second_version() -> str:
    return "two"


@agent("shifty")
async def shifty(ctx: Context, _: None) -> str:
    step = first_version if FLIP["step"] == "first_version" else second_version
    await ctx.step(step)
    await ctx.sleep(0.5)
    return "done"


async def test_a_nondeterministic_replay_shows_wedged_with_the_reason(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    watchers: list[Watchdog],
) -> None:
    FLIP["step"] = "first_version"
    wd = await Watchdog(nats=nats_server.url, settings=settings).start()
    watchers.append(wd)
    # sticky_runs=0: the code is changed in this process, so no activation may be kept across it
    async with Worker([shifty], nats=nats_server.url, settings=settings, sticky_runs=0):
        run_id = await client.start("shifty", None)

        await parked_on_timer(client, run_id)
        FLIP["step"] = "second_version"  # a deploy that changed the code under a live run

        async def wedged() -> Liveness | None:
            liv = await client.liveness(run_id)
            return liv if liv.state == "wedged" else None

        liv = await until(wedged, 30, "the run to show wedged")
    assert liv.reason is not None and liv.reason.startswith("nondeterminism")
    assert "first_version" in liv.reason and "second_version" in liv.reason

    async def watchdog_agrees() -> bool:
        await wd.wait_scanned()
        judged = wd.liveness(run_id)
        return judged is not None and judged.state == "wedged"

    await until(watchdog_agrees, 30, "the watchdog to judge it wedged")
    gauges = {g.name: g for g in wd.gauges()}
    assert any(
        s.labels == {"agent": "shifty", "liveness": "wedged"} and s.value == 1
        for s in gauges["sojourn_runs"].samples
    )
    assert wd.actions == 0  # wedged runs are reported, never re-woken

    # the same judgement from the command line
    common = ("--nats", nats_server.url, "--prefix", settings.prefix, "--lease-ttl", "2")
    listed = await sojourn("watchdog", "--once", *common)
    assert listed.rc == 0, listed.err
    assert "1 live run, 1 flagged" in listed.out
    assert run_id in listed.out and "wedged" in listed.out and "nondeterminism" in listed.out
    as_json = await sojourn("watchdog", "--once", "--json", *common)
    (row,) = [r for r in json.loads(as_json.out) if r["run_id"] == run_id]
    assert row["state"] == "wedged" and row["agent"] == "shifty"
    status = await sojourn("status", run_id, "--json", *common[:4])
    assert status.rc == 0, status.err
    assert json.loads(status.out)["liveness"]["state"] == "wedged"


@agent("brittle")
async def brittle(ctx: Context, _: None) -> str:
    await ctx.sleep(0.2)
    return "fine"


async def test_a_run_whose_activations_keep_failing_is_wedged_until_its_history_moves(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    watchers: list[Watchdog],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sojourn.actors.worker.worker as worker_module
    from sojourn.actors.worker.activation import Activation  # what the worker module runs

    class Broken(Activation):
        async def run(self) -> Any:
            raise RuntimeError("a bug outside the agent's code")

    tight = Settings(
        prefix=settings.prefix, lease_ttl=settings.lease_ttl, max_activation_failures=3
    )
    wd = await Watchdog(nats=nats_server.url, settings=tight).start()
    watchers.append(wd)
    # sticky_runs=0: a kept activation would go on without making the broken one
    async with Worker([brittle], nats=nats_server.url, settings=tight, sticky_runs=0):
        run_id = await client.start("brittle", None)

        await parked_on_timer(client, run_id)
        monkeypatch.setattr(worker_module, "Activation", Broken)

        async def wedged() -> Liveness | None:
            liv = await client.liveness(run_id)
            return liv if liv.state == "wedged" else None

        liv = await until(wedged, 60, "the run to be given up on")
        assert (liv.reason or "").startswith("max_deliveries: 3 activations failed")
        assert "RuntimeError: a bug outside the agent's code" in (liv.reason or "")

        async def watchdog_agrees() -> bool:
            await wd.wait_scanned()
            judged = wd.liveness(run_id)
            return judged is not None and judged.state == "wedged"

        await until(watchdog_agrees, 30, "the watchdog to judge it wedged")
        assert wd.actions == 0
        letters = await client.broker.direct_get_last(
            client.names.dlq_stream, client.names.dlq("other")
        )
        assert letters is not None and b"max_deliveries" in letters.data

        monkeypatch.setattr(worker_module, "Activation", Broken.__mro__[1])  # the bug is fixed
        await client.cancel(run_id, "unstick")  # history moves on: the wedge no longer holds
        with pytest.raises(RunCancelledError):
            await client.result(run_id, timeout=30)
    assert (await client.liveness(run_id)).state == "ended"


async def test_a_step_that_kills_its_worker_every_time_is_wedged_not_retried_forever(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    procs: list[WorkerProc | WatchdogProc],
    tmp_path: Path,
) -> None:
    url, prefix, ttl = nats_server.url, settings.prefix, settings.lease_ttl
    log = tmp_path / "execs.log"
    env = {"SOJOURN_TEST_LOG": str(log), "SOJOURN_TEST_CRASH_LOOP_LIMIT": "3"}
    run_id = await client.start("crashy", None)
    for _ in range(3):  # each worker runs the step once and dies of it
        w = await WorkerProc(url, prefix, "tests.apps.crashy", lease_ttl=ttl, **env).ready()
        procs.append(w)
        await until(lambda w=w: _exited(w), 60, "the worker to die in the step")
    survivor = await WorkerProc(url, prefix, "tests.apps.crashy", lease_ttl=ttl, **env).ready()
    procs.append(survivor)

    async def wedged() -> Liveness | None:
        liv = await client.liveness(run_id)
        return liv if liv.state == "wedged" else None

    liv = await until(wedged, 60, "the run to wait for a human")
    assert (liv.reason or "").startswith("crash_loop: step 'explode' at position 0")
    assert "cut off 3 times in a row" in (liv.reason or "")
    assert survivor.proc.poll() is None  # the fourth worker did not run it again
    assert log.read_text().split() == ["exec", "1", "exec", "2", "exec", "3"]

    common = ("--nats", url, "--prefix", prefix)
    decided = await sojourn("decide", run_id, "0", "skip", "--result", "41", *common)
    assert decided.rc == 0, decided.err
    assert await client.result(run_id, timeout=30) == 42
    assert log.read_text().count("exec") == 3


async def _exited(w: WorkerProc) -> bool:
    return w.proc.poll() is not None
