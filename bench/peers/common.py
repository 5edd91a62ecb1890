"""What every column shares: child processes, the step-mark side channel, the kill rounds.

A *mark* is one UDP datagram to the bench (``kind run index pid time``) sent by the code of a
run: ``enter`` when the run's function is entered in a process, ``step`` when a step's body
starts executing. It is how the bench sees, the same way for every engine, which process
executes a run and when a step starts again after a kill. Marks are sent only by the kill
workloads, never by the trivial steps of the throughput workloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARKS_ENV = "BENCH_PEERS_MARKS"
"""The environment variable that carries the bench's mark port to the children."""
KILL_POINTS = ("early", "mid")
EARLY_STEPS, EARLY_SECONDS = 3, 0.2
"""Early kill workload: 3 steps of 0.2 s (bench/takeover.py's ``takeover`` agent, 3 steps)."""
MID_STEPS, MID_SECONDS, MID_AT = 2, 1.0, 0.5
"""Mid-step kill workload: 2 steps of 1 s, killed 0.5 s into the first one."""

_sock: socket.socket | None = None


def mark(kind: str, run: str, index: int) -> None:
    """Send a mark to the bench (a no-op when no bench listens)."""
    global _sock
    port = os.environ.get(MARKS_ENV)
    if not port:
        return
    if _sock is None:
        _sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    msg = f"{kind} {run} {index} {os.getpid()} {time.time():.6f}"
    _sock.sendto(msg.encode(), ("127.0.0.1", int(port)))


async def slow_step(run: str, index: int, seconds: float) -> int:
    """The step of the kill workloads: marks its start, sleeps, returns its index + 1."""
    mark("step", run, index)
    await asyncio.sleep(seconds)
    return index + 1


def inc(x: int) -> int:
    """The trivial step of the throughput workloads: its input + 1."""
    return x + 1


async def ainc(x: int) -> int:
    return x + 1


@dataclass(frozen=True)
class Mark:
    kind: str
    run: str
    index: int
    pid: int
    at: float


class Marks(asyncio.DatagramProtocol):
    """The bench's end of the side channel."""

    def __init__(self) -> None:
        self.seen: list[Mark] = []
        self._new = asyncio.Event()
        self.transport: asyncio.DatagramTransport | None = None
        self.port = 0

    async def open(self) -> Marks:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: self, ("127.0.0.1", 0))
        self.transport = transport
        self.port = transport.get_extra_info("sockname")[1]
        return self

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def env(self) -> dict[str, str]:
        return {MARKS_ENV: str(self.port)}

    def datagram_received(self, data: bytes, addr: Any) -> None:
        kind, run, index, pid, at = data.decode().split()
        self.seen.append(Mark(kind, run, int(index), int(pid), float(at)))
        self._new.set()

    async def wait(self, pred: Callable[[Mark], bool], timeout: float, what: str) -> Mark:
        deadline = time.monotonic() + timeout
        while True:
            for m in self.seen:
                if pred(m):
                    return m
            self._new.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no mark: {what} within {timeout:.0f} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), left)


# --- child processes ---------------------------------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


_LIVE: set[Proc] = set()


class Proc:
    """A child in a process group of its own, killed with its group (SIGKILL) when done."""

    def __init__(
        self,
        args: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | str = ROOT,
        log: Path | None = None,
        stdin: bool = False,
        stdout: bool = False,
        pass_fds: tuple[int, ...] = (),
        user: str | None = None,
    ) -> None:
        self._log = open(log, "ab") if log is not None else None
        out: Any = subprocess.PIPE if stdout else (self._log or subprocess.DEVNULL)
        self.proc = subprocess.Popen(
            args,
            cwd=cwd,
            env=env if env is not None else child_env(),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=out,
            stderr=self._log or subprocess.DEVNULL,
            start_new_session=True,
            pass_fds=pass_fds,
            user=user,
        )
        self.pid = self.proc.pid
        self.name = " ".join(args[:3])
        _LIVE.add(self)

    async def line(self, wanted: Callable[[str], bool], what: str, timeout: float = 60) -> str:
        """Read stdout up to the first line ``wanted``."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            raw = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), left)
            if not raw:
                raise RuntimeError(f"{self.name} exited before {what}")
            text = raw.decode().strip()
            if wanted(text):
                return text

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        """SIGKILL the whole group at once (no code can react), and reap."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        for f in (self.proc.stdin, self.proc.stdout, self._log):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        _LIVE.discard(self)


def kill_all() -> None:
    """Kill every child still alive (the columns' finally blocks and Ctrl-C)."""
    for p in list(_LIVE):
        p.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_http(url: str, timeout: float = 60) -> None:
    """Until ``url`` answers a GET with 2xx."""
    import httpx

    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as c:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await c.get(url, timeout=2)).is_success:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer in {timeout:.0f} s")
            await asyncio.sleep(0.1)


def py(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def run_loop(coro: Any) -> Any:
    """Run a child's main coroutine, under uvloop when installed (as the sojourn side is)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


# --- kill rounds -------------------------------------------------------------------------------


@dataclass
class KillRound:
    """One engine's hooks for a kill round, all about one run ``run``."""

    start: Callable[[str, int, float], Awaitable[None]]
    """Start run ``run`` of ``steps`` steps of ``seconds`` each."""
    recover: Callable[[str, int], Awaitable[None]]
    """Called right after the process ``pid`` executing ``run`` was killed: a relaunch or a
    resume (a standby needs nothing)."""
    result: Callable[[str], Awaitable[Any]]
    """Wait for the run's result."""
    victim: Callable[[int], Proc]
    """The child whose process (or group) is ``pid``."""


@dataclass
class KillFigures:
    next_step: list[float] = field(default_factory=list)
    done: list[float] = field(default_factory=list)


async def kill_round(
    k: KillRound, marks: Marks, run: str, point: str, rng: random.Random, out: KillFigures
) -> None:
    """Start a run, SIGKILL the process executing it at ``point``, time the recovery.

    ``early``: 0-20 ms (uniform) after the run's function was entered (its ``enter`` mark);
    ``mid``: 0.5 s after its first step's body started (its ``step`` mark). Figures: kill ->
    the first ``step`` mark of the run from another process; kill -> the run's result.
    """
    steps, seconds = (EARLY_STEPS, EARLY_SECONDS) if point == "early" else (MID_STEPS, MID_SECONDS)
    await k.start(run, steps, seconds)
    if point == "early":
        ref = await marks.wait(lambda m: m.run == run and m.kind == "enter", 60, f"{run} entered")
        at = ref.at + 0.02 * rng.random()
    else:
        ref = await marks.wait(lambda m: m.run == run and m.kind == "step", 60, f"{run} step")
        at = ref.at + MID_AT
    await asyncio.sleep(max(0.0, at - time.time()))
    victim = k.victim(ref.pid)
    killed_at = time.time()
    victim.kill()
    await k.recover(run, ref.pid)
    nxt = await marks.wait(
        lambda m: m.run == run and m.kind == "step" and m.pid != ref.pid and m.at >= killed_at,
        120,
        f"{run} resumed",
    )
    out.next_step.append(nxt.at - killed_at)
    await k.result(run)
    out.done.append(time.time() - killed_at)


# --- configuration and figures ------------------------------------------------------------------


@dataclass
class Config:
    steps: int = 1000
    """Steps of the sequential run."""
    runs: int = 100
    run_steps: int = 10
    latency_runs: int = 200
    latency_gap: float = 0.005
    """Untimed pause between 1-step runs (bench/foundation.py's default)."""
    repeats: int = 3
    kill_rounds: int = 5
    """Kill rounds per kill point."""
    columns: tuple[str, ...] = ()
    json_out: str | None = None
    quick: bool = False


def kill_summary(k: KillFigures) -> dict[str, Any]:
    from bench.util import median

    return {
        "next_step_p50": median(k.next_step),
        "next_step_max": max(k.next_step, default=float("nan")),
        "done_p50": median(k.done),
        "next_step_each": k.next_step,
        "done_each": k.done,
    }


async def kill_rounds(
    cfg: Config, k: KillRound, marks: Marks, tag: str, log: Callable[[str], None]
) -> dict[str, Any]:
    """``cfg.kill_rounds`` rounds of each kill point; their summaries by point."""
    rng = random.Random(26)
    out: dict[str, Any] = {}
    for point in KILL_POINTS:
        figs = KillFigures()
        for r in range(cfg.kill_rounds):
            log(f"{tag}: {point} kill, round {r + 1}/{cfg.kill_rounds}")
            await kill_round(
                k, marks, f"{tag}-{point}-{r}-{rng.randrange(10**6)}", point, rng, figs
            )
        out[point] = kill_summary(figs)
    return out


def throughput_summary(reps: list[dict[str, float]]) -> dict[str, float]:
    """Medians over repeats of ``seq`` (s per step), ``conc`` (steps/s), ``one_p50`` (s)."""
    from bench.util import median

    return {key: median([r[key] for r in reps]) for key in reps[0]} if reps else {}


async def repeated(
    seq: Callable[[int], Awaitable[float]],
    conc: Callable[[int, int], Awaitable[float]],
    lat: Callable[[int], Awaitable[float]],
    spec: dict[str, Any],
) -> dict[str, float]:
    """An engine's throughput figures, as every in-process peer measures them: a warm-up,
    then ``spec["repeats"]`` repeats of the sequential run, the concurrent runs and the 1-step
    latency; the median of each (a ``repeat`` line is printed after each repeat)."""
    await seq(200)
    await conc(50, 5)
    await lat(20)
    reps = []
    for _ in range(spec["repeats"]):
        reps.append(
            {
                "seq": await seq(spec["steps"]),
                "conc": await conc(spec["runs"], spec["run_steps"]),
                "one_p50": await lat(spec["latency_runs"]),
            }
        )
        print("repeat", flush=True)
    from bench.util import median

    return {k: median([r[k] for r in reps]) for k in reps[0]}


def app_main(
    bench: Callable[[str, dict[str, Any]], Awaitable[dict[str, float]]],
    serve: Callable[[str], Awaitable[None]],
) -> None:
    """An in-process peer's entry point: ``bench TARGET SPEC`` prints ``result <json>``;
    ``serve TARGET`` takes kill-round commands on stdin."""
    import json

    if sys.argv[1] == "bench":
        print("result " + json.dumps(run_loop(bench(sys.argv[2], json.loads(sys.argv[3])))))
    else:
        run_loop(serve(sys.argv[2]))
