"""``sojourn dev`` runs the gateway too, on loopback, with bearer tokens and callback keys it
makes once per data dir and shares with its worker; its tokens have callers' names, which the
history records (with ``--auth`` too: the client user the gateway connects as speaks for
them)."""

from __future__ import annotations

import asyncio
import signal
import stat
import subprocess
from pathlib import Path

import httpx
import pytest

from sojourn.actors import Client
from sojourn.schemas.config import Settings
from sojourn.schemas.events import RunStarted, SignalReceived
from tests.actors.gateway.test_callbacks import token_of
from tests.conftest import PYTHON, ROOT, subprocess_env

pytestmark = pytest.mark.usefixtures("processes")  # sojourn dev


def _dev(data: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            PYTHON,
            "-m",
            "sojourn.actors.cli",
            "dev",
            "--app",
            "tests.apps.http_agents",
            "--port",
            "0",
            "--gateway-port",
            "0",
            "--data-dir",
            str(data),
            "--no-watchdog",
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=subprocess_env(SOJOURN_CALLBACK_KEYS=""),
    )


async def _line(proc: subprocess.Popen[bytes], prefix: bytes, seen: list[bytes]) -> bytes:
    assert proc.stdout is not None
    while True:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert line, f"sojourn dev exited: {b''.join(seen)!r}"
        seen.append(line)
        if line.startswith(prefix):
            return line


async def test_sojourn_dev_serves_the_gateway_with_its_own_tokens_and_keys(
    tmp_path: Path,
) -> None:
    data = tmp_path / "dev"
    proc = _dev(data)
    seen: list[bytes] = []
    try:
        nats_url = (await _line(proc, b"nats: ", seen)).split()[1].decode()
        gateway_url = (await _line(proc, b"gateway: ", seen)).split()[1].decode()
        assert gateway_url.startswith("http://127.0.0.1:")
        await _line(proc, b"ready", seen)
        tokens = data / "gateway-tokens"
        for f in (tokens, data / "callback-keys"):
            assert stat.S_IMODE(f.stat().st_mode) == 0o600
        roles: dict[str, str] = {}
        for line in tokens.read_text().splitlines()[1:]:
            token, role, name = line.split()
            assert name == f"http-{role}"
            roles[role] = token
        assert set(roles) == {"client", "admin"}
        client = await Client.connect(nats_url, settings=Settings(prefix="sojourn"))
        try:
            async with httpx.AsyncClient(
                base_url=gateway_url,
                headers={"Authorization": f"Bearer {roles['client']}"},
                timeout=30,
            ) as http:
                r = await http.post("/v1/agents/callback-wait/runs", json=3600)
                assert r.status_code == 201, r.text
                run_id = r.json()["run_id"]
                token = await token_of(client, run_id)  # signed by the worker with dev's keys
                delivered = await http.post(f"/v1/callbacks/{token}", json={"ok": 1})
                assert delivered.status_code == 200, delivered.text
                result = await client.result(run_id, timeout=60)
                assert result == {"first": {"ok": 1}, "second": None}
                (start,) = [
                    e
                    for d in await client.history(run_id)
                    for e in d.events
                    if isinstance(e, RunStarted)
                ]
                assert start.trigger.sent_by == "http-client"
        finally:
            await client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 60)
        if proc.stdout is not None:
            proc.stdout.close()
    assert rc == 0, b"".join(seen)


async def test_sojourn_dev_auth_gateway_speaks_for_its_callers(tmp_path: Path) -> None:
    """With ``--auth`` the gateway connects as the client user, which the server lets speak
    for the dev tokens' names: a start over HTTP is recorded as its caller's name."""
    data = tmp_path / "dev"
    proc = _dev(data, "--auth")
    seen: list[bytes] = []
    try:
        gateway_line = await _line(proc, b"gateway: ", seen)
        assert b"sends as its callers http-admin, http-client" in gateway_line
        await _line(proc, b"ready", seen)
        admin = {
            role: token
            for token, role, _ in (
                line.split() for line in (data / "gateway-tokens").read_text().splitlines()[1:]
            )
        }["admin"]
        client = await Client.connect(
            (data / "auth" / "client.url").read_text().strip(), settings=Settings()
        )
        try:
            async with httpx.AsyncClient(
                base_url=gateway_line.split()[1].decode(),
                headers={"Authorization": f"Bearer {admin}"},
                timeout=30,
            ) as http:
                r = await http.post(
                    "/v1/agents/echo-wait/runs", json=1, headers={"Idempotency-Key": "dev-auth"}
                )
                assert r.status_code == 201, r.text
                go = await http.post("/v1/runs/dev-auth/signals/go", json=2)
                assert go.status_code == 202, go.text
            assert await client.result("dev-auth", timeout=60) == {"input": 1, "go": 2}
            events = [e for d in await client.history("dev-auth") for e in d.events]
            assert [e.trigger.sent_by for e in events if isinstance(e, RunStarted)] == [
                "http-admin"
            ]
            assert [e.sent_by for e in events if isinstance(e, SignalReceived)] == ["http-admin"]
        finally:
            await client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 60)
        if proc.stdout is not None:
            proc.stdout.close()
    assert rc == 0, b"".join(seen)
