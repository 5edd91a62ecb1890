"""``sojourn projector`` sets up tracing from the ``OTEL_*`` environment and logs as JSON with
``--log-format json`` (the worker and the gateway are exercised by ``test_run_trace.py``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import IO

import pytest

from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for

pytestmark = pytest.mark.usefixtures("processes")


def _projector(url: str, prefix: str, out: IO[bytes]) -> subprocess.Popen[bytes]:
    command = ["projector", "--nats", url, "--prefix", prefix, "--log-format", "json"]
    return subprocess.Popen(
        [PYTHON, "-m", "sojourn.actors.cli", *command],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=out,
        env=subprocess_env(OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="proj"),
    )


async def test_the_projector_traces_and_logs_json(
    nats_server: EmbeddedServer, settings: Settings, tmp_path: Path
) -> None:
    log = tmp_path / "projector.log"
    with log.open("wb") as out:
        proc = _projector(nats_server.url, settings.prefix, out)
        try:

            async def said_so() -> bool:
                assert proc.poll() is None, log.read_text()
                return b"tracing: spans exported" in log.read_bytes()

            await wait_for(said_so, timeout=60, what="the projector's tracing line")
        finally:
            proc.terminate()
            proc.wait(30)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert any(d["message"] == "tracing: spans exported (OTEL_* environment)" for d in lines)
    assert all({"time", "level", "logger", "message"} <= d.keys() for d in lines)
