"""Chaos harness: many agent runs, real worker processes, real crashes; then check every history.

Run from the repository root::

    python -m bench.chaos                                   # 50 runs, 2 workers, 20 faults
    python -m bench.chaos --runs 1000 --faults 200 --seed 7 # the large run of docs/chaos.md
    python -m bench.chaos --cluster                         # on a 3-node cluster, R3 streams

It starts, all on 127.0.0.1 and all its own:

- an ``EmbeddedServer`` (temporary store directory, free port, ``sync_interval: always``), or
  with ``--cluster`` a 3-node ``LocalCluster`` on loopback whose streams (and every process's
  ``Settings``) have 3 replicas (``bench/chaos_nats.py``);
- the effect store ``python -m bench.chaos_store`` (SQLite in WAL mode, its own process), which
  applies each effect once per idempotency key and also counts every raw execution;
- K worker processes ``python -m bench.chaos_agents`` serving the ``chaos`` agent
  (``bench/chaos_agents.py``: M steps, each one effect, a durable sleep between steps, random
  transient failures retried by a ``RetryPolicy``), with a short lease, and with
  ``SOJOURN_FAULTS``/``SOJOURN_FAULT_RATE`` arming the runtime's named seams
  (``sojourn.actors.worker.faults``): a worker SIGKILLs itself there at random. A worker that
  dies, by a seam or by the harness, is replaced at once, so K stay up.

Then it starts N runs (at random times over the fault window, ``--faults x --fault-gap``
seconds) and injects F faults at random times in it, each one of: SIGKILL a worker; SIGSTOP a
worker for longer than the lease, then SIGCONT it (its runs are taken over meanwhile, and it
wakes up as a stale writer); SIGKILL the nats-server and restart it on the same store and port.
On a cluster the broker fault is ``kill_node`` instead: SIGKILL one node (the events stream's
leader half of the time) and restart it shortly after, one node at a time; ``restart_nats``
there crashes the whole cluster (opt-in).

When the window is over the faults stop: workers started from then on are not armed, and every
run must end within ``--timeout`` seconds (liveness). Then it stops the workers and the store,
reads every run's history (the server is no longer touched) and the store's tables, and checks
the invariants listed in docs/chaos.md (``bench/chaos_check.py``). It prints a summary table
and exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sojourn.actors import Client, Watchdog, fold
from sojourn.actors.worker import faults
from sojourn.broker import Broker, Delivery
from sojourn.broker.eventstore import Decision
from sojourn.broker.server import die_with_parent
from sojourn.broker.topology import stream_configs
from sojourn.schemas.codec import decode_events
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import SojournError
from sojourn.schemas.events import RunEvent, WaitStarted
from sojourn.schemas.health import Liveness

from .chaos_agents import AGENT, GATE
from .chaos_check import TERMINAL, Report, check_effects, check_run, check_watchdog
from .chaos_nats import ClusterNats, SingleNats

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
SEAMS = tuple(
    s for s in faults.SEAMS if s not in ("continued", "fired", "forked", "update_applied")
)
"""The runtime's seams (``actors/worker/faults.py``) the harness arms: all but those its agents
never pass (they neither continue as new, nor run on a schedule, nor fork, nor take updates)."""
FAULT_TYPES = ("sigkill_worker", "sigstop_worker", "restart_nats", "kill_node")
DEFAULT_FAULTS = ("sigkill_worker", "sigstop_worker", "restart_nats")
CLUSTER_FAULTS = ("sigkill_worker", "sigstop_worker", "kill_node")
"""A cluster's default faults: one node at a time (``restart_nats``, every node, is opt-in)."""


def log(msg: str) -> None:
    """Progress goes to stderr; the report goes to stdout."""
    print(msg, file=sys.stderr, flush=True)


def _child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    for k in ("SOJOURN_FAULTS", "SOJOURN_FAULT_RATE"):
        env.pop(k, None)
    env.update(extra)
    return env


# --- processes ----------------------------------------------------------------------------------


TARGET_TRIES = 20
"""Workers a fault tries in turn when the one chosen has just exited (a seam's own kill)."""


class Child:
    """A child process the harness started (Popen from the main thread, so PDEATHSIG holds).

    Its stdout is read line by line by a thread; stderr goes to a log file. Signals are sent
    through ``Popen.send_signal``, which checks the child is not yet reaped, so a PID that has
    been recycled is never signalled.
    """

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the harness only; it stops everyone
            preexec_fn=die_with_parent(signal.SIGKILL),
        )
        self.pid = self.proc.pid
        self.ready = threading.Event()
        self.first_line = ""
        self.last_seam: str | None = None
        self.seam_passes: Counter[str] = Counter()
        self.killed_by_harness = False
        self.stopped = False  # SIGSTOPped by the harness right now
        self.accounted = False
        self.armed = False
        self.started_at = time.monotonic()
        self._reader = threading.Thread(target=self._read, name=f"{name}-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            if line.startswith("seam "):
                seam = line[5:]
                self.last_seam = seam
                self.seam_passes[seam] += 1
            elif not self.ready.is_set():
                self.first_line = line
                self.ready.set()
        self.proc.stdout.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def drain(self) -> None:
        """After the process exited: let the reader take its last lines (EOF comes at once)."""
        self._reader.join(timeout=2.0)

    def signal(self, sig: int) -> bool:
        if self.proc.poll() is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)
        return True

    async def exited(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def stop(self, grace: float = 10.0) -> None:
        """SIGCONT (a stopped process cannot act on SIGTERM), SIGTERM, then SIGKILL."""
        if self.alive():
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            if not await self.exited(grace):
                self.signal(signal.SIGKILL)
                await self.exited(10)
        self.close()

    def kill_now(self) -> None:
        """Synchronous last-resort cleanup."""
        self.signal(signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.wait(5)
        self.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._log.close()

    def tail(self, lines: int = 8) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


@dataclass
class Tally:
    """What happened to processes and what the harness did."""

    faults: Counter[str] = field(default_factory=Counter)
    faults_skipped: Counter[str] = field(default_factory=Counter)
    seam_kills: Counter[str] = field(default_factory=Counter)
    seam_passes: Counter[str] = field(default_factory=Counter)
    other_exits: Counter[str] = field(default_factory=Counter)
    other_exit_tails: list[str] = field(default_factory=list)
    workers_started: int = 0
    fault_window: float = 0.0
    heal: float = 0.0
    flags: Counter[str] = field(default_factory=Counter)
    """Runs the watchdog saw become stalled, orphaned, overdue or wedged."""
    rewakes: int = 0

    def on_liveness(self, liv: Liveness, _before: Liveness | None) -> None:
        if liv.flagged:
            self.flags[liv.state] += 1


class WorkerPool:
    """Keeps K worker processes up: a worker that dies is replaced by a new one."""

    def __init__(
        self, k: int, argv: list[str], env: dict[str, str], logdir: Path, tally: Tally
    ) -> None:
        self.k = k
        self.argv = argv
        self.env = env
        self.armed = "SOJOURN_FAULTS" in env
        self.logdir = logdir
        self.tally = tally
        self.slots: list[Child | None] = [None] * k
        self.everyone: list[Child] = []
        self.closing = False
        self._respawn_after = [0.0] * k

    def _spawn(self, i: int) -> Child:
        n = self.tally.workers_started
        self.tally.workers_started += 1
        child = Child(f"worker{n}", self.argv, self.env, self.logdir / f"worker{n:04d}.log")
        child.armed = self.armed
        self.slots[i] = child
        self.everyone.append(child)
        return child

    def start(self) -> None:
        for i in range(self.k):
            self._spawn(i)

    async def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all(c is not None and c.ready.is_set() for c in self.slots):
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not become ready:\n" + self._tails())
            self.reap()
            await asyncio.sleep(0.05)

    def _tails(self) -> str:
        return "\n".join(f"{c.name}: {c.tail()}" for c in self.slots if c is not None)

    def _record_death(self, c: Child, *, at_stop: bool = False) -> None:
        if c.accounted:
            return
        c.accounted = True
        c.drain()
        self.tally.seam_passes.update(c.seam_passes)
        code = c.proc.returncode
        if c.killed_by_harness or at_stop:
            return
        if code == -signal.SIGKILL:
            self.tally.seam_kills[c.last_seam or "unknown"] += 1
            return
        tail = c.tail()
        if code == 1 and not c.ready.is_set() and "BrokerUnavailable" in tail:
            # Down, or (on a cluster) up but a stream without a leader for a moment.
            why = (
                "JetStream did not answer"
                if "JetStream did not answer" in tail
                else "no nats-server"
            )
            self.tally.other_exits[f"{why} at start-up (restarting)"] += 1
            return
        why = f"exit {code}" if code is not None and code >= 0 else f"signal {-(code or 0)}"
        self.tally.other_exits[why] += 1
        if len(self.tally.other_exit_tails) < 5:
            self.tally.other_exit_tails.append(f"{c.name} ({why}):\n{tail}")

    def reap(self) -> None:
        """Record dead workers and replace them (a worker that fails to start, e.g. while
        the nats-server is down, is retried after a short pause)."""
        now = time.monotonic()
        for i, c in enumerate(self.slots):
            if c is not None and not c.alive():
                self._record_death(c)
                c.close()
                self.slots[i] = None
                if not c.killed_by_harness and c.proc.returncode not in (-signal.SIGKILL,):
                    self._respawn_after[i] = now + 0.5
            if c is not None and c.alive() and not c.ready.is_set():
                if now - c.started_at > 60:  # hung at start-up: replace it
                    c.killed_by_harness = True
                    c.signal(signal.SIGKILL)
            if self.slots[i] is None and not self.closing and now >= self._respawn_after[i]:
                self._spawn(i)

    async def supervise(self) -> None:
        while not self.closing:
            self.reap()
            await asyncio.sleep(0.05)

    def disarm(self) -> None:
        """Workers started from now on do not arm the seams (the fault window is over)."""
        self.env = {k: v for k, v in self.env.items() if not k.startswith("SOJOURN_FAULT")}
        self.armed = False

    def armed_alive(self) -> int:
        return sum(1 for c in self.slots if c is not None and c.alive() and c.armed)

    def targets(self) -> list[Child]:
        return [c for c in self.slots if c is not None and c.alive() and c.ready.is_set()]

    async def stop_all(self) -> None:
        self.closing = True
        self.reap()  # record deaths that happened since the last look (no respawn now)
        live = [c for c in self.everyone if c.alive()]
        await asyncio.gather(*(c.stop() for c in live))
        for c in self.everyone:
            self._record_death(c, at_stop=True)
            c.close()

    def kill_all_now(self) -> None:
        self.closing = True
        for c in self.everyone:
            c.kill_now()


# --- faults -------------------------------------------------------------------------------------


class Chaos:
    """Injects the harness's faults."""

    def __init__(
        self,
        pool: WorkerPool,
        nats: SingleNats | ClusterNats,
        broker: Broker,
        rng: random.Random,
        lease: float,
        tally: Tally,
    ) -> None:
        self.pool = pool
        self.nats = nats
        self.broker = broker
        self.rng = rng
        self.lease = lease
        self.tally = tally
        self.holds: set[asyncio.Task[None]] = set()
        self.done = False

    async def _target(self) -> Child | None:
        """A ready worker that is not paused (waits a little for one to come up)."""
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            choices = [c for c in self.pool.targets() if not c.stopped]
            if choices:
                return self.rng.choice(choices)
            await asyncio.sleep(0.1)
        return None

    async def inject(self, kind: str) -> None:
        if kind in self.nats.kinds:
            await self.nats.inject(kind, self.rng, self.broker)
            self.tally.faults[kind] += 1
            return
        # A worker chosen may die by a seam of its own before the signal reaches it: another
        # is chosen then (the fault is skipped only when no worker is up for 15 s).
        for _ in range(TARGET_TRIES):
            target = await self._target()
            if target is None:
                break
            if kind == "sigkill_worker":
                target.killed_by_harness = True
                if target.signal(signal.SIGKILL):
                    self.tally.faults[kind] += 1
                    return
                target.killed_by_harness = False
                await asyncio.sleep(0.1)  # the pool notices the exit; then another
                continue
            hold = self.lease * self.rng.uniform(1.5, 2.5)
            target.stopped = True
            if not target.signal(signal.SIGSTOP):
                target.stopped = False
                await asyncio.sleep(0.1)
                continue
            self.tally.faults[kind] += 1
            task = asyncio.create_task(self._resume_later(target, hold))
            self.holds.add(task)
            task.add_done_callback(self.holds.discard)
            return
        self.tally.faults_skipped[kind] += 1

    async def _resume_later(self, target: Child, hold: float) -> None:
        try:
            await asyncio.sleep(hold)
        finally:
            target.signal(signal.SIGCONT)
            target.stopped = False

    async def run(self, schedule: list[tuple[float, str]], t0: float, window: float) -> None:
        """Inject the scheduled faults; return when the window is over, every paused worker
        has been resumed and the broker is whole again (every node up, every stream led)."""
        for at, kind in schedule:
            delay = t0 + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.inject(kind)
        if self.holds:
            await asyncio.gather(*self.holds, return_exceptions=True)
        delay = t0 + window - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await self.nats.heal(self.broker)
        self.done = True


# --- runs ---------------------------------------------------------------------------------------


class Runs:
    """Starts the runs and watches which have ended."""

    def __init__(self, client: Client, run_ids: list[str], job: dict[str, Any]) -> None:
        self.client = client
        self.run_ids = run_ids
        self.job = job
        self.started: list[str] = []
        self._gates: set[asyncio.Task[None]] = set()
        self.ended: set[str] = set()
        self.hinted: set[str] = set()
        self.start_errors = 0
        self.signal_errors = 0

    async def start_all(self, times: list[float], t0: float) -> None:
        for run_id, at in zip(self.run_ids, times, strict=True):
            delay = t0 + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            while True:  # the publish ack is the receipt; retry (same run id) until we have it
                try:
                    await self.client.start(AGENT, self.job, run_id=run_id)
                    break
                except (SojournError, TimeoutError, OSError) as e:
                    self.start_errors += 1
                    if self.start_errors <= 3:
                        log(f"  start {run_id}: {type(e).__name__}: {e}; retrying")
                    await asyncio.sleep(0.25)
            self.started.append(run_id)
            if self.job.get("gate"):
                task = asyncio.create_task(self.open_gate(run_id, at_random=True))
                self._gates.add(task)
                task.add_done_callback(self._gates.discard)

    async def open_gate(self, run_id: str, *, at_random: bool) -> None:
        """Send the run its ``gate`` signal, some time after its start (it may arrive before
        or after the run waits for it), retrying with the same signal id until the inbox has
        it: however often it is sent, it counts once."""
        if at_random and random.Random(run_id).random() < 0.5:
            # Half the runs get it early (buffered until they wait); the others once they
            # have parked on it, so its wake is what resumes them.
            while not await self._parked_on_gate(run_id):  # noqa: ASYNC110 (polls the broker)
                await asyncio.sleep(0.2)
        while True:
            try:
                await self.client.signal(run_id, GATE, True, signal_id=f"gate-{run_id}")
                return
            except (SojournError, TimeoutError, OSError) as e:
                self.signal_errors += 1
                if self.signal_errors <= 3:
                    log(f"  signal {run_id}: {type(e).__name__}: {e}; retrying")
                await asyncio.sleep(0.25)

    async def _last_events(self, run_id: str) -> list[RunEvent]:
        """The events of the run's last stored decision ([] when it has none)."""
        c = self.client
        last = await c.broker.direct_get_last(c.names.events_stream, c.names.events(run_id))
        return [] if last is None else decode_events(last.data)

    async def _parked_on_gate(self, run_id: str) -> bool:
        with contextlib.suppress(Exception):
            return any(
                isinstance(e, WaitStarted) and e.key == "signal:" + GATE
                for e in await self._last_events(run_id)
            )
        return False

    async def _ended(self, run_id: str) -> bool:
        return any(isinstance(e, TERMINAL) for e in await self._last_events(run_id))

    async def sweep(self, only_hinted: bool) -> None:
        pending = [r for r in self.started if r not in self.ended]
        if only_hinted:
            pending = [r for r in pending if r in self.hinted]
        sem = asyncio.Semaphore(16)

        async def check(run_id: str) -> None:
            async with sem:
                with contextlib.suppress(Exception):
                    if await self._ended(run_id):
                        self.ended.add(run_id)

        await asyncio.gather(*(check(r) for r in pending))

    async def watch(self) -> None:
        n = 0
        while True:
            await self.sweep(only_hinted=n % 10 != 0)
            n += 1
            await asyncio.sleep(0.5)

    async def holders(self) -> dict[str, str]:
        """For each run not ended: who holds it and how it looks (taken while the workers
        still run), judged like ``sojourn status`` does."""
        c, out = self.client, {}
        for run_id in self.started:
            if run_id in self.ended:
                continue
            with contextlib.suppress(Exception):
                live = await c.liveness(run_id)
                held = f"held by {live.owner}" if live.owner else "held by no worker"
                out[run_id] = f"{live.state}, {held}" + (f" ({live.reason})" if live.reason else "")
        return out

    async def wake_backlog(self) -> str:
        """What the wake consumers (the agent's and the unrouted one) still hold: a stuck run
        with no wake pending anywhere will never be looked at again."""
        c = self.client
        out = []
        for consumer in (c.names.agent_wake_consumer(AGENT), c.names.wake_consumer):
            try:
                info = await c.broker.api(
                    f"$JS.API.CONSUMER.INFO.{c.names.wake_stream}.{consumer}", {}
                )
            except Exception as e:
                out.append(f"consumer {consumer} unreadable ({type(e).__name__})")
                continue
            out.append(
                f"consumer {consumer}: {info.get('num_pending', '?')} wake(s) pending, "
                f"{info.get('num_ack_pending', '?')} delivered and awaiting ack"
            )
        return "; ".join(out)

    async def describe_pending(self, limit: int = 5) -> str:
        """The first ``limit`` runs not ended yet and their last stored decision, for the
        progress log of a heal that takes long."""
        pending = [r for r in self.started if r not in self.ended]
        parts = []
        for run_id in pending[:limit]:
            try:
                last = [type(e).__name__ for e in await self._last_events(run_id)]
            except Exception as e:
                parts.append(f"{run_id} unreadable ({type(e).__name__})")
                continue
            parts.append(f"{run_id} last decision {last}")
        more = f" and {len(pending) - limit} more" if len(pending) > limit else ""
        return "; ".join(parts) + more

    @property
    def all_ended(self) -> bool:
        return len(self.started) == len(self.run_ids) and len(self.ended) == len(self.run_ids)


# --- the harness --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.chaos", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    ap.add_argument("--runs", type=int, default=50, help="agent runs (default 50)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes kept up (2)")
    ap.add_argument("--faults", type=int, default=20, help="faults the harness injects (20)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    ap.add_argument(
        "--seams",
        default=",".join(SEAMS),
        help="named seams armed in the workers, comma-separated, or 'none' (default: all of SEAMS)",
    )
    ap.add_argument(
        "--fault-rate", type=float, default=0.05, help="kill probability at an armed seam (0.05)"
    )
    ap.add_argument(
        "--cluster",
        action="store_true",
        help="run on a 3-node loopback cluster with R3 streams (default: one nats-server)",
    )
    ap.add_argument(
        "--fault-types",
        default=None,
        help=f"harness faults to draw from (default {','.join(DEFAULT_FAULTS)}; with "
        f"--cluster {','.join(CLUSTER_FAULTS)}; restart_nats on a cluster crashes every node)",
    )
    ap.add_argument(
        "--fault-gap", type=float, default=1.5, help="mean seconds between harness faults (1.5)"
    )
    ap.add_argument(
        "--timeout", type=float, default=90.0, help="seconds to wait for runs after the faults"
    )
    ap.add_argument("--steps", type=int, default=4, help="steps per run (4)")
    ap.add_argument("--sleep", type=float, default=0.3, help="durable sleep between steps (0.3 s)")
    ap.add_argument(
        "--no-gate",
        action="store_true",
        help="runs do not wait for a gate signal after their last step (default: they do, and "
        "the harness sends it)",
    )
    ap.add_argument("--lease", type=float, default=2.0, help="worker lease TTL (2 s)")
    ap.add_argument(
        "--fail-rate", type=float, default=0.1, help="transient step failure probability (0.1)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument(
        "--clean",
        action="store_true",
        help="delete the work directory even after a violation (default: keep it then)",
    )
    ap.add_argument(
        "--break-idempotency",
        action="store_true",
        help="self-test: steps add the attempt to their key, so a re-run step applies its "
        "effect again; the harness must then report violations and exit 1",
    )
    args = ap.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 1_000_000)
    seams = [] if args.seams in ("", "none") else args.seams.split(",")
    bad = [s for s in seams if s not in SEAMS]
    if bad:
        ap.error(f"unknown seam(s) {bad}; known: {', '.join(SEAMS)}")
    args.seam_list = seams
    if args.fault_types is None:
        args.fault_types = ",".join(CLUSTER_FAULTS if args.cluster else DEFAULT_FAULTS)
    types = [t for t in args.fault_types.split(",") if t]
    bad = [t for t in types if t not in FAULT_TYPES]
    if bad or (not types and args.faults):
        ap.error(f"unknown fault type(s) {bad}; known: {', '.join(FAULT_TYPES)}")
    if "kill_node" in types and not args.cluster:
        ap.error("kill_node needs --cluster")
    args.fault_type_list = types
    if args.runs < 1 or args.workers < 1 or args.faults < 0 or args.steps < 1:
        ap.error("--runs, --workers and --steps must be >= 1, --faults >= 0")
    return args


async def _start_store(workdir: Path) -> tuple[Child, str]:
    store = Child(
        "store",
        [PYTHON, "-m", "bench.chaos_store", str(workdir / "effects.sqlite"), "0"],
        _child_env(),
        workdir / "store.log",
    )
    if not await asyncio.to_thread(store.ready.wait, 30) or not store.first_line.startswith(
        "ready "
    ):
        raise RuntimeError(f"the effect store did not start: {store.first_line!r}\n{store.tail()}")
    return store, f"127.0.0.1:{int(store.first_line.split()[1])}"


async def harness(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    t_begin = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="sojourn-chaos-"))
    (workdir / "workers").mkdir()
    prefix = f"chaos{args.seed}"
    nats: SingleNats | ClusterNats = (
        ClusterNats(workdir / "cluster") if args.cluster else SingleNats(workdir / "nats")
    )
    settings = Settings(prefix=prefix, lease_ttl=args.lease, replicas=nats.replicas)
    tally = Tally()
    store: Child | None = None
    pool: WorkerPool | None = None
    client: Client | None = None
    watchdog: Watchdog | None = None
    tasks: list[asyncio.Task[Any]] = []
    keep = args.keep
    ok = False
    print(
        f"sojourn chaos: {args.runs} runs x {args.steps} steps, {args.workers} workers, "
        f"{args.faults} faults ({','.join(args.fault_type_list)}), "
        f"seams {','.join(args.seam_list) or 'none'} @ {args.fault_rate}, "
        f"lease {args.lease:g} s, "
        f"{'3-node cluster, R3' if args.cluster else 'one nats-server'}, seed {args.seed}",
        flush=True,
    )
    try:
        await nats.start()
        store, store_addr = await _start_store(workdir)
        env = _child_env(
            CHAOS_STORE=store_addr,
            CHAOS_SEED=str(args.seed),
            CHAOS_FAIL_RATE=str(args.fail_rate),
        )
        if args.break_idempotency:
            env["CHAOS_BREAK_KEYS"] = "1"
        if args.seam_list:
            env["SOJOURN_FAULTS"] = ",".join(args.seam_list)
            env["SOJOURN_FAULT_RATE"] = str(args.fault_rate)
        argv = [PYTHON, "-m", "bench.chaos_agents", nats.url, prefix, str(args.lease)]
        argv.append(str(nats.replicas))
        pool = WorkerPool(args.workers, argv, env, workdir / "workers", tally)
        pool.start()
        client = await Client.connect(nats.url, settings=settings)
        await client._ensure()  # create the streams before the first worker needs them
        if isinstance(nats, ClusterNats):
            nats.events_stream = client.names.events_stream
            nats.streams = [c["name"] for c in stream_configs(client.names, settings)]
        # A watchdog through all of it (broker restarts included): it re-wakes stuck runs, and
        # its run model must end up agreeing with the histories. Its flags are counted in the
        # report rather than logged one by one.
        logging.getLogger("sojourn.watchdog").setLevel(logging.ERROR)
        watchdog = await Watchdog(
            nats=nats.url, settings=settings, on_change=tally.on_liveness
        ).start()
        await pool.wait_ready(60)
        tasks.append(asyncio.create_task(pool.supervise()))

        window = max(args.faults * args.fault_gap, 5.0)
        fault_times = sorted(rng.uniform(0, window) for _ in range(args.faults))
        schedule = [(t, rng.choice(args.fault_type_list)) for t in fault_times]
        start_times = sorted(rng.uniform(0, window * 0.75) for _ in range(args.runs))
        run_ids = [f"r{i:05d}" for i in range(args.runs)]
        job = {"steps": args.steps, "sleep": args.sleep, "gate": not args.no_gate}
        runs = Runs(client, run_ids, job)
        chaos = Chaos(pool, nats, client.broker, rng, args.lease, tally)
        log(f"  work dir {workdir}; nats {nats.url}; store {store_addr}")
        t0 = time.monotonic()
        starter = asyncio.create_task(runs.start_all(start_times, t0))
        injector = asyncio.create_task(chaos.run(schedule, t0, window))
        watcher = asyncio.create_task(runs.watch())
        tasks += [starter, injector, watcher]
        await _subscribe_hints(client, runs)

        # Wait for the faults to be done and every run to end (bounded).
        last_note = 0.0
        deadline: float | None = None
        t_heal: float | None = None
        while True:
            for t in (starter, injector):
                if t.done() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
            now = time.monotonic()
            if injector.done() and starter.done() and deadline is None:
                # The fault window is over: replacements come up unarmed, and every run must
                # now end within --timeout (liveness once faults stop).
                deadline = now + args.timeout
                pool.disarm()
                t_heal = now
            if now - last_note > 5:
                last_note = now
                log(
                    f"  [{now - t0:6.1f}s] started {len(runs.started)}/{args.runs} "
                    f"ended {len(runs.ended)} faults {sum(tally.faults.values())}/{args.faults} "
                    f"seam kills {sum(tally.seam_kills.values())} "
                    f"workers up {len(pool.targets())}/{args.workers} "
                    f"(armed {pool.armed_alive()}) started so far {tally.workers_started}"
                )
                if t_heal is not None and now - t_heal > 15:
                    log(
                        f"    still open {now - t_heal:.0f} s after the faults: "
                        f"{await runs.describe_pending()}"
                    )
            if injector.done() and runs.all_ended:
                break
            if deadline is not None and now > deadline:
                log(f"  timed out after {args.timeout:g} s waiting for runs to end")
                break
            await asyncio.sleep(0.2)
        t_end = time.monotonic()
        heal = t_end - t_heal if t_heal is not None else float("nan")
        await runs.sweep(only_hinted=False)
        lease_notes = await runs.holders() if not runs.all_ended else {}
        backlog = await runs.wake_backlog() if not runs.all_ended else ""

        # Settle: no more faults; stop workers and the store; the server stays up untouched.
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        tasks.clear()
        await pool.stop_all()
        await store.stop()
        report = Report()
        histories: dict[str, list[Decision]] = {}
        outcomes: dict[str, dict[tuple[int, int], str]] = {}
        for run_id in run_ids:
            if run_id not in runs.started:
                report.violate(f"{run_id}: never started (harness error)")
                continue
            histories[run_id] = await client.history(run_id)
            outcomes[run_id] = check_run(
                run_id, histories[run_id], args.steps, report, gate=not args.no_gate
            )
        for run_id in report.lost:
            report.violate(f"{run_id}: lost (its start was acknowledged; it has no history)")
        wall = time.time()
        for run_id in report.stuck:
            h = histories[run_id]
            st = fold(e for d in h for e in d.events)
            due = "" if st.deadline is None else f", due {wall - st.deadline:.0f} s ago"
            last = h[-1].events[-1].at if h and h[-1].events else 0.0
            report.violate(
                f"{run_id}: stuck in status {st.status!r} (waiting on {list(st.waiting_on)}"
                f"{due}); last written by {h[-1].writer if h else '?'} {wall - last:.0f} s ago;"
                f" before the workers stopped: {lease_notes.get(run_id, '?')}; {backlog}"
            )
        check_effects(workdir / "effects.sqlite", histories, outcomes, args.steps, report)
        await check_watchdog(watchdog, histories, report)
        tally.rewakes = watchdog.actions
        tally.fault_window = (t_heal - t0) if t_heal is not None else t_end - t0
        tally.heal = heal
        _print_report(args, report, tally, nats, runs, t_end - t0, time.monotonic() - t_begin)
        ok = not report.violations
        if not ok and not args.clean:
            keep = True
            print(f"work dir kept for inspection: {workdir}", flush=True)
        return 0 if ok else 1
    finally:
        for t in tasks:
            t.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*tasks, return_exceptions=True)
        if pool is not None:
            try:
                await pool.stop_all()
            except BaseException:
                pool.kill_all_now()
                raise
        if store is not None:
            try:
                await store.stop()
            except BaseException:
                store.kill_now()
                raise
        if watchdog is not None:
            with contextlib.suppress(BaseException):
                await watchdog.stop()
        if client is not None:
            with contextlib.suppress(BaseException):
                await client.close()
        with contextlib.suppress(BaseException):
            await nats.stop()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not ok:
            log(f"  work dir: {workdir}")


async def _subscribe_hints(client: Client, runs: Runs) -> None:
    """Subscribe to every run's event subject: a terminal event seen there is a hint that
    ``Runs.sweep`` confirms by reading what the stream stored."""
    subject = client.names.events_all

    async def on_msg(msg: Delivery) -> None:
        with contextlib.suppress(Exception):
            if any(isinstance(e, TERMINAL) for e in decode_events(msg.data)):
                runs.hinted.add(msg.subject.rsplit(".", 1)[-1])

    await client.broker.subscribe(subject, cb=on_msg)


def _latencies(xs: list[float]) -> str:
    """p50/p99/max of seconds from the record of a gate signal that reached a run parked on it
    to the wait it ended (a signal recorded before the run waited is consumed without parking)."""
    if not xs:
        return "none"
    xs = sorted(xs)
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    return (
        f"p50 {pick(0.5):.2f} s, p99 {pick(0.99):.2f} s, max {xs[-1]:.2f} s "
        f"({len(xs)} runs parked on it)"
    )


def _fmt_counter(c: Iterable[tuple[str, int]]) -> str:
    parts = [f"{k} {v}" for k, v in c]
    return ", ".join(parts) if parts else "none"


def _print_report(
    args: argparse.Namespace,
    report: Report,
    tally: Tally,
    nats: SingleNats | ClusterNats,
    runs: Runs,
    elapsed: float,
    total: float,
) -> None:
    per_step = report.effects_per_step
    exactly_one = per_step.get(1, 0) == report.steps_expected
    dist = ", ".join(f"{k} step(s) with {n}" for n, k in sorted(per_step.items()))
    open_steps = report.effects_per_open_step
    if open_steps:
        dist += "; steps of stuck runs never completed: " + ", ".join(
            f"{k} with {n}" for n, k in sorted(open_steps.items())
        )
    reexec = report.executions - report.effects
    rows = [
        ("runs started", f"{len(runs.started)}"),
        ("runs completed", f"{report.completed}"),
        ("runs lost (no history)", f"{len(report.lost)}"),
        ("runs stuck (not ended)", f"{len(report.stuck)}"),
        ("runs ended otherwise", f"{len(report.ended_otherwise)}"),
        (
            "effects applied per step",
            f"{'exactly one' if exactly_one else 'NOT exactly one'} "
            f"({report.effects} effects, {report.steps_expected} completed steps: {dist})",
        ),
        ("raw executions", f"{report.executions}"),
        ("raw re-executions", f"{reexec} (executions - effects)"),
        ("  by attempt outcome", _fmt_counter(sorted(report.reexec_by_reason.items()))),
        ("step attempts recorded", f"{report.attempts}"),
        ("in-doubt attempts", f"{report.in_doubt} (started, never completed or failed)"),
        ("failed attempts retried", f"{report.failed_attempts}"),
        ("waits completed", f"{report.timer_waits}"),
        ("gate signal to resume", _latencies(report.gate_latencies)),
        ("history", f"{report.decisions} decisions, {report.events} events"),
        (
            "faults injected",
            f"{sum(tally.faults.values())} ({_fmt_counter(sorted(tally.faults.items()))})",
        ),
        ("faults skipped", _fmt_counter(sorted(tally.faults_skipped.items()))),
        (
            "seam kills",
            f"{sum(tally.seam_kills.values())} ({_fmt_counter(sorted(tally.seam_kills.items()))})",
        ),
        ("seam passes", _fmt_counter(sorted(tally.seam_passes.items()))),
        ("worker processes", f"{tally.workers_started} started"),
        ("other worker exits", _fmt_counter(sorted(tally.other_exits.items()))),
        nats.summary(),
        (
            "watchdog",
            f"flagged {_fmt_counter(sorted(tally.flags.items()))}; {tally.rewakes} re-wakes",
        ),
        (
            "trigger publish retries",
            f"{runs.start_errors}; signal publish retries {runs.signal_errors}",
        ),
        (
            "elapsed",
            f"{elapsed:.1f} s of runs: {tally.fault_window:.1f} s under faults, then "
            f"{tally.heal:.1f} s until every run ended; {total:.1f} s in all",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    print("-" * 72)
    for k, val in rows:
        print(f"{k:<{width}}  {val}")
    print("-" * 72)
    for tail in tally.other_exit_tails:
        print(f"note: a worker exited on its own: {tail}")
    print(f"violations: {len(report.violations)}")
    for text in report.violations[:50]:
        print(f"  VIOLATION {text}")
    if len(report.violations) > 50:
        print(f"  ... and {len(report.violations) - 50} more")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    async def top() -> int:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        return await harness(args)

    try:
        code = asyncio.run(top())
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
