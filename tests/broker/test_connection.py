"""Connecting: a clear error for a dead port, a server too old for sojourn, and connection
options (credentials, TLS files) that cannot be used."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from sojourn.broker import Broker, EmbeddedServer
from sojourn.broker.connecting import _parse_version
from sojourn.broker.options import (
    ENV_CREDS,
    ENV_TLS_CA,
    ENV_TLS_CERT,
    ENV_TLS_KEY,
    ENV_URL,
    ConnectOptions,
    CredentialsError,
    redact_url,
    resolve_url,
    url_user,
)
from sojourn.schemas import BrokerUnavailable, BrokerVersionError
from sojourn.schemas.config import Settings


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


# --- connection options ------------------------------------------------------------------------


def test_connect_options_take_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (ENV_URL, ENV_CREDS, ENV_TLS_CA, ENV_TLS_CERT, ENV_TLS_KEY):
        monkeypatch.delenv(var, raising=False)
    assert ConnectOptions().resolved() == ConnectOptions(url="nats://127.0.0.1:4222")
    monkeypatch.setenv(ENV_URL, "tls://u:secret@nats.internal:4222")
    monkeypatch.setenv(ENV_CREDS, "/etc/sojourn/worker.creds")
    monkeypatch.setenv(ENV_TLS_CA, "/etc/sojourn/ca.pem")
    opts = ConnectOptions(tls_cert="/flag/cert.pem").resolved()
    assert opts.url == "tls://u:secret@nats.internal:4222"
    assert opts.creds == "/etc/sojourn/worker.creds" and opts.tls_ca == "/etc/sojourn/ca.pem"
    assert opts.tls_cert == "/flag/cert.pem" and opts.tls_key is None  # a flag wins
    assert opts.user == "u" and opts.wants_tls
    assert opts.display_url == "tls://u:***@nats.internal:4222"


def test_user_and_redaction() -> None:
    assert url_user("nats://client:pw@127.0.0.1:4222") == "client"
    assert url_user("nats://127.0.0.1:4222") is None
    assert url_user("nats://sometoken@127.0.0.1:4222") is None  # a token, not a user
    assert redact_url("nats://client:pw@127.0.0.1:4222") == "nats://client:***@127.0.0.1:4222"
    assert redact_url("nats://sometoken@127.0.0.1:4222") == "nats://***@127.0.0.1:4222"
    assert redact_url("nats://127.0.0.1:4222") == "nats://127.0.0.1:4222"


async def test_unusable_files_fail_before_connecting(tmp_path: Path) -> None:
    dead = "nats://127.0.0.1:1"
    with pytest.raises(CredentialsError, match=r"creds file .*nope\.creds.*cannot read"):
        await Broker.connect(ConnectOptions(url=dead, creds=str(tmp_path / "nope.creds")))
    junk = tmp_path / "junk.creds"
    junk.write_text("not a creds file")
    with pytest.raises(CredentialsError, match="not a NATS credentials file"):
        await Broker.connect(ConnectOptions(url=dead, creds=str(junk)))
    with pytest.raises(CredentialsError, match=r"TLS CA file .*ca\.pem.*cannot use it"):
        await Broker.connect(ConnectOptions(url=dead, tls_ca=str(tmp_path / "ca.pem")))
    with pytest.raises(CredentialsError, match=r"TLS certificate .*cannot use it"):
        await Broker.connect(ConnectOptions(url=dead, tls_cert=str(junk)))
    with pytest.raises(CredentialsError, match="needs its certificate"):
        await Broker.connect(ConnectOptions(url=dead, tls_key=str(junk)))


async def test_a_password_never_reaches_the_unavailable_message() -> None:
    with pytest.raises(BrokerUnavailable) as info:
        await Broker.connect("nats://client:hunter2@127.0.0.1:1")
    assert "hunter2" not in info.value.message and "client:***@" in info.value.message


def _creds(tmp_path: Path, claims: object) -> str:
    import base64
    import json

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    jwt = ".".join(
        [b64(b'{"typ":"JWT","alg":"ed25519-nkey"}'), b64(json.dumps(claims).encode()), "sig"]
    )
    path = tmp_path / "user.creds"
    path.write_text(
        "-----BEGIN NATS USER JWT-----\n"
        f"{jwt}\n"
        "------END NATS USER JWT------\n\n"
        "-----BEGIN USER NKEY SEED-----\nSUAEXAMPLE\n------END USER NKEY SEED------\n"
    )
    return str(path)


def test_a_creds_files_jwt_name_is_the_sender(tmp_path: Path) -> None:
    from sojourn.broker.options import creds_user

    path = _creds(tmp_path, {"name": "alice", "sub": "UABC"})
    assert creds_user(path) == "alice"
    assert ConnectOptions(url="nats://127.0.0.1:4222", creds=path).user == "alice"
    # A URL user wins; a name that is not a token, or no name, gives no sender.
    assert ConnectOptions(url="nats://bob:pw@127.0.0.1:4222", creds=path).user == "bob"
    assert creds_user(_creds(tmp_path, {"name": "a.b"})) is None
    assert creds_user(_creds(tmp_path, {"sub": "U"})) is None
    assert creds_user(str(tmp_path / "missing.creds")) is None


async def test_a_direct_get_nobody_answers_is_absent_only_when_the_stream_is(
    nats_server: EmbeddedServer, settings: Settings
) -> None:
    """ "No responders" to a direct get means nothing is stored only when the stream does not
    exist. For one that exists (here: direct gets not enabled, as when no replica of an R3
    stream can answer during a leader election) it is ``BrokerUnavailable``, never an empty
    answer that would make a run look absent."""
    b = await Broker.connect(nats_server.url)
    try:
        name = f"{settings.prefix.upper()}_NODIRECT"
        subject = f"{settings.prefix}.nodirect.x"
        await b.api(
            f"$JS.API.STREAM.CREATE.{name}",
            {"name": name, "subjects": [subject], "storage": "file", "allow_direct": False},
        )
        await b.publish(subject, b"stored")
        with pytest.raises(BrokerUnavailable, match="no replica"):
            await b.direct_get_last(name, subject)
        with pytest.raises(BrokerUnavailable, match="no replica"):
            await b.direct_get_range(name, subject)
        missing = f"{settings.prefix.upper()}_MISSING"
        assert await b.direct_get_last(missing, subject) is None
        assert await b.direct_get_range(missing, subject) == []
        with pytest.raises(BrokerUnavailable, match="no replica"):
            await b.direct_get_last_of(name, [subject])
        assert await b.direct_get_last_of(missing, [subject]) == []
    finally:
        await b.close()


@contextlib.asynccontextmanager
async def scratch_stream(
    nats_server: EmbeddedServer, settings: Settings, tag: str
) -> AsyncIterator[tuple[Broker, str, str]]:
    """A connection and a memory stream of the test's own on ``<prefix>.<tag>.>`` with direct
    gets (deleted at the end): ``(broker, stream name, subject prefix)``."""
    b = await Broker.connect(nats_server.url)
    p = f"{settings.prefix}.{tag}"
    name = f"{settings.prefix.upper()}_{tag.upper()}"
    try:
        await b.api(
            f"$JS.API.STREAM.CREATE.{name}",
            {"name": name, "subjects": [f"{p}.>"], "storage": "memory", "allow_direct": True},
        )
        yield b, name, p
    finally:
        await b.api(f"$JS.API.STREAM.DELETE.{name}")
        await b.close()


async def test_the_last_of_several_filters_in_one_read(
    nats_server: EmbeddedServer, settings: Settings
) -> None:
    """``direct_get_last_of``: the last message of each subject any filter matches, wildcards
    included, at most ``limit``, in stream order; ``[]`` when none matches."""
    async with scratch_stream(nats_server, settings, "lastof") as (b, name, p):
        for subject, data in [
            (f"{p}.cancel.r1", b"1"),
            (f"{p}.as.ann.cancel.r2", b"2"),
            (f"{p}.cancel.r1", b"3"),
            (f"{p}.as.bob.cancel.r1", b"4"),
            (f"{p}.start.r1", b"5"),
        ]:
            await b.publish(subject, data)
        forms = [f"{p}.cancel.r1", f"{p}.as.*.cancel.r1"]
        got = await b.direct_get_last_of(name, forms, limit=10)
        assert [(m.subject, m.data) for m in got] == [
            (f"{p}.cancel.r1", b"3"),
            (f"{p}.as.bob.cancel.r1", b"4"),
        ]
        assert [m.data for m in await b.direct_get_last_of(name, forms)] == [b"3"]
        assert await b.direct_get_last_of(name, [f"{p}.cancel.r9", f"{p}.as.*.cancel.r9"]) == []
        assert [m.data for m in await b.direct_get_last_of(name, [f"{p}.as.*.cancel.*"])] == [b"2"]


async def test_a_batched_read_is_bounded_in_bytes_and_pages_on(
    nats_server: EmbeddedServer, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batched direct get asks for at most ``BATCH_MAX_BYTES``: a page of large messages is
    cut short, says how many more match, and paging on reads every one, in order."""
    from sojourn.broker import direct

    monkeypatch.setattr(direct, "BATCH_MAX_BYTES", 1_000_000)
    async with scratch_stream(nats_server, settings, "big") as (b, name, p):
        for i in range(12):
            await b.publish(f"{p}.{i}", bytes([i]) * 200_000)
        first, pending = await b.direct_get_batch(name, f"{p}.*", 1, 1000)
        assert 1 <= len(first) <= 5 and pending == 12 - len(first)
        every = await b.direct_get_range(name, f"{p}.*")
        assert [m.data[:1] for m in every] == [bytes([i]) for i in range(12)]
        last = await b.direct_get_last_of(name, [f"{p}.*"], limit=1000)
        assert 1 <= len(last) <= 5
