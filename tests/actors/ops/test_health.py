"""The health and readiness probes on the metrics port (issue 12): ``/healthz`` follows the
event loop, ``/readyz`` the process's components and its NATS connection."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sojourn.actors.ops.exposition import serve_metrics, stop_metrics
from sojourn.actors.ops.health import REQUEST_LINE_MAX, Health, Phase, ProbeApp
from sojourn.broker.server import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import SojournError
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for

METRICS_LINE = re.compile(rb"metrics: http://[^:/]+:(\d+)/metrics\s*")


class CliProc:
    """A ``sojourn`` serving command in its own process; its output collected by a thread,
    so a test can wait for a line without blocking the loop."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "sojourn.actors.cli", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=subprocess_env(),
        )
        self.lines: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return b"".join(self.lines).decode(errors="replace")

    async def line(self, pattern: re.Pattern[bytes], timeout: float = 60.0) -> re.Match[bytes]:
        """The first output line that fullmatches ``pattern``, waited for."""
        found: list[re.Match[bytes]] = []

        async def seen() -> bool:
            if self.proc.poll() is not None and not self._reader.is_alive() and not found:
                raise AssertionError(f"exited with {self.proc.returncode}:\n{self.output}")
            found.extend(m for m in map(pattern.fullmatch, list(self.lines)) if m)
            return bool(found)

        await wait_for(seen, timeout, what=f"a line {pattern.pattern!r}")
        return found[0]

    async def metrics_port(self) -> int:
        return int((await self.line(METRICS_LINE))[1])

    async def terminate(self, timeout: float = 20.0) -> tuple[int | None, float]:
        """SIGTERM; the exit code (``None``: killed at ``timeout``) and how long it took."""
        started = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = await asyncio.to_thread(self.proc.wait, timeout)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - started
        self.kill()
        return code, took

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def get(port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    """One HTTP request to the probe port (blocking: call it in a thread)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read()


async def aget(port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    return await asyncio.to_thread(get, port, path, method)


async def answers(port: int, path: str, code: int) -> bool:
    try:
        return (await aget(port, path))[0] == code
    except OSError:
        return False


async def test_a_worker_process_is_ready_while_connected_and_live_throughout(
    own_server: EmbeddedServer, settings: Settings
) -> None:
    worker = CliProc(
        "worker", "--app", "tests.apps.cli_agents", "--nats", own_server.url,
        "--prefix", settings.prefix, "--metrics-port", "0",
    )  # fmt: skip
    try:
        port = await worker.metrics_port()
        await wait_for(lambda: answers(port, "/readyz", 200), 60, what="the worker to be ready")
        assert await aget(port, "/readyz") == (200, b'{"status":"ready"}')
        assert await aget(port, "/healthz") == (200, b'{"status":"ok"}')
        code, body = await aget(port, "/metrics")
        assert code == 200 and b"sojourn_worker_capacity 256.0" in body

        assert (await aget(port, "/healthz", "POST"))[0] == 405
        assert (await aget(port, "/readyz", "DELETE"))[0] == 405
        assert (await aget(port, "/metrics", "PUT"))[0] == 405
        for path in ("/", "/healthz/", "/readyzz", "/metrics/x", "/HEALTHZ"):
            assert (await aget(port, path))[0] == 404, path

        own_server.kill()
        await wait_for(lambda: answers(port, "/readyz", 503), 60, what="not ready")
        assert (await aget(port, "/readyz"))[0] == 503
        assert json.loads((await aget(port, "/readyz"))[1]) == {
            "status": "not_ready",
            "reason": "worker: nats disconnected",
            "reasons": ["worker: nats disconnected"],
        }
        assert await aget(port, "/healthz") == (200, b'{"status":"ok"}')  # alive, though

        await own_server.start()  # same port: the worker reconnects
        await wait_for(lambda: answers(port, "/readyz", 200), 60, what="ready again")
        exit_code, _ = await worker.terminate()
        assert exit_code == 0, worker.output
    finally:
        worker.kill()


@pytest.mark.parametrize(
    ("command", "component"),
    [
        (["watchdog"], "watchdog"),
        (["projector", "--no-sqlite"], "projector"),
    ],
)
async def test_a_watchdog_and_a_projector_process_report_readiness(
    own_server: EmbeddedServer, settings: Settings, command: list[str], component: str
) -> None:
    proc = CliProc(
        *command, "--nats", own_server.url, "--prefix", settings.prefix, "--metrics-port", "0"
    )
    try:
        port = await proc.metrics_port()
        await wait_for(lambda: answers(port, "/readyz", 200), 60, what=f"a ready {component}")
        assert await aget(port, "/healthz") == (200, b'{"status":"ok"}')
        own_server.kill()
        await wait_for(lambda: answers(port, "/readyz", 503), 60, what="not ready")
        body = json.loads((await aget(port, "/readyz"))[1])
        assert body["reason"] == f"{component}: nats disconnected"
        await own_server.start()
        await wait_for(lambda: answers(port, "/readyz", 200), 60, what="ready again")
        code, _ = await proc.terminate()
        assert code == 0, proc.output
    finally:
        proc.kill()


async def test_a_wedged_event_loop_fails_the_liveness_probe() -> None:
    health = Health(tick=0.05, live_within=0.5, ready_within=0.3)
    server = serve_metrics(0, health=health)
    port = server.server_address[1]
    try:
        health.add("thing", lambda: None)
        await wait_for(lambda: answers(port, "/readyz", 200), what="ready")
        assert await aget(port, "/healthz") == (200, b'{"status":"ok"}')
        seen: dict[str, tuple[int, bytes]] = {}
        unblock = threading.Event()

        def probe_while_wedged() -> None:
            deadline = time.monotonic() + 60
            try:
                while time.monotonic() < deadline:
                    status = get(port, "/healthz")
                    if status[0] == 503:
                        seen["healthz"] = status
                        seen["readyz"] = get(port, "/readyz")
                        return
            finally:
                unblock.set()

        prober = threading.Thread(target=probe_while_wedged)
        prober.start()
        unblock.wait(90)  # blocks the event loop, as a step doing CPU work without awaiting
        prober.join(10)
        assert "healthz" in seen, "/healthz kept answering 200 while the loop was wedged"
        body = json.loads(seen["healthz"][1])
        assert body["status"] == "unhealthy"
        assert re.fullmatch(r"event loop unresponsive for [\d.]+s \(limit 0.5s\)", body["reason"])
        assert seen["readyz"][0] == 503
        assert json.loads(seen["readyz"][1])["reason"].startswith("event loop unresponsive")
        await wait_for(lambda: answers(port, "/healthz", 200), what="live again")
    finally:
        stop_metrics(server)
    assert health.liveness()[0] == 503  # stopped with its server: nothing watches the loop


async def test_readiness_says_why_not() -> None:
    health = Health()
    assert health.readiness() == (
        503,
        {"status": "not_ready", "reason": "event loop not monitored"},
    )
    health.start()
    try:
        assert health.readiness()[1]["reason"] == "starting"  # nothing registered yet
        phase = Phase()
        health.add("process", phase)
        health.add("worker", lambda: None)
        assert health.readiness()[1]["reasons"] == ["process: starting"]
        phase.serving()
        health.refresh()
        assert health.readiness() == (200, {"status": "ready"})

        def broken() -> str | None:
            raise KeyError("x")

        health.add("projector", broken)
        health.add("watchdog", lambda: "nats disconnected")
        assert health.readiness()[1]["reasons"] == [
            "projector: readiness check failed: KeyError",
            "watchdog: nats disconnected",
        ]
        health.remove("projector")
        health.remove("watchdog")
        phase.stopping()
        health.refresh()
        assert health.readiness()[1]["reason"] == "process: stopping"
        assert health.liveness() == (200, {"status": "ok"})  # stopping is not dying
    finally:
        health.stop()


def call(app: ProbeApp, method: str, path: str) -> tuple[str, dict[str, str], bytes]:
    got: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc: Any = None) -> Any:
        got.append((status, headers))

    body: Iterable[bytes] = app({"REQUEST_METHOD": method, "PATH_INFO": path}, start_response)
    data = b"".join(body)
    return got[0][0], dict(got[0][1]), data


def fake_metrics(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"metrics"]


@given(
    method=st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "X"]),
    path=st.one_of(
        st.sampled_from(["/metrics", "/healthz", "/readyz"]),
        st.text(max_size=30).map(lambda s: "/" + s),
        st.sampled_from(["/healthz/", "/readyz\n", "/metrics?x", "", "healthz", "/readyz/x"]),
    ),
)
def test_the_probe_app_routes_exact_paths_and_refuses_other_methods(method: str, path: str) -> None:
    health = Health()  # never started: the probes answer 503
    status, headers, body = call(ProbeApp(fake_metrics, health), method, path)
    known = path in ("/metrics", "/healthz", "/readyz")
    if not known:
        assert status.startswith("404 ")
    elif method not in ("GET", "HEAD"):
        assert status.startswith("405 ") and headers["Allow"] == "GET, HEAD"
    elif path == "/metrics":
        assert (status, body) == ("200 OK", b"metrics")
    else:
        assert status.startswith("503 ")
        if method == "HEAD":
            assert body == b""
        else:
            assert json.loads(body)["reason"] == "event loop not monitored"


async def test_an_oversized_request_line_is_refused() -> None:
    server = serve_metrics(0, health=Health())
    port = server.server_address[1]
    try:

        def send(path: str) -> int:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                conn.request("GET", path)
                return conn.getresponse().status
            finally:
                conn.close()

        assert await asyncio.to_thread(send, "/healthz?" + "x" * (REQUEST_LINE_MAX - 100)) == 200
        assert await asyncio.to_thread(send, "/healthz?" + "x" * REQUEST_LINE_MAX) == 414
    finally:
        stop_metrics(server)


def test_a_taken_metrics_port_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(SojournError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            serve_metrics(port)
