"""Worker processes for fault tests: real subprocesses, really killed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Callable

from tests.conftest import PYTHON, ROOT, subprocess_env

_STARTED: set[WorkerProc] = set()
"""Every worker process not yet stopped or killed, for ``reap_strays``."""


def reap_strays() -> None:
    """SIGKILL every worker process a test left running (a test that failed half-way through
    starting its workers), so none outlives its test and warns in a later one."""
    for p in list(_STARTED):
        p.kill()


class WorkerProc:
    """``python -m tests.apps.run_worker URL PREFIX MODULE TTL`` in its own process."""

    def __init__(
        self, url: str, prefix: str, module: str, *, lease_ttl: float = 2.0, **env: str
    ) -> None:
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "tests.apps.run_worker", url, prefix, module, str(lease_ttl)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=subprocess_env(**env),
        )
        _STARTED.add(self)

    async def ready(self) -> WorkerProc:
        """Wait for its ``ready`` line (log lines, such as a takeover at start, may come
        first)."""
        await self.line(lambda line: line.startswith(b"ready"), "ready")
        return self

    async def line(self, wanted: Callable[[bytes], bool], what: str) -> bytes:
        """Read its output up to the first line ``wanted`` (within 100 lines, each within
        60 s); the lines before it are in the error when it exits first."""
        assert self.proc.stdout is not None
        seen: list[bytes] = []
        for _ in range(100):
            line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), 60)
            if wanted(line):
                return line
            assert line, f"the worker exited before it was {what}: {b''.join(seen)!r}"
            seen.append(line)
        raise AssertionError(f"no {what} line: {b''.join(seen)!r}")

    def kill(self) -> None:
        """SIGKILL, the crash no code can react to."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._close()

    def pause(self) -> None:
        """SIGSTOP: alive, holding its connection, doing nothing (a long GC, a frozen VM)."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close()

    def _close(self) -> None:
        _STARTED.discard(self)
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()
