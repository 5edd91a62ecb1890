"""Worker processes for fault tests: real subprocesses, really killed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess

from tests.conftest import PYTHON, ROOT, subprocess_env


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

    async def ready(self) -> WorkerProc:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), 60)
        assert line.startswith(b"ready"), line
        return self

    def kill(self) -> None:
        """SIGKILL, the crash no code can react to."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close()

    def _close(self) -> None:
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()
