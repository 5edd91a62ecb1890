"""Without the ``otel`` extra, or without tracing set up, OpenTelemetry costs nothing:
``import sojourn.actors`` and a whole run (a start, a step, a signal-free end) import nothing
of it, whether the packages are absent (blocked here) or merely installed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sojourn.broker import EmbeddedServer
from tests.conftest import ROOT, subprocess_env

pytestmark = pytest.mark.usefixtures("processes")

PROBE = """
import asyncio, json, os, sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"{{name}} is not installed (blocked by the test)")
        return None

if {block}:
    sys.meta_path.insert(0, Blocked())
# Whatever the environment asks, a run must not load OpenTelemetry without a tracer set up.
os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"

import sojourn.actors
from sojourn.actors import Context, agent, telemetry
from sojourn.actors.testing import SojournEnv

async def one(x: int) -> int:
    return x + 1

@agent("probe")
async def probe(ctx: Context, x: int) -> int:
    return await ctx.step(one, x)

async def main() -> None:
    async with SojournEnv([probe], server={url!r}) as env:
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        run_id = await env.client.start("probe", 1, wait=True, traceparent=parent)
        assert await env.result(run_id) == 2
        started = (await env.history(run_id))[0]
        assert started.traceparent.startswith("00-0af7651916cd43dd"), started

asyncio.run(main())
assert not telemetry.tracing_on()
print(json.dumps(sorted(
    m for m in sys.modules
    if m.split(".")[0] == "opentelemetry" or m == "sojourn.actors.telemetry._otel"
)))
"""


def _loaded(url: str, block: bool) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(block=block, url=url)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=subprocess_env(),
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.parametrize("otel", ["absent", "installed"])
def test_a_run_imports_no_opentelemetry_unless_it_traces(
    nats_server: EmbeddedServer, otel: str
) -> None:
    assert _loaded(nats_server.url, block=otel == "absent") == []


def test_configure_without_the_extra_says_no() -> None:
    script = (
        "import sys, os\n"
        "class B:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'opentelemetry': raise ImportError(name)\n"
        "sys.meta_path.insert(0, B())\n"
        "os.environ['OTEL_EXPORTER_OTLP_ENDPOINT'] = 'http://127.0.0.1:9'\n"
        "from sojourn.actors import telemetry\n"
        "print(telemetry.configure('sojourn-worker'), telemetry.tracing_on())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]
