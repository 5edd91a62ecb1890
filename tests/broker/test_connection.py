"""Connecting: a clear error for a dead port and for a server too old for sojourn."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from sojourn.broker import Broker
from sojourn.broker.connection import _parse_version, resolve_url
from sojourn.schemas import BrokerUnavailable, BrokerVersionError


async def _fake_nats(version: str, jetstream: bool) -> tuple[asyncio.Server, int]:
    """A minimal NATS protocol speaker: INFO, then PONG to every PING. Enough for a handshake."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        info = {
            "server_id": "fake",
            "version": version,
            "proto": 1,
            "headers": True,
            "max_payload": 1048576,
            "jetstream": jetstream,
        }
        writer.write(f"INFO {json.dumps(info)}\r\n".encode())
        await writer.drain()
        try:
            while line := await reader.readline():
                if line.startswith(b"PING"):
                    writer.write(b"PONG\r\n")
                    await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest_asyncio.fixture
async def old_server() -> AsyncIterator[str]:
    server, port = await _fake_nats("2.9.25", jetstream=True)
    async with server:
        yield f"nats://127.0.0.1:{port}"


@pytest_asyncio.fixture
async def no_js_server() -> AsyncIterator[str]:
    server, port = await _fake_nats("2.15.1", jetstream=False)
    async with server:
        yield f"nats://127.0.0.1:{port}"


async def test_old_server_is_refused_with_the_reason(old_server: str) -> None:
    with pytest.raises(BrokerVersionError, match=r"2\.9\.25 .* too old: sojourn needs >= 2\.12"):
        await Broker.connect(old_server)


async def test_server_without_jetstream_is_refused(no_js_server: str) -> None:
    with pytest.raises(BrokerUnavailable, match="JetStream"):
        await Broker.connect(no_js_server)


async def test_dead_port_fails_fast() -> None:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(BrokerUnavailable, match="sojourn dev"):
        await Broker.connect("nats://127.0.0.1:1")
    assert loop.time() - t0 < 30  # generous: it must not retry forever


def test_version_parsing_and_url_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _parse_version("v2.12.0") == (2, 12, 0)
    assert _parse_version("2.15.1-beta.2") == (2, 15, 1)
    assert _parse_version("2.11") == (2, 11, 0)
    monkeypatch.delenv("SOJOURN_NATS_URL", raising=False)
    assert resolve_url(None) == "nats://127.0.0.1:4222"
    monkeypatch.setenv("SOJOURN_NATS_URL", "nats://127.0.0.1:5555")
    assert resolve_url(None) == "nats://127.0.0.1:5555"
    assert resolve_url("nats://127.0.0.1:6666") == "nats://127.0.0.1:6666"
