"""A real ``sojourn gateway`` process per test, on the session's nats-server, with its own
bearer tokens and callback keys; an in-process worker with the same keys."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from sojourn.actors import Agent, CallbackKeys, Worker
from sojourn.actors.agents.callbacks import generate_key_file_text
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from tests.conftest import PYTHON, ROOT, subprocess_env

CLIENT_TOKEN = "client-token-0123456789abcdef"
ADMIN_TOKEN = "admin-token-0123456789abcdef"


class GatewayProc:
    """``sojourn gateway --port 0 ...`` in its own process; ``url`` once it is ready."""

    def __init__(self, args: Sequence[str], **env: str) -> None:
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "sojourn.actors.cli", "gateway", "--port", "0", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=subprocess_env(**env),
        )
        self.url = ""
        self.lines: list[bytes] = []

    async def ready(self) -> GatewayProc:
        assert self.proc.stdout is not None
        for _ in range(100):
            line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), 60)
            assert line, f"the gateway exited before it was ready: {b''.join(self.lines)!r}"
            self.lines.append(line)
            if line.startswith(b"gateway: "):
                self.url = line.split()[1].decode()
            if line.startswith(b"ready"):
                assert self.url
                return self
        raise AssertionError(f"no ready line: {b''.join(self.lines)!r}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@dataclass
class Files:
    tokens: Path
    keys: Path

    @property
    def callback_keys(self) -> CallbackKeys:
        return CallbackKeys.load(self.keys)


@pytest.fixture
def files(tmp_path: Path) -> Files:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# test tokens\n{CLIENT_TOKEN} client\n{ADMIN_TOKEN} admin\n")
    keys = tmp_path / "keys"
    keys.write_text(generate_key_file_text("k1"))
    return Files(tokens, keys)


async def start_gateway(
    nats_server: EmbeddedServer, settings: Settings, files: Files, *extra: str, **env: str
) -> GatewayProc:
    args = [
        "--nats",
        nats_server.url,
        "--prefix",
        settings.prefix,
        "--tokens",
        str(files.tokens),
        "--callback-keys",
        str(files.keys),
        *extra,
    ]
    return await GatewayProc(args, **env).ready()


@pytest_asyncio.fixture
async def gateway(
    nats_server: EmbeddedServer, settings: Settings, files: Files
) -> AsyncIterator[GatewayProc]:
    g = await start_gateway(nats_server, settings, files)
    try:
        yield g
    finally:
        g.stop()


@pytest_asyncio.fixture
async def http(gateway: GatewayProc) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=gateway.url,
        headers={"Authorization": f"Bearer {CLIENT_TOKEN}"},
        timeout=30,
    ) as c:
        yield c


async def running_worker(
    nats_server: EmbeddedServer, settings: Settings, files: Files, agents: Sequence[Agent[Any, Any]]
) -> Worker:
    worker = Worker(
        list(agents), nats=nats_server.url, settings=settings, callback_keys=files.callback_keys
    )
    await worker.start()
    return worker
