"""A deploy under parked runs: 100 runs parked by v1 workers, the workers replaced by v2 which
guards its changed step with ``ctx.patched``. Real worker processes, a real server.

Every run completes; runs that sent their welcome under v1 keep the old branch, runs started
under v2 take the new one; no step body runs twice; none is suspended. ``sojourn replay``
checks the same histories offline: clean against v1 and v2, a divergence against v3 (the same
change without a patch).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from sojourn.actors import Client
from sojourn.broker.server import EmbeddedServer
from sojourn.schemas.codec import encode
from sojourn.schemas.config import Settings
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for
from tests.procs import WorkerProc

OLD_TIMER, OLD_SIGNAL, NEW_TIMER, NEW_SIGNAL = 50, 50, 10, 10


@pytest.fixture
def workers() -> Iterator[list[WorkerProc]]:
    started: list[WorkerProc] = []
    yield started
    for w in started:
        w.stop()


def executions(log: Path) -> Counter[tuple[str, str]]:
    """How often each step body ran, by (step, run id)."""
    counts: Counter[tuple[str, str]] = Counter()
    if log.exists():
        for line in log.read_text().splitlines():
            _, step, key, _ = line.split()
            counts[(step, key.rsplit("/", 1)[0])] += 1
    return counts


async def all_in(client: Client, runs: list[str], status: str) -> bool:
    histories = await asyncio.gather(*(client.history(r) for r in runs))
    if not all(histories):
        return False  # not every start has been taken in yet
    states = await asyncio.gather(*(client.state(r) for r in runs))
    return all(s.status == status for s in states)


async def test_a_deploy_under_parked_runs_keeps_old_runs_on_the_old_branch(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    workers: list[WorkerProc],
    tmp_path: Path,
) -> None:
    log = tmp_path / "effects.log"
    url, prefix = nats_server.url, settings.prefix

    async def start_workers(module: str) -> None:
        procs = [WorkerProc(url, prefix, module, SOJOURN_TEST_LOG=str(log)) for _ in range(2)]
        workers.extend(procs)
        await asyncio.gather(*(p.ready() for p in procs))

    await start_workers("tests.apps.deploy_v1")
    # Old timer runs wake a few seconds from now: by then no v1 worker is left, so the wake
    # waits for v2 (the timer is the broker's, not a worker's).
    until = time.time() + 8.0
    old_timer = [
        await client.start("signup", {"user": f"ot{i}", "park": "timer", "until": until})
        for i in range(OLD_TIMER)
    ]
    old_signal = [
        await client.start("signup", {"user": f"os{i}", "park": "signal"})
        for i in range(OLD_SIGNAL)
    ]
    old = old_timer + old_signal
    await wait_for(lambda: all_in(client, old, "waiting"), 120, what="v1 runs to park")

    # Keep one history per kind as it was under v1, for the offline replay check below.
    for name, run in (("timer", old_timer[0]), ("signal", old_signal[0])):
        history = await client.history(run)
        body = [{"seq": d.seq, "writer": d.writer, "events": list(d.events)} for d in history]
        (tmp_path / f"{name}.json").write_bytes(encode(body))

    for w in list(workers):  # the deploy: v1 goes (SIGTERM), v2 comes
        w.stop()
        workers.remove(w)
    for run in old_signal[: OLD_SIGNAL // 2]:  # signals sent while no worker is up queue
        await client.signal(run, "confirm", {"ok": True})
    await start_workers("tests.apps.deploy_v2")

    new_timer = [
        await client.start("signup", {"user": f"nt{i}", "park": "timer", "until": 0.0})
        for i in range(NEW_TIMER)
    ]
    new_signal = [
        await client.start("signup", {"user": f"ns{i}", "park": "signal"})
        for i in range(NEW_SIGNAL)
    ]
    await wait_for(lambda: all_in(client, new_signal, "waiting"), 120, what="v2 runs to park")
    for run in old_signal[OLD_SIGNAL // 2 :] + new_signal:
        await client.signal(run, "confirm", {"ok": True})

    every = old + new_timer + new_signal
    await wait_for(lambda: all_in(client, every, "completed"), 180, what="every run to end")
    results = await asyncio.gather(*(client.result(r) for r in every))
    outputs = dict(zip(every, results, strict=True))
    assert {outputs[r] for r in old} == {"old"}
    assert {outputs[r] for r in new_timer + new_signal} == {"new"}

    ran = executions(log)
    assert all(n == 1 for n in ran.values()), [k for k, n in ran.items() if n > 1]
    for run in old:
        assert ran[("send_welcome", run)] == 1 and ("send_welcome_sms", run) not in ran
    for run in new_timer + new_signal:
        assert ran[("send_welcome_sms", run)] == 1 and ("send_welcome", run) not in ran
    for run in every:
        assert ran[("create_account", run)] == ran[("finish", run)] == 1

    # Offline, the v1 histories replay cleanly against v1 and v2, and v3 (the change made
    # without a patch) is refused with the position and both step names.
    files = [str(tmp_path / "timer.json"), str(tmp_path / "signal.json")]
    for module in ("tests.apps.deploy_v1", "tests.apps.deploy_v2"):
        ok = replay(module, files)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert ok.stdout.count(" ok") == 2, ok.stdout
    bad = replay("tests.apps.deploy_v3", files)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert (
        bad.stdout.count(
            "diverges at position 1: recorded step 'send_welcome', "
            "code now calls step 'send_welcome_sms'"
        )
        == 2
    ), bad.stdout


def replay(module: str, files: list[str]) -> subprocess.CompletedProcess[str]:
    args = [PYTHON, "-m", "sojourn.actors.cli", "replay", "--app", module]
    for f in files:
        args += ["--from-file", f]
    return subprocess.run(
        args, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=120
    )
