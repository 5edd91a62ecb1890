"""The pytest plugin in a user's project: a throwaway pytest session in a subprocess, with the
default pytest-asyncio settings and two xdist workers, whose tests use ``sojourn_env``. Its
outcomes are the tests' own, and once it is over (ended, or cut short by Ctrl-C) no
nats-server it started runs and no temporary directory it made remains.

The session's ``$TMPDIR`` is a directory of the test's own, so every store directory (and
every server's command line, which names its config file there) is found by path, and
``$SOJOURN_TEST_PIDFILE`` has the plugin list the servers it started."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

PYTEST = (sys.executable, "-m", "pytest")

pytestmark = [pytest.mark.usefixtures("processes"), pytest.mark.timeout(300)]

AGENTS = """
import asyncio
import os
from pathlib import Path

import pytest

from sojourn.actors import Context, agent
from sojourn.actors.testing import SojournEnv


def double(n: int) -> int:
    return 2 * n


@agent("doubler")
async def doubler(ctx: Context, n: int) -> int:
    m = await ctx.step(double, n)
    extra = await ctx.wait_for("add", type=int)
    return m + extra


@pytest.fixture
def sojourn_agents():
    return [doubler]
"""

OUTCOMES = """
@pytest.mark.asyncio
async def test_passes(sojourn_env: SojournEnv) -> None:
    run_id = await sojourn_env.start(doubler, 20)
    await sojourn_env.signal(run_id, "add", 2)
    assert await sojourn_env.result(run_id, type=int) == 42


@pytest.mark.asyncio
async def test_fails(sojourn_env: SojournEnv) -> None:
    run_id = await sojourn_env.start(doubler, 1)
    await sojourn_env.signal(run_id, "add", 1)
    assert await sojourn_env.result(run_id, type=int) == 42
"""

HANGS = """
@pytest.mark.asyncio
async def test_hangs(sojourn_env: SojournEnv) -> None:
    run_id = await sojourn_env.start(doubler, 1)
    Path(os.environ["READY_FILE"]).write_text(run_id)
    await sojourn_env.result(run_id, timeout=600)  # no signal comes: Ctrl-C ends it


@pytest.mark.asyncio
async def test_hangs_too(sojourn_env: SojournEnv) -> None:
    run_id = await sojourn_env.start(doubler, 2)
    await sojourn_env.result(run_id, timeout=600)
"""


class Session:
    """A pytest session in ``root`` (its own rootdir, ``$TMPDIR`` and pid file)."""

    def __init__(self, root: Path, tests: str) -> None:
        self.root = root
        self.tmp = root / "tmp"
        self.tmp.mkdir()
        self.pidfile = root / "servers.txt"
        self.ready = root / "ready.txt"
        (root / "pytest.ini").write_text("[pytest]\n")  # pins the rootdir; defaults otherwise
        (root / "test_user.py").write_text(textwrap.dedent(AGENTS) + textwrap.dedent(tests))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env.update(
            TMPDIR=str(self.tmp),
            SOJOURN_TEST_PIDFILE=str(self.pidfile),
            READY_FILE=str(self.ready),
        )
        self.proc = subprocess.Popen(
            [*PYTEST, "-p", "no:cacheprovider", "-n", "2", "-q", "test_user.py"],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, to Ctrl-C it as a terminal would
            # A terminal's session takes Ctrl-C: undo an ignored SIGINT inherited from whoever
            # started this suite (bash starts a background job with SIGINT and SIGQUIT ignored).
            preexec_fn=_default_sigint,
        )

    def servers(self) -> list[tuple[int, Path]]:
        if not self.pidfile.exists():
            return []
        lines = self.pidfile.read_text().split("\n")
        return [(int(pid), Path(store)) for pid, store in (ln.split(" ", 1) for ln in lines if ln)]

    async def output(self) -> str:
        """The session's output once it has ended (within 240 s). Read on a thread of its own:
        the suite's event loop lives for the whole session, and its default executor (six
        threads here) is shared with every earlier test, some of whose threads may still be
        blocked on a process they read from."""
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="session-output")
        try:
            run = asyncio.get_running_loop().run_in_executor(pool, self.proc.communicate)
            try:
                out, _ = await asyncio.wait_for(run, 240)
            except TimeoutError:
                alive = self.proc.poll() is None
                raise AssertionError(
                    f"no end of the session's output within 240 s (still running: {alive}; "
                    f"its signals: {_signal_state(self.proc.pid)})"
                ) from None
        finally:
            pool.shutdown(wait=False)  # killed by the caller if it hangs: the thread ends then
        return out.decode(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signal_state(pid: int) -> str:
    """The blocked, ignored and caught signal masks of ``pid`` (``/proc/<pid>/status``): a
    session that ignores or blocks SIGINT (bit 2) does not end on a Ctrl-C."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as e:
        return f"unreadable: {e}"
    return ", ".join(ln for ln in lines if ln.startswith(("SigBlk", "SigIgn", "SigCgt")))


def _nats_servers_under(path: Path) -> list[int]:
    """PIDs of the nats-servers whose command line names a file below ``path`` (their config
    is ``<store dir>/nats-server.conf``); zombies have none."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"nats-server" in cmdline and str(path).encode() in cmdline:
            found.append(int(entry.name))
    return found


async def _until(check: object, what: str, timeout: float = 60.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.1)


async def _nothing_left(session: Session) -> None:
    servers = session.servers()
    assert 1 <= len(servers) <= 2, servers  # one per xdist worker that ran a test
    # The session's processes are gone, but a server's exit may trail its parent's by a hair.
    await _until(lambda: not _nats_servers_under(session.tmp), "the servers to exit")
    for pid, store in servers:
        assert store.is_relative_to(session.tmp), store
        assert not store.exists(), store
        assert pid not in _nats_servers_under(Path("/"))
    # pytest's own base temporary directory (pytest-of-<user>) is pytest's to keep.
    assert [p.name for p in session.tmp.iterdir() if p.name.startswith("sojourn-")] == []


def _counts(output: str) -> dict[str, int]:
    summary = output.strip().splitlines()[-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary)}


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads processes from /proc")
async def test_a_user_session_runs_its_tests_and_leaves_nothing(tmp_path: Path) -> None:
    session = Session(tmp_path, OUTCOMES)
    try:
        output = await session.output()
    finally:
        session.kill()
    assert session.proc.returncode == 1, output
    counts = _counts(output)
    assert (counts.get("passed"), counts.get("failed")) == (1, 1), output
    assert "assert 3 == 42" in output, output
    await _nothing_left(session)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads processes from /proc")
async def test_ctrl_c_mid_test_leaves_nothing(tmp_path: Path) -> None:
    session = Session(tmp_path, HANGS)
    try:
        await _until(
            lambda: session.ready.exists() or session.proc.poll() is not None,
            "a test to be running",
            timeout=120,
        )
        assert session.proc.poll() is None, "the session ended before its test ran"
        os.killpg(session.proc.pid, signal.SIGINT)
        output = await session.output()
    finally:
        session.kill()
    assert session.proc.returncode == pytest.ExitCode.INTERRUPTED, output
    await _nothing_left(session)


def test_without_pytest_asyncio_pytest_still_works_and_sojourn_env_says_why(
    tmp_path: Path,
) -> None:
    """Installing sojourn must not break pytest in a project without pytest-asyncio: pytest
    loads the plugin there too. Its other tests run; one asking for ``sojourn_env`` fails
    saying what it needs. (pytest-asyncio is hidden by a module of that name that cannot be
    imported, and its own plugin is not loaded.)"""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "pytest_asyncio.py").write_text("raise ImportError('not installed here')\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_plain.py").write_text(
        "def test_plain() -> None:\n    assert 1 + 1 == 2\n\n\n"
        "def test_env(sojourn_env) -> None:\n    pass\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(hidden), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [*PYTEST, "-p", "no:asyncio", "-p", "no:xdist", "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=120,
    )
    output = done.stdout.decode(errors="replace")
    assert "Error while loading plugin" not in output, output
    counts = _counts(output)
    assert (counts.get("passed"), counts.get("error")) == (1, 1), output
    assert "needs pytest-asyncio" in output, output
