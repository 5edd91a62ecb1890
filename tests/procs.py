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
        """Wait for its ``ready`` line (log lines, such as a takeover at start, may come
        first)."""
        assert self.proc.stdout is not None
        seen: list[bytes] = []
        for _ in range(100):
            line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), 60)
            if line.startswith(b"ready"):
                return self
            assert line, f"the worker exited before it was ready: {b''.join(seen)!r}"
            seen.append(line)
        raise AssertionError(f"no ready line: {b''.join(seen)!r}")

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
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()
