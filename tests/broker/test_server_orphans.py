"""An embedded server never outlives a parent that was SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("processes")  # a parent process to SIGKILL

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from sojourn.broker import EmbeddedServer

    async def main():
        server = EmbeddedServer(store_dir=sys.argv[1], port=0)
        await server.start()
        print(server.pid, flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_server_dies_when_its_parent_is_sigkilled(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "store")], stdout=subprocess.PIPE, text=True
    )
    server_pid = 0
    try:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        assert _alive(server_pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 20
        while _alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(server_pid), "nats-server outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()
        if server_pid and _alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)
