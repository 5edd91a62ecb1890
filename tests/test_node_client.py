"""A client in another language needs only the wire contract (docs/wire.md) and NATS.

``tests/node/client.mjs`` uses the NATS JavaScript libraries and no sojourn code: it starts a
run, watches its view in the runs KV bucket until it completes (signalling the run on the way),
and reads and resumes its output stream. This test gives it a real server, a worker and a
projector, and cross-checks the run from Python.

The npm packages are pinned in ``tests/node/package-lock.json``. CI installs them
(``.ci/run``); on a developer's machine this test installs them itself with ``npm ci`` when
they are missing or stale, so the README's test command keeps working. Without Node.js or npm
it fails, saying what to install: a skipped test would hide that the contract went unchecked.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from sojourn.actors import Client, Worker
from sojourn.broker import EmbeddedServer
from sojourn.projections.projector import Projector
from sojourn.schemas.config import Settings
from sojourn.schemas.events import RunStarted, SignalReceived
from tests.apps.node_stream import node_stream
from tests.conftest import ROOT

NODE_DIR = ROOT / "tests" / "node"
NODE_MAJOR_MIN = 20
HANG_GUARD = 600.0
"""Seconds after which a stuck ``npm ci`` or client is killed, so a hang fails the test instead
of stalling the suite; the client's own deadlines (``--timeout``) come first."""

WORDS = ["Streams ", "resume ", "from ", "any ", "offset, ", "in ", "any ", "language."]


def _stale_packages() -> list[str]:
    """The pinned packages whose installed version is missing or differs from the pin."""
    pins: dict[str, str] = json.loads((NODE_DIR / "package.json").read_text())["dependencies"]
    stale = []
    for name, version in sorted(pins.items()):
        manifest = NODE_DIR / "node_modules" / name / "package.json"
        installed = json.loads(manifest.read_text()).get("version") if manifest.exists() else None
        if installed != version:
            stale.append(f"{name}@{version} (installed: {installed or 'none'})")
    return stale


@pytest.fixture(scope="module")
def node(processes: None) -> str:
    """The ``node`` executable, with tests/node's packages installed (by ``npm ci`` if need be)."""
    found = shutil.which("node")
    if found is None:
        pytest.fail(
            f"node is missing: tests/test_node_client.py needs Node.js >= {NODE_MAJOR_MIN} "
            "with npm (then `npm ci --prefix tests/node` installs the client's packages)"
        )
    version = subprocess.run([found, "--version"], capture_output=True, text=True, check=True)
    major = re.fullmatch(r"v(\d+)\.\d+\.\d+\s*", version.stdout)
    if major is None or int(major.group(1)) < NODE_MAJOR_MIN:
        pytest.fail(f"node {version.stdout.strip()} is too old: Node.js >= {NODE_MAJOR_MIN}")
    stale = _stale_packages()
    if stale:
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail(
                f"tests/node's npm packages are not installed ({', '.join(stale)}) and npm is "
                "missing: install npm, then run `npm ci --prefix tests/node`"
            )
        done = subprocess.run(
            [npm, "ci", "--quiet", "--no-audit", "--no-fund"],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=HANG_GUARD,
        )
        if done.returncode != 0 or _stale_packages():
            pytest.fail(
                f"`npm ci` in tests/node failed (exit {done.returncode}); run "
                f"`npm ci --prefix tests/node` to install {', '.join(stale)}:\n"
                f"{done.stdout}{done.stderr}"
            )
    return found


@pytest_asyncio.fixture
async def deployment(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[None]:
    """A worker serving ``node_stream`` and a projector keeping the run views."""
    worker = await Worker([node_stream], nats=nats_server.url, settings=settings).start()
    projector = await Projector(nats=nats_server.url, settings=settings).start()
    try:
        yield
    finally:
        await projector.stop()
        await worker.stop()


async def _run_client(node: str, *args: str) -> tuple[int, str]:
    """Run tests/node/client.mjs; its exit code and everything it printed."""
    proc = await asyncio.create_subprocess_exec(
        node,
        str(NODE_DIR / "client.mjs"),
        *args,
        cwd=NODE_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), HANG_GUARD)
    except TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
        return -1, f"(killed after {HANG_GUARD}s)\n{out.decode(errors='replace')}"
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


@pytest.mark.usefixtures("deployment")
async def test_node_client_starts_watches_and_resumes(
    node: str, nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    run_id = f"node-{uuid.uuid4().hex[:12]}"
    code, output = await _run_client(
        node,
        "--server",
        nats_server.url,
        "--prefix",
        settings.prefix,
        "--agent",
        "node_stream",
        "--run-id",
        run_id,
        "--input",
        json.dumps(WORDS),
        "--signal",
        "go",
    )
    assert code == 0, f"tests/node/client.mjs failed (exit {code}):\n{output}"
    # What the Node client saw is what sojourn recorded: the run it started, waiting on the
    # way (the client signalled it from the view), ended with the text its chunks spelled.
    assert re.search(r"^ok: statuses .*waiting.*-> completed$", output, re.M), output
    assert await client.result(run_id, timeout=30) == "".join(WORDS)
    events = [e for d in await client.history(run_id) for e in d.events]
    started = events[0]
    assert isinstance(started, RunStarted), events
    assert (started.agent, started.trigger.msg_id) == ("node_stream", f"start:node_stream:{run_id}")
    signals = [e for e in events if isinstance(e, SignalReceived)]
    assert [(s.name, s.signal_id) for s in signals] == [("go", f"signal:{run_id}:go")], signals
