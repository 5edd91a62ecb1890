"""Shared fixtures: one real nats-server per test session, an isolated deployment per test.

Every test gets its own subject/stream prefix, so tests share the server but never each
other's streams. Fault tests that kill, freeze or restart the server start their own
(``own_server``).

The lanes: a test whose fixture closure holds one of ``SERVER_FIXTURES`` (``nats_server``,
``own_server``, ``processes``, or any fixture built on them) is marked ``server``;
``pytest -m "not server"`` runs the rest, the fast lane. A test that starts a nats-server or
any other process in its body requests ``processes``; one not marked ``server`` that tries
fails at once (``pytest_runtest_protocol``), so the marking cannot go stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from pathlib import Path
from typing import Any

# Compiled modules are cached (``__pycache__``, pytest's assertion-rewritten test modules
# among them) even where ``PYTHONDONTWRITEBYTECODE`` is set: without the cache each xdist
# worker compiles and rewrites every test module again, some 15 s of the fast lane's minute,
# and every process a test starts (a worker, the CLI) compiles sojourn again, about 1 s of CPU
# each. Set before anything of sojourn's or the tests' is imported; the processes inherit it.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import pytest  # noqa: E402
import pytest_asyncio  # noqa: E402
from hypothesis import HealthCheck  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402

from sojourn.actors import Client  # noqa: E402
from sojourn.broker import EmbeddedServer  # noqa: E402
from sojourn.schemas.config import Settings  # noqa: E402

# The whole suite runs in parallel with real servers and processes beside the pure tests: how
# fast an example is generated measures the machine's load then, not the test. Every property
# still runs its examples; only the "generation is slow" health check is off.
hypothesis_settings.register_profile("sojourn", suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.load_profile("sojourn")

ROOT = Path(__file__).resolve().parent.parent

SERVER_FIXTURES = frozenset({"nats_server", "own_server", "processes", "sojourn_server"})
"""Fixtures that start a nats-server or another process: a test whose fixture closure holds
one of them is marked ``server`` (the closure includes every fixture built on them).
``sojourn_server`` is the testing kit's (``sojourn.actors.testing.plugin``), under
``sojourn_env``."""


FAST_LANE_EXAMPLES = 4
"""In the fast lane (``-m "not server"``, the inner loop) each property runs a quarter of its
examples (at least ``FAST_LANE_MIN_EXAMPLES``): the same properties, a shallower search, so the
lane answers within a minute. The whole suite (``pytest``, what CI runs) runs every example;
``SOJOURN_FULL_PROPERTIES=1`` does so in the fast lane too."""
FAST_LANE_MIN_EXAMPLES = 10


def _is_fast_lane(config: pytest.Config) -> bool:
    return "not server" in (config.option.markexpr or "") and not os.environ.get(
        "SOJOURN_FULL_PROPERTIES"
    )


def _fewer_examples(items: list[pytest.Item]) -> None:
    for item in items:
        test = getattr(item, "obj", None)
        used = getattr(test, "_hypothesis_internal_use_settings", None)
        if used is None or getattr(test, "_sojourn_fast_lane", False):
            continue  # not a property, or one already scaled (a parametrized one)
        fewer = max(FAST_LANE_MIN_EXAMPLES, used.max_examples // FAST_LANE_EXAMPLES)
        test._hypothesis_internal_use_settings = hypothesis_settings(  # type: ignore[union-attr]
            used, max_examples=min(used.max_examples, fewer)
        )
        test._sojourn_fast_lane = True  # type: ignore[union-attr]


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _is_fast_lane(config):
        _fewer_examples(items)
    for item in items:
        needs = SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if needs:
            item.add_marker(pytest.mark.server)
        elif item.get_closest_marker("server") is not None:
            raise pytest.UsageError(
                f"{item.nodeid}: the server mark comes from fixtures, not by hand: request"
                " `processes` (or nats_server, own_server) instead"
            )
    if _whole_suite(config):
        _both_lanes_hold(items)
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    items[:] = _slow_first(items, workers)


def _slow_first(items: list[pytest.Item], workers: int) -> list[pytest.Item]:
    """The order that starts every ``slow(seconds)`` test first, its share on each worker.

    xdist's worksteal hands each worker one contiguous block of the collection to begin with
    (a block of ``left // workers_left`` tests, in order). A test of 100 s that a block holds
    near its end starts late and alone, and the run waits for it (it did: a minute and more).
    Here the slow tests are shared out longest first, each to the least loaded worker, and
    each worker's share goes at the start of its block. Deterministic (every worker must
    collect the same order); serially, the slow tests simply come first."""
    slow = [it for it in items if it.get_closest_marker("slow") is not None]
    if not slow:
        return items
    shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for it in sorted(slow, key=lambda it: (-_slow_seconds(it), it.nodeid)):
        k = loads.index(min(loads))
        shares[k].append(it)
        loads[k] += _slow_seconds(it)
    rest = [it for it in items if it.get_closest_marker("slow") is None]
    order: list[pytest.Item] = []
    left, taken = len(items), 0
    for k in range(workers):
        block = left // (workers - k)
        left -= block
        fill = max(0, block - len(shares[k]))
        order += shares[k] + rest[taken : taken + fill]
        taken += fill
    return order + rest[taken:]


def _slow_seconds(item: pytest.Item) -> float:
    mark = item.get_closest_marker("slow")
    if mark is None or len(mark.args) != 1 or not isinstance(mark.args[0], int | float):
        raise pytest.UsageError(f"{item.nodeid}: mark it @pytest.mark.slow(seconds)")
    return float(mark.args[0])


def _whole_suite(config: pytest.Config) -> bool:
    """Whether this run is the whole suite, as CI runs it: no paths, marks or keywords given."""
    return (
        config.args_source is pytest.Config.ArgsSource.TESTPATHS
        and not config.option.markexpr
        and not config.option.keyword
    )


def _both_lanes_hold(items: list[pytest.Item]) -> None:
    """The whole suite holds tests of both lanes: were the marking broken, one lane would be
    empty, and ``-m "not server"`` (or ``-m server``) would run nothing and pass."""
    server = sum(item.get_closest_marker("server") is not None for item in items)
    if server == 0 or server == len(items):
        raise pytest.UsageError(
            f"a test lane is empty: {server} of {len(items)} tests are in the server lane"
        )


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """How many xdist workers ``-n auto`` (pyproject's addopts) starts. The fast lane
    (``-m "not server"``) computes: one worker per CPU, as more only add collection (seconds
    each) and contention. A run with the server tests mostly waits on servers, leases and
    timers: three workers per CPU, at most 16 (on 2 CPUs the whole suite took 460 s with 6
    workers against 526 s with 4, the same CPU time packed tighter).
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` or ``-n N`` overrides it."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist reads it
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpus = cpus or 1
    if "not server" in (config.option.markexpr or ""):
        return cpus
    return min(3 * cpus, 16)


@pytest.fixture(scope="session")  # session: module- and session-scoped fixtures may request it
def processes() -> Iterator[None]:
    """Requested by a test or fixture that starts a nats-server or another process itself (an
    ``EmbeddedServer``, a cluster, a worker, the CLI, node, promtool): it puts every test that
    uses it in the ``server`` lane. A whole module:
    ``pytestmark = pytest.mark.usefixtures("processes")``."""
    yield


_UNDECLARED = "this test starts a process: request the `processes` fixture (or nats_server)"


HANG_REPORT_LEAD = 20.0
"""Seconds before a test's hang guard (pytest-timeout) when every running event loop's tasks
are printed with their stacks: the guard's own dump shows only threads, a loop idle in
``select``, never what its tasks await."""


_FRAMES = ("cr_frame", "gi_frame", "ag_frame")
_AWAITS = ("cr_await", "gi_yieldfrom", "ag_await")


def _dump_loop_tasks(nodeid: str) -> None:
    """Print each running loop's tasks, each with the chain of what it awaits, innermost last:
    tasks alike (the same chain) once with their count, those in the project's own code first
    (a library's idle readers, dozens alike, would hide the one that hangs)."""
    loops = [
        o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running()
    ]
    out = [f"\n=== {nodeid}: near its hang guard; the tasks of {len(loops)} running loop(s) ==="]
    root = str(Path(__file__).resolve().parent.parent)
    for loop in loops:
        alike: dict[tuple[str, ...], list[str]] = {}
        for task in list(asyncio.all_tasks(loop)):
            alike.setdefault(_await_chain(task), []).append(task.get_name())
        ours = sorted(alike.items(), key=lambda kv: (not _in_project(kv[0], root), -len(kv[1])))
        for chain, names in ours:
            more = f" and {len(names) - 1} more alike" if len(names) > 1 else ""
            out.append(f"--- {names[0]}{more}")
            out += [f"    {line}" for line in chain]
    sys.stderr.write("\n".join(out) + "\n")
    sys.stderr.flush()


def _in_project(chain: tuple[str, ...], root: str) -> bool:
    return any(line.startswith(root) and "/.venv/" not in line for line in chain)


def _await_chain(task: asyncio.Task[Any]) -> tuple[str, ...]:
    lines: list[str] = []
    awaited: object = task.get_coro()
    while awaited is not None:
        if type(awaited).__name__ == "async_generator_asend":  # into the generator
            gens = [g for g in gc.get_referents(awaited) if hasattr(g, "ag_frame")]
            awaited = gens[0] if gens else None
            continue
        frame = next((getattr(awaited, a) for a in _FRAMES if hasattr(awaited, a)), None)
        if frame is None:
            lines.append(f"awaits {type(awaited).__name__}")
            break
        code = frame.f_code
        lines.append(f"{code.co_filename}:{frame.f_lineno} {code.co_qualname}")
        awaited = next((getattr(awaited, a) for a in _AWAITS if hasattr(awaited, a)), None)
    return tuple(lines)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Around a test not marked ``server`` (its setup, call and teardown), starting a
    nats-server or any process fails with ``_UNDECLARED``: the fast lane really needs no
    broker and no process. ``subprocess.Popen`` is under ``subprocess.run`` and asyncio's
    subprocesses too. A hook rather than an autouse fixture: a module-scoped fixture is set up
    before any function-scoped one, so an autouse fixture would not see it start a server."""
    guard = item.get_closest_marker("timeout")
    limit = (
        float(guard.args[0]) if guard and guard.args else float(item.config.getini("timeout") or 0)
    )
    reporter = None
    if limit > HANG_REPORT_LEAD:
        reporter = threading.Timer(limit - HANG_REPORT_LEAD, _dump_loop_tasks, (item.nodeid,))
        reporter.daemon = True
        reporter.start()
    try:
        if item.get_closest_marker("server") is not None:
            return (yield)
        return (yield from _refusing_processes(item))
    finally:
        if reporter is not None:
            reporter.cancel()


def _refusing_processes(item: pytest.Item) -> Generator[None, object, object]:
    def refuse(*args: object, **kwargs: object) -> Any:
        raise RuntimeError(f"{item.nodeid}: {_UNDECLARED}")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(EmbeddedServer, "start", refuse)
        mp.setattr(subprocess.Popen, "__init__", refuse)
        mp.setattr(asyncio, "create_subprocess_exec", refuse)
        mp.setattr(asyncio, "create_subprocess_shell", refuse)
        return (yield)


@pytest_asyncio.fixture(scope="session")
async def nats_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedServer]:
    server = EmbeddedServer(store_dir=tmp_path_factory.mktemp("nats"), port=0)
    await server.start()
    try:
        yield server
    finally:
        # Killed: its store is thrown away, and a graceful stop of the session's thousands of
        # streams would take the 10 s of stop()'s bound before its own kill.
        server.kill()
        await server.stop()


@pytest_asyncio.fixture
async def own_server(tmp_path: Path) -> AsyncIterator[EmbeddedServer]:
    """A nats-server of the test's own, to kill (``kill()``, then ``start()`` again on the same
    store and port), freeze (SIGSTOP its ``pid``) or stop; stopped at the end, thawed first."""
    server = EmbeddedServer(store_dir=tmp_path / "nats", port=0)
    await server.start()
    try:
        yield server
    finally:
        if server.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.pid, signal.SIGCONT)
        await server.stop()


@pytest.fixture(autouse=True)
def _no_worker_process_outlives_its_test() -> Iterator[None]:
    yield
    from tests.procs import reap_strays  # tests.procs imports this module

    reap_strays()


@pytest.fixture
def settings() -> Settings:
    """A fresh deployment prefix per test, with a short lease so take-overs are quick."""
    return Settings(prefix=f"t{uuid.uuid4().hex[:10]}", lease_ttl=2.0)


@pytest_asyncio.fixture
async def client(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Client]:
    c = await Client.connect(nats_server.url, settings=settings)
    try:
        yield c
    finally:
        await c.close()


async def wait_for(
    predicate: Callable[[], Awaitable[bool]],
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str = "condition",
) -> None:
    """Poll an async predicate until it holds; fail with ``what`` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if await predicate():
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def subprocess_env(**extra: str) -> dict[str, Any]:
    """Environment for child Python processes: the repo root importable (for tests.apps)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


PYTHON = sys.executable
