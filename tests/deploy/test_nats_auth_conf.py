"""deploy/nats-server-auth.conf: its users are exactly what ``sojourn.broker.auth`` renders for
the prefix ``sojourn`` (so the file cannot drift from the code), nats-server accepts it, and a
server started from it enforces the roles."""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sojourn.broker import Broker, Names
from sojourn.broker.auth import default_users, password_env_var, render_accounts
from sojourn.broker.connection import CredentialsError
from sojourn.broker.server import find_nats_server
from sojourn.broker.topology import ensure_topology
from sojourn.schemas.auth import ROLES
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import PermissionDenied
from tests.conftest import ROOT

CONF = ROOT / "deploy" / "nats-server-auth.conf"
BEGIN = "# >>> sojourn users"
END = "# <<< sojourn users"


def users_block(text: str) -> str:
    start = text.index(BEGIN)
    body = text[text.index("\n", start) + 1 : text.index(END)]
    return body


def env_with_passwords() -> dict[str, str]:
    """As the file's header says to make them: a letter first (nats-server reads a variable's
    value as a config value: ``-x...`` would parse as a number and be refused)."""
    return {password_env_var(role): "s" + secrets.token_urlsafe(16) for role in ROLES}


def test_the_users_are_what_the_code_renders() -> None:
    text = CONF.read_text(encoding="utf-8")
    assert users_block(text) == render_accounts("sojourn", default_users()), (
        "deploy/nats-server-auth.conf is stale: regenerate its users block with "
        "`python -m sojourn.broker.auth --prefix sojourn`"
    )
    assert re.search(r"^  sync_interval: always$", text, re.M)
    assert re.search(r"^max_payload: 8MB$", text, re.M)
    assert re.search(r"^# tls \{$", text, re.M)  # TLS documented, commented out


def test_nats_server_accepts_it(processes: None) -> None:
    binary = find_nats_server()
    ok = subprocess.run(
        [binary, "-t", "-c", str(CONF)],
        env={**env_with_passwords(), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    missing = subprocess.run(
        [binary, "-t", "-c", str(CONF)],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode != 0  # a password variable that is not set stops the server
    assert "SOJOURN_CLIENT_PASSWORD" in missing.stdout + missing.stderr


@contextlib.asynccontextmanager
async def server_from_the_file(
    tmp_path: Path, env: dict[str, str]
) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """nats-server on the deploy file, moved to a free loopback port and a temp store."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    text = CONF.read_text(encoding="utf-8")
    text = text.replace('listen: "127.0.0.1:4222"', f'listen: "127.0.0.1:{port}"')
    text = text.replace('http: "127.0.0.1:8222"', "")
    text = text.replace('store_dir: "/var/lib/sojourn"', f'store_dir: "{tmp_path}"')
    conf = tmp_path / "nats-server-auth.conf"
    conf.write_text(text, encoding="utf-8")
    proc = await asyncio.create_subprocess_exec(
        find_nats_server(),
        "-c",
        str(conf),
        env={**env, "PATH": "/usr/bin:/bin"},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    drain: asyncio.Task[bytes] | None = None
    try:
        lines: list[str] = []
        async with asyncio.timeout(60):
            while not any("Server is ready" in line for line in lines):
                raw = await proc.stdout.readline()
                assert raw, f"nats-server exited: {lines}"
                lines.append(raw.decode(errors="replace"))
        drain = asyncio.create_task(proc.stdout.read())  # keep the pipe from filling up
        yield f"127.0.0.1:{port}", proc
    finally:
        if proc.returncode is None:
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            if drain is not None:
                await drain


async def test_a_server_from_the_file_enforces_the_roles(processes: None, tmp_path: Path) -> None:
    env = env_with_passwords()
    names, settings = Names("sojourn"), Settings()

    def url(role: str) -> str:
        return f"nats://{role}:{env[password_env_var(role)]}@{address}"

    async with server_from_the_file(tmp_path, env) as (address, _proc):
        with pytest.raises(CredentialsError, match="authorization failed"):
            await Broker.connect(f"nats://{address}")
        worker = await Broker.connect(url("worker"))
        client = await Broker.connect(url("client"))
        try:
            await ensure_topology(worker, names, settings)  # a fresh deployment
            await client.publish(names.start("greeter", "client"), b'{"input": null}')
            with pytest.raises(PermissionDenied):
                await client.publish(names.events("x"), b"[]", timeout=30)
            with pytest.raises(PermissionDenied):
                await worker.api(f"$JS.API.STREAM.DELETE.{names.events_stream}", timeout=30)
        finally:
            await client.close()
            await worker.close()
