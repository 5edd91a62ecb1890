"""A deployment with authentication, end to end (docs/operations.md, "Security").

A worker with worker credentials and a client with client credentials start, signal, cancel and
read runs (child runs and timers included) on a server that refuses anonymous connections; the
history records the authenticated user as who sent signals and cancels, and the client cannot
speak for anyone else or use the admin's control subjects. Then ``sojourn dev --auth`` end to
end: credential files, restarts, the CLI with and without them.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from sojourn.actors import Client, RunCancelledError, Worker
from sojourn.broker import Broker, EmbeddedServer, Names
from sojourn.schemas.auth import ROLES, Role
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import PermissionDenied
from sojourn.schemas.events import CancelRequested, SignalReceived
from tests.actors.cli.test_cli import sojourn
from tests.apps.cli_agents import cli_echo, cli_slow
from tests.apps.waits import gated_kid, guardian, napper
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for
from tests.deployments import authenticated_server

PREFIX = "authe2e"
SETTINGS = Settings(prefix=PREFIX, lease_ttl=2.0)
NAMES = Names(PREFIX)
PASSWORDS: dict[str, str] = {role: secrets.token_urlsafe(18) for role in ROLES}
DEADLINE = 60.0


@pytest_asyncio.fixture(scope="module")
async def server(
    processes: None, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[EmbeddedServer]:
    users: dict[str, Role] = {role: role for role in ROLES}
    async with authenticated_server(
        tmp_path_factory.mktemp("nats-e2e"), users, PASSWORDS, PREFIX
    ) as srv:
        yield srv


@pytest_asyncio.fixture(scope="module")
async def worker(server: EmbeddedServer) -> AsyncIterator[Worker]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SOJOURN_SLOW_STEP", "0.2")  # guardian's slow step
        w = Worker(
            [cli_echo, cli_slow, gated_kid, guardian, napper],
            nats=server.url_for("worker"),
            settings=SETTINGS,
        )
        await w.start()
        try:
            yield w
        finally:
            await w.stop()


@pytest_asyncio.fixture(scope="module")
async def client(server: EmbeddedServer, worker: Worker) -> AsyncIterator[Client]:
    c = await Client.connect(server.url_for("client"), settings=SETTINGS)
    try:
        yield c
    finally:
        await c.close()


async def status_is(client: Client, run_id: str, *wanted: str) -> None:
    async def check() -> bool:
        return await client.status(run_id) in wanted

    await wait_for(check, DEADLINE, what=f"run {run_id} to be {' or '.join(wanted)}")


async def test_start_and_result_with_least_privilege(client: Client) -> None:
    assert client.broker.user == "client"
    run_id = await client.start("cli_echo", {"text": "hi"}, wait=True, timeout=DEADLINE)
    assert await client.result(run_id, timeout=DEADLINE) == {"echo": "hi", "loud": "HI"}
    assert await client.status(run_id) == "completed"
    assert (await client.liveness(run_id)).state == "ended"


async def test_signal_is_recorded_as_sent_by_the_user(client: Client) -> None:
    run_id = await client.start("gated_kid", 3, wait=True, timeout=DEADLINE)
    await status_is(client, run_id, "waiting")
    await client.signal(run_id, "go", 7)
    assert await client.result(run_id, timeout=DEADLINE) == 21
    received = [e for d in await client.history(run_id) for e in d.events]
    signals = [e for e in received if isinstance(e, SignalReceived)]
    assert [(s.name, s.sent_by) for s in signals] == [("go", "client")]


async def test_cancel_is_recorded_as_by_the_user(client: Client) -> None:
    run_id = await client.start("cli_slow", 200, wait=True, timeout=DEADLINE)
    await status_is(client, run_id, "running")
    await client.cancel(run_id, "changed my mind")
    with pytest.raises(RunCancelledError):
        await client.result(run_id, timeout=DEADLINE)
    events = [e for d in await client.history(run_id) for e in d.events]
    cancels = [e for e in events if isinstance(e, CancelRequested)]
    assert [(c.reason, c.by) for c in cancels] == [("changed my mind", "client")]


async def test_child_runs_and_timers_under_auth(client: Client) -> None:
    parent = await client.start("guardian", 4, wait=True, timeout=DEADLINE)

    async def has_child() -> bool:
        return bool((await client.state(parent)).children)

    await wait_for(has_child, DEADLINE, what="the child run")
    (child,) = (await client.state(parent)).children
    await status_is(client, child, "waiting")
    await client.signal(child, "go", 5)
    assert await client.result(parent, timeout=DEADLINE) == 20
    nap = await client.start("napper", 0.3, wait=True, timeout=DEADLINE)
    assert await client.result(nap, timeout=DEADLINE) == "woke up"


async def test_the_client_speaks_only_for_itself(client: Client, server: EmbeddedServer) -> None:
    run_id = await client.start("gated_kid", 1, wait=True, timeout=DEADLINE)
    await status_is(client, run_id, "waiting")
    with pytest.raises(PermissionDenied):  # resume is the admin's
        await client.resume(run_id, "please")
    b = client.broker
    for subject in (
        NAMES.signal(run_id, "go", "admin"),
        NAMES.signal(run_id, "go"),
        NAMES.child_end(run_id, "fake", "client"),
    ):
        with pytest.raises(PermissionDenied):
            await b.publish(subject, b"99", timeout=DEADLINE)
    assert await client.status(run_id) == "waiting"
    admin = await Client.connect(server.url_for("admin"), settings=SETTINGS)
    try:
        await admin.signal(run_id, "go", 2)
    finally:
        await admin.close()
    assert await client.result(run_id, timeout=DEADLINE) == 2
    events = [e for d in await client.history(run_id) for e in d.events]
    assert [e.sent_by for e in events if isinstance(e, SignalReceived)] == ["admin"]


async def test_anonymous_clients_are_refused(server: EmbeddedServer) -> None:
    from sojourn.broker.connection import CredentialsError

    with pytest.raises(CredentialsError, match="authorization failed"):
        await Broker.connect(server.url)


# --- sojourn dev --auth ------------------------------------------------------------------------


async def cli(*args: str) -> tuple[int, str, str]:
    r = await sojourn(*args, limit=DEADLINE)
    return r.rc, r.out, r.err


class Dev:
    """``sojourn dev --auth`` in a subprocess, its output read line by line."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.lines: list[str] = []
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Dev:
        self.proc = await asyncio.create_subprocess_exec(
            PYTHON,
            "-m",
            "sojourn.actors.cli",
            "dev",
            "--auth",
            "--app",
            "tests.apps.cli_agents",
            "--port",
            "0",
            "--data-dir",
            str(self.data_dir),
            cwd=ROOT,
            env=subprocess_env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        await self.expect("ready")
        return self

    async def expect(self, needle: str) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE
        while not any(needle in line for line in self.lines):
            remaining = deadline - loop.time()
            assert remaining > 0, f"no {needle!r}: {self.lines}"
            raw = await asyncio.wait_for(self.proc.stdout.readline(), remaining)
            assert raw, f"exited before {needle!r}: {self.lines}"
            self.lines.append(raw.decode().rstrip("\n"))
        return next(line for line in self.lines if needle in line)

    async def __aexit__(self, *exc: object) -> None:
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        try:
            rest = await asyncio.wait_for(proc.stdout.read(), DEADLINE)
            self.lines.extend(rest.decode().splitlines())
            assert await asyncio.wait_for(proc.wait(), DEADLINE) == 0, self.lines
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_dev_auth(processes: None, tmp_path: Path) -> None:
    data = tmp_path / "data"
    auth = data / "auth"
    async with Dev(data) as dev:
        line = await dev.expect("auth: users")
        assert str(auth) in line
        assert mode(auth) == 0o700
        urls = {role: (auth / f"{role}.url").read_text() for role in ROLES}
        for role in ROLES:
            assert mode(auth / f"{role}.url") == 0o600
            assert urls[role].startswith(f"nats://{role}:") and "@127.0.0.1:" in urls[role]
        assert mode(auth / "passwords.json") == 0o600
        assert mode(data / "nats-server.conf") == 0o600
        passwords = json.loads((auth / "passwords.json").read_text())
        assert all(passwords[role] in urls[role] for role in ROLES)
        server_url = (await dev.expect("nats: ")).split("nats: ", 1)[1]
        assert not any(passwords[r] in "\n".join(dev.lines) for r in ROLES)  # never printed

        rc, out, err = await cli(
            "start", "cli_echo", "--input", '{"text": "dev"}', "--wait", "--nats", urls["client"]
        )
        assert rc == 0 and 'output: {"echo":"dev","loud":"DEV"}' in out, (out, err)
        run_id = out.split("run_id: ", 1)[1].split()[0]
        rc, out, err = await cli("status", run_id, "--nats", urls["watchdog"])
        assert rc == 0 and "completed" in out, (out, err)
        rc, out, err = await cli("status", run_id, "--nats", server_url)
        assert rc == 1 and "authorization failed" in err and "Traceback" not in err, err
    # the dev worker and watchdog had every permission they needed
    assert not [line for line in dev.lines if "refused" in line or "denied" in line], dev.lines

    # a restart keeps the passwords: the URL files change only if the port does
    async with Dev(data) as dev:
        await dev.expect("auth: users")
        assert json.loads((auth / "passwords.json").read_text()) == passwords
        url = (auth / "client.url").read_text()
        assert passwords["client"] in url
        rc, out, err = await cli("status", run_id, "--nats", url)
        assert rc == 0 and "completed" in out, (out, err)
    assert not [p for p in auth.iterdir() if p.name.startswith(".")]  # no temp files left


def test_url_files_are_never_readable_by_others(tmp_path: Path) -> None:
    """Created 0600 (a temp file made private, then renamed), whatever the umask says."""
    from sojourn.broker.server import write_private

    old = os.umask(0)
    try:
        write_private(tmp_path / "x.url", "nats://u:p@127.0.0.1:1")
    finally:
        os.umask(old)
    assert mode(tmp_path / "x.url") == 0o600
