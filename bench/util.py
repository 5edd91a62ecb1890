"""Small helpers for the benchmarks: percentiles, CPU clocks, machine facts, formatting."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "ROOT",
    "cpu_process",
    "cpu_server",
    "fmt_ms",
    "fmt_rate",
    "fmt_us",
    "git_state",
    "loadavg",
    "log",
    "machine_facts",
    "median",
    "pct",
    "run_bench",
    "run_facts",
    "start_worker",
    "summarize",
    "tag",
    "worker_ready",
]

ROOT = Path(__file__).resolve().parent.parent


def pct(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; NaN for no data."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(xs: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/mean of ``xs``."""
    return {
        "p50": pct(xs, 50),
        "p90": pct(xs, 90),
        "p99": pct(xs, 99),
        "mean": statistics.fmean(xs) if xs else float("nan"),
        "n": float(len(xs)),
    }


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def cpu_process() -> float:
    """CPU seconds (user+system) used by this Python process so far."""
    return time.process_time()


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_server(pid: int | None) -> float:
    """CPU seconds (user+system) used by process ``pid`` so far (Linux /proc); NaN elsewhere."""
    if pid is None:
        return float("nan")
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("nan")
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        return "?"


def git_state(root: Path) -> str:
    head = _run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"])
    dirty = _run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"])
    return f"{head}{' (+uncommitted changes)' if dirty else ''}"


def machine_facts(nats_binary: str, store_dir: Path) -> dict[str, str]:
    """What the figures were measured on."""
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    fs = _run(["df", "-T", str(store_dir)]).splitlines()
    fstype = fs[-1].split()[1] if len(fs) > 1 else "?"
    try:
        import nats

        nats_py = getattr(nats, "__version__", None) or _nats_py_version()
    except Exception:
        nats_py = "?"
    try:
        import uvloop

        uv = uvloop.__version__
    except Exception:
        uv = "not installed"
    return {
        "cpus (nproc)": _run(["nproc"]),
        "cpu model": cpu,
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "nats-server": _run([nats_binary, "--version"]),
        "nats-py": nats_py,
        "uvloop": uv,
        "store filesystem": fstype,
    }


def run_facts(store_dir: str | None) -> dict[str, str]:
    """``machine_facts`` for the nats-server binary the benches start and the store directory
    (the system temp directory when ``store_dir`` is None), plus the running event loop's
    package and the checkout's git state. Call it from inside the running event loop."""
    import asyncio

    from sojourn.broker import find_nats_server

    facts = machine_facts(find_nats_server(), Path(store_dir or tempfile.gettempdir()))
    facts["event loop"] = type(asyncio.get_running_loop()).__module__.split(".")[0]
    facts["sojourn"] = git_state(ROOT)
    return facts


def log(msg: str) -> None:
    """Print a progress line, stamped with the wall-clock time, to stderr."""
    print(f"# {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def start_worker(url: str, prefix: str, app: str, ttl: float, out: Any) -> subprocess.Popen[bytes]:
    """Start ``python -m tests.apps.run_worker URL PREFIX APP TTL`` in the repository root, with
    the root on ``PYTHONPATH``; its stdout and stderr go to the open binary file ``out``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.apps.run_worker", url, prefix, app, str(ttl)],
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
    )


async def worker_ready(
    proc: subprocess.Popen[bytes], log_path: Path, timeout: float, poll: float
) -> None:
    """Return once the worker's log at ``log_path`` contains ``ready``, checking every ``poll``
    seconds. RuntimeError (with the log's tail) if the process exits first; TimeoutError after
    ``timeout`` seconds."""
    import asyncio

    # Blocking reads of a small local file between sleeps, on purpose (a poll, not a stream).
    deadline = time.monotonic() + timeout
    while b"ready" not in log_path.read_bytes():  # noqa: ASYNC240
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited: {log_path.read_text()[-2000:]}")  # noqa: ASYNC240
        if time.monotonic() > deadline:
            raise TimeoutError("worker did not get ready")
        await asyncio.sleep(poll)


def _nats_py_version() -> str:
    from importlib.metadata import version

    return version("nats-py")


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages from /proc/loadavg, space-separated; "?" elsewhere."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def tag() -> str:
    """A short random name part; ``t`` first, so that ``<name>-<tag>`` never has the form of a
    child run's id (``-c`` then digits), which a client may not start."""
    return "t" + uuid.uuid4().hex[:8]


def fmt_us(seconds: float) -> str:
    return "—" if seconds != seconds else f"{seconds * 1e6:,.0f} µs"


def fmt_ms(seconds: float) -> str:
    return "—" if seconds != seconds else f"{seconds * 1e3:,.2f} ms"


def fmt_rate(per_s: float, unit: str) -> str:
    return "—" if per_s != per_s else f"{per_s:,.0f} {unit}/s"


def run_bench(coro: Any, json_out: str | None) -> Any:
    """Run a bench's main coroutine under uvloop when installed; write its JSON if asked.
    Returns what the coroutine returned."""
    import asyncio
    import json

    try:
        import uvloop
    except ImportError:
        uvloop = None
    if uvloop is not None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            out = runner.run(coro)
    else:
        out = asyncio.run(coro)
    if json_out:
        Path(json_out).write_text(json.dumps(out, indent=1, default=str))
    return out
