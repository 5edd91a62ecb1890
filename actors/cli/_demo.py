"""``sojourn demo``: kill a worker in the middle of a step and show that nothing happened twice.

The demo needs nothing set up. It starts a NATS server in a temporary directory (or uses
``--nats``), worker A as a subprocess serving ``examples/welcome.py``, and one ``welcome`` run.
When worker A is inside the third operation (``provision_account``: the account exists, the
step's completion is not recorded), it SIGKILLs worker A and starts worker B. Worker B takes
the run over once it finds A dead (A's connection is gone, which the server tells at once, or
A's heartbeats stopped for ``worker_dead_after``), replays the recorded
steps without running them, runs the in-doubt step again with the same idempotency key, and
finishes. The demo then prints the history, the outbox and how often each step's code really
ran, and checks that every effect (two emails, one account) exists exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import sojourn.actors
from sojourn.broker.eventstore import Decision
from sojourn.broker.server import EmbeddedServer
from sojourn.schemas.codec import encode
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import SojournError
from sojourn.schemas.events import StepStarted
from sojourn.schemas.names import reserved_run_id

from ..client.client import Client
from ..core.state import RunState, fold
from ._common import bounded
from ._render import clock, describe_event, out

__all__ = ["DemoError", "find_repo_root", "run_demo"]

AGENT = "welcome"
APP = "examples.welcome"
KILL_POSITION = 2  # the third operation: provision_account
LEASE_TTL = 2.0
DEADLINE = 50.0
POLL = 0.02
OUTBOX_ENV = "SOJOURN_DEMO_OUTBOX"  # the same name examples/welcome.py reads


class DemoError(SojournError):
    """The demo could not run, or an effect was duplicated or missing."""


def find_repo_root() -> Path:
    """The directory holding ``examples/welcome.py``: the checkout sojourn runs from (an
    editable install keeps ``actors/`` there), else the current directory."""
    package_dir = Path(sojourn.actors.__file__).resolve().parent
    candidates = [package_dir.parent, Path.cwd()]
    for root in candidates:
        if (root / "examples" / "welcome.py").is_file() and (
            root / "examples" / "__init__.py"
        ).is_file():
            return root
    raise DemoError(
        "cannot find examples/welcome.py (looked in "
        + " and ".join(str(c) for c in candidates)
        + "): run `sojourn demo` from a checkout of the sojourn repository"
    )


@dataclass
class _Worker:
    label: str
    worker_id: str
    proc: asyncio.subprocess.Process
    log_path: Path
    log: IO[bytes]

    def log_text(self) -> str:
        self.log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def demo_run_id() -> str:
    """A fresh ``welcome-<8 hex>`` run id, never one of the forms only sojourn makes: about one
    in 430 draws is ``welcome-c<7 digits>``, a child run's form, which a start is refused."""
    while reserved_run_id(run_id := f"welcome-{uuid.uuid4().hex[:8]}") is not None:
        pass
    return run_id


@dataclass
class _Demo:
    url: str
    settings: Settings
    root: Path
    work: Path
    outbox: Path
    run_id: str = field(default_factory=lambda: demo_run_id())
    workers: list[_Worker] = field(default_factory=list)
    killed_at: float | None = None

    async def start_worker(self, label: str) -> _Worker:
        worker_id = f"demo-worker-{label}"
        log_path = self.work / f"worker-{label}.log"
        log = log_path.open("ab")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(self.root), env.get("PYTHONPATH", "")])
        )
        env[OUTBOX_ENV] = str(self.outbox)
        env["PYTHONUNBUFFERED"] = "1"
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "sojourn.actors.cli",
            "worker",
            "--app",
            APP,
            "--nats",
            self.url,
            "--prefix",
            self.settings.prefix,
            "--lease-ttl",
            str(LEASE_TTL),
            "--worker-id",
            worker_id,
            cwd=self.root,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        worker = _Worker(label, worker_id, proc, log_path, log)
        self.workers.append(worker)
        return worker

    async def wait_ready(self, worker: _Worker, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while "ready; press Ctrl-C" not in worker.log_text():
            if worker.proc.returncode is not None:
                raise DemoError(
                    f"worker {worker.label} exited with code "
                    f"{worker.proc.returncode}: {_tail(worker.log_text())}"
                )
            if time.monotonic() > deadline:
                raise DemoError(
                    f"worker {worker.label} did not start within {within:g}s: "
                    f"{_tail(worker.log_text())}"
                )
            await asyncio.sleep(POLL)

    def who(self, writer: str) -> str:
        for w in self.workers:
            if writer == f"intake:{w.worker_id}":
                return f"worker {w.label} (intake)"
            if writer.startswith(w.worker_id + "."):
                return f"worker {w.label}"
        return writer

    async def stop_workers(self) -> None:
        for w in self.workers:
            if w.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.terminate()
                try:
                    await asyncio.wait_for(w.proc.wait(), 10.0)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        w.proc.kill()
                    await w.proc.wait()
            w.log.close()


def _tail(text: str, lines: int = 5) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:]) or "(no output)"


def _state(history: list[Decision]) -> RunState:
    return fold(e for d in history for e in d.events)


async def _watch_until_in_doubt(demo: _Demo, client: Client) -> RunState:
    """Wait until worker A executes operation ``KILL_POSITION`` and its effect exists."""
    announced: set[int] = set()
    key = f"{demo.run_id}/{KILL_POSITION}".replace("/", "_")
    while True:
        state = _state(await client.history(demo.run_id))
        for op in state.ops:
            if op.kind == "step" and op.position not in announced:
                announced.add(op.position)
                out(f"  worker A runs step {op.position}: {op.name}")
        target = state.op(KILL_POSITION)
        if (
            target is not None
            and target.status == "started"
            and (demo.outbox / "accounts" / f"{key}.json").exists()
        ):
            return state
        if state.terminal or (target is not None and target.status != "started"):
            return state  # missed the window (very slow machine): kill wherever A is now
        await asyncio.sleep(POLL)


def _timeline(demo: _Demo, history: list[Decision]) -> None:
    out(f"\nhistory of run {demo.run_id}:")
    writers = [demo.who(d.writer) for d in history]
    width = max(len("writer"), *(len(w) for w in writers))
    out(f"  {'seq':>3}  {'time (UTC)':<12}  {'writer':<{width}}  event")
    marked = False
    in_doubt: set[int] = set()
    for d, writer in zip(history, writers, strict=True):
        for e in d.events:
            if not marked and demo.killed_at is not None and e.at > demo.killed_at:
                out(
                    f"  {'':>3}  {clock(demo.killed_at):<12}  {'':<{width}}  "
                    "---- worker A killed (SIGKILL) ----"
                )
                marked = True
            name, detail = describe_event(e)
            note = ""
            if isinstance(e, StepStarted) and e.attempt > 1:
                in_doubt.add(e.position)
                note = (
                    f"   <- in doubt: attempt {e.attempt}, same idempotency key "
                    f"{demo.run_id}/{e.position}"
                )
            out(f"  {d.seq:>3}  {clock(e.at):<12}  {writer:<{width}}  {name:<14} {detail}{note}")


def _read_raw_log(outbox: Path) -> list[tuple[str, str, str]]:
    path = outbox / "raw_executions.log"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        key, name, attempt, *_ = line.split()
        rows.append((key, name, attempt))
    return rows


def _report(demo: _Demo, state: RunState) -> list[str]:
    """Print the effects; return what is wrong with them (empty: exactly once)."""
    problems: list[str] = []
    steps = [op for op in state.ops if op.kind == "step"]
    emails = sorted(demo.outbox.glob("*.eml"))
    out(f"\noutbox ({demo.outbox}):")
    subjects: Counter[str] = Counter()
    accounts = sorted((demo.outbox / "accounts").glob("*.json"))
    width = max([len(p.name) for p in emails] + [len(p.name) + 9 for p in accounts] + [0])
    for path in emails:
        head = dict(
            line.split(": ", 1)
            for line in path.read_text(encoding="utf-8").split("\n\n", 1)[0].splitlines()
        )
        subjects[head.get("Subject", "?")] += 1
        out(
            f"  {path.name:<{width}}  To: {head.get('To', '?')}  "
            f"Subject: {head.get('Subject', '?')}"
        )
    for path in accounts:
        name = f"accounts/{path.name}"
        out(f"  {name:<{width}}  {path.read_text(encoding='utf-8').strip()}")

    want_emails = {f"{demo.run_id}_{op.position}.eml" for op in steps if op.name == "send_email"}
    want_accounts = {
        f"{demo.run_id}_{op.position}.json" for op in steps if op.name == "provision_account"
    }
    got_emails = {p.name for p in emails}
    got_accounts = {p.name for p in accounts}
    if got_emails != want_emails or len(want_emails) != 2:
        problems.append(f"emails: expected {sorted(want_emails)}, found {sorted(got_emails)}")
    for subject in ("Welcome!", "Your account is ready"):
        if subjects[subject] != 1:
            problems.append(f"email {subject!r} was sent {subjects[subject]} times")
    if got_accounts != want_accounts or len(want_accounts) != 1:
        problems.append(f"accounts: expected {sorted(want_accounts)}, found {sorted(got_accounts)}")

    raw = _read_raw_log(demo.outbox)
    runs = Counter(key for key, _, _ in raw)
    names = {key: name for key, name, _ in raw}
    out("\nraw executions per idempotency key (how often each step's code ran):")
    for op in steps:
        key = f"{demo.run_id}/{op.position}"
        n = runs.get(key, 0)
        why = ""
        if n > 1:
            why = (
                f"  <- ran again after the kill, same key: the provider saw it {n} times and "
                "acted once"
            )
        out(f"  {key:<24} {names.get(key, op.name):<18} {n}{why}")
        if n == 0:
            problems.append(f"step {op.position} ({op.name}) never ran")
    if state.status != "completed":
        problems.append(f"the run ended {state.status}, not completed")
    return problems


async def _run(demo: _Demo) -> int:
    out(f"nats: {demo.url} (prefix {demo.settings.prefix})")
    out(
        "worker A runs a four-step sign-up agent and is SIGKILLed in the middle of step "
        f"{KILL_POSITION}; worker B finishes the run"
    )
    async with await bounded(Client.connect(demo.url, settings=demo.settings), demo.url) as client:
        a = await demo.start_worker("A")
        await demo.wait_ready(a)
        out(f"worker A started (pid {a.proc.pid})")
        signup = {"name": "Ada", "email": "ada@example.com"}
        receipt = await client.trigger(AGENT, signup, run_id=demo.run_id, timeout=15.0)
        if receipt.queued:
            raise DemoError(f"worker A did not answer the trigger: {_tail(a.log_text())}")
        out(f"run {demo.run_id} started: {AGENT} {encode(signup).decode()}")

        seen = await _watch_until_in_doubt(demo, client)
        target = seen.op(KILL_POSITION)
        if target is not None and target.status == "started":
            out(
                f"worker A is inside step {KILL_POSITION} ({target.name}): the account exists, "
                "the step's completion is not recorded"
            )
        else:
            out(f"worker A is past step {KILL_POSITION} already (a slow machine?); killing it now")
        a.proc.kill()  # SIGKILL, this PID only: no cleanup, no goodbye
        demo.killed_at = time.time()
        await a.proc.wait()
        out(f"  SIGKILL worker A (pid {a.proc.pid})")

        b = await demo.start_worker("B")
        out(
            f"worker B started (pid {b.proc.pid}); it takes the run over once it finds A dead: "
            f"A's connection gone, or its heartbeats stopped for "
            f"{Settings().worker_dead_after:g}s"
        )
        result = await client.result(demo.run_id, timeout=DEADLINE)
        out(f"run completed: {encode(result).decode()}")
        history = await client.history(demo.run_id)

    _timeline(demo, history)
    problems = _report(demo, _state(history))
    if problems:
        out("\nverdict: FAILED: " + "; ".join(problems))
        return 1
    out("\nverdict: every effect happened exactly once")
    return 0


async def run_demo(
    *, nats: str | None = None, prefix: str | None = None, keep: bool = False
) -> int:
    """Run the demo; return 0 when every effect happened exactly once, else 1.

    Args:
        nats: use this server instead of starting one (the demo then uses its own prefix).
        prefix: deployment prefix (default ``sojourn`` on the demo's own server).
        keep: keep the temporary directory (server data, outbox, worker logs) and print it.

    Raises:
        DemoError: the demo could not run (no examples directory, a worker did not start).
    """
    root = find_repo_root()
    work = Path(tempfile.mkdtemp(prefix="sojourn-demo-"))
    outbox = work / "outbox"
    outbox.mkdir()
    server: EmbeddedServer | None = None
    demo: _Demo | None = None
    try:
        if nats is None:
            server = EmbeddedServer(store_dir=work / "nats", port=0)
            await server.start()
            url = server.url
        else:
            url = nats
        settings = Settings(
            prefix=prefix or ("sojourn" if nats is None else f"demo{uuid.uuid4().hex[:8]}"),
            lease_ttl=LEASE_TTL,
        )
        demo = _Demo(url=url, settings=settings, root=root, work=work, outbox=outbox)
        try:
            async with asyncio.timeout(DEADLINE + 10):
                return await _run(demo)
        except TimeoutError:
            logs = " ".join(f"[worker {w.label}: {_tail(w.log_text(), 3)}]" for w in demo.workers)
            raise DemoError(f"the demo did not finish in time {logs}") from None
    finally:
        await _cleanup(demo, server, work, keep)


async def _cleanup(
    demo: _Demo | None, server: EmbeddedServer | None, work: Path, keep: bool
) -> None:
    try:
        if demo is not None:
            await demo.stop_workers()
    finally:
        try:
            if server is not None:
                await server.stop()
        finally:
            if keep:
                out(f"kept {work} (outbox/, worker-*.log, nats/)")
            else:
                shutil.rmtree(work, ignore_errors=True)
