"""The ``sojourn`` CLI, run as real subprocesses against the session's nats-server."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest

from sojourn.actors import Client, Worker
from sojourn.broker import EmbeddedServer
from sojourn.schemas.codec import encode
from sojourn.schemas.config import Settings
from sojourn.schemas.events import RunCompleted, RunEvent, RunStarted, StepCompleted, StepStarted
from tests.apps.cli_agents import cli_echo, cli_slow
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for

pytestmark = pytest.mark.usefixtures("processes")  # the sojourn CLI in processes of its own

APP = "tests.apps.cli_agents"
DEAD = "nats://127.0.0.1:1"
DEADLINE = 60.0


@dataclass
class Result:
    rc: int
    out: str
    err: str


async def sojourn(*args: str, limit: float = DEADLINE) -> Result:
    """Run ``python -m sojourn.actors.cli ARGS`` to completion."""
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "sojourn.actors.cli",
        *args,
        cwd=ROOT,
        env=subprocess_env(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), limit)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


@dataclass
class Served:
    """A long-running CLI subprocess (dev, worker) whose merged output is read line by line."""

    proc: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)

    async def expect(self, needle: str, limit: float = DEADLINE) -> str:
        """The first output line containing ``needle`` (waiting for it if needed)."""
        seen = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while True:
            for line in self.lines[seen:]:
                if needle in line:
                    return line
            seen = len(self.lines)
            assert self.proc.stdout is not None
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"no line with {needle!r} in {limit}s: {self.lines}")
            try:
                raw = await asyncio.wait_for(self.proc.stdout.readline(), remaining)
            except TimeoutError:
                raise AssertionError(f"no line with {needle!r} in {limit}s: {self.lines}") from None
            if not raw:
                raise AssertionError(
                    f"exited ({await self.proc.wait()}) before printing {needle!r}: {self.lines}"
                )
            self.lines.append(raw.decode().rstrip("\n"))

    async def stop(self, sig: signal.Signals, limit: float = DEADLINE) -> int:
        """Send ``sig``, read the rest of the output, return the exit code."""
        self.proc.send_signal(sig)
        assert self.proc.stdout is not None
        rest = await asyncio.wait_for(self.proc.stdout.read(), limit)
        self.lines.extend(rest.decode().splitlines())
        return await asyncio.wait_for(self.proc.wait(), limit)


@asynccontextmanager
async def served(*args: str) -> AsyncIterator[Served]:
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "sojourn.actors.cli",
        *args,
        cwd=ROOT,
        env=subprocess_env(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        yield Served(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


def deployment(server: EmbeddedServer, settings: Settings) -> list[str]:
    return ["--nats", server.url, "--prefix", settings.prefix]


def assert_one_line_error(res: Result, rc: int, *fragments: str) -> None:
    lines = res.err.strip().splitlines()
    assert res.rc == rc, res
    assert len(lines) == 1, res.err
    assert lines[0].startswith("error: "), res.err
    assert "Traceback" not in res.err + res.out
    for fragment in fragments:
        assert fragment in lines[0], res.err


def exists(path: Path) -> bool:
    return path.exists()


def port_closed(url: str) -> bool:
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) != 0


# --- no server needed --------------------------------------------------------------------------


COMMANDS = ["dev", "worker", "start", "status", "history", "cancel", "schemas", "demo"]


@pytest.mark.parametrize("command", ["", *COMMANDS])
async def test_help_of_every_command_exits_0(command: str) -> None:
    res = await sojourn(*([command] if command else []), "--help")
    assert res.rc == 0, res
    assert "example" in res.out
    assert res.err == ""
    if command:
        assert "--nats URL" in res.out and "--prefix" in res.out
    else:
        for name in COMMANDS:
            assert name in res.out


async def test_console_script_is_installed() -> None:
    script = Path(PYTHON).parent / "sojourn"
    proc = await asyncio.create_subprocess_exec(
        str(script), "--version", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(proc.communicate(), DEADLINE)
    assert proc.returncode == 0
    assert out.decode().startswith("sojourn ")


async def test_start_with_invalid_json_exits_2() -> None:
    res = await sojourn("start", "cli_echo", "--input", "{not json", "--nats", DEAD)
    assert_one_line_error(res, 2, "--input is not valid JSON")


async def test_invalid_names_are_one_line_errors() -> None:
    res, res2 = await asyncio.gather(
        sojourn("status", "a.b", "--nats", DEAD),
        sojourn("status", "r1", "--prefix", "bad.prefix", "--nats", DEAD),
    )
    assert_one_line_error(res, 1, "invalid run_id 'a.b'")
    assert_one_line_error(res2, 1, "invalid prefix 'bad.prefix'")


@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("tests.apps.cli_nosuch", "cannot import app module 'tests.apps.cli_nosuch'"),
        ("tests.apps.cli_empty", "defines no agent"),
        ("tests.apps.cli_broken", "RuntimeError: this app is broken on purpose"),
    ],
)
async def test_bad_app_is_a_one_line_error(module: str, message: str) -> None:
    res = await sojourn("worker", "--app", module, "--nats", DEAD)
    assert_one_line_error(res, 1, message)


async def test_every_command_against_a_dead_server_is_one_line() -> None:
    commands = [
        ["status", "r1"],
        ["history", "r1"],
        ["cancel", "r1"],
        ["start", "cli_echo", "--input", '{"text": "x"}'],
        ["worker", "--app", APP],
        ["dev", "--app", APP],
    ]
    results = await asyncio.gather(*(sojourn(*c, "--nats", DEAD) for c in commands))
    for res in results:
        assert_one_line_error(res, 1, f"no NATS server answered at {DEAD}")


# --- against the session server ----------------------------------------------------------------


async def test_status_and_history_of_an_unknown_run(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    dep = deployment(nats_server, settings)
    fresh = await sojourn("status", "nosuchrun", *dep)  # nothing ever ran with this prefix
    assert_one_line_error(fresh, 1, "no run with id 'nosuchrun'", settings.prefix)
    await client.start("cli_echo", {"text": "x"})  # creates the streams; nobody serves it
    res, hist, cancel = await asyncio.gather(
        sojourn("status", "nosuchrun", *dep),
        sojourn("history", "nosuchrun", *dep),
        sojourn("cancel", "nosuchrun", *dep),
    )
    for r in (res, hist, cancel):
        assert_one_line_error(r, 1, "no run with id 'nosuchrun'")


async def test_start_without_a_worker_is_queued_then_runs(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    dep = deployment(nats_server, settings)
    res = await sojourn("start", "cli_echo", "--input", '{"text": "later"}', "--run-id", "q1", *dep)
    assert res.rc == 0, res
    assert "run_id: q1" in res.out
    assert (
        "queued: no worker answered yet; the trigger is stored and will run when a worker "
        "serving cli_echo starts"
    ) in res.out
    async with served("worker", "--app", APP, "--lease-ttl", "2", *dep) as worker:
        await worker.expect("ready")
        assert await client.result("q1", timeout=DEADLINE) == {"echo": "later", "loud": "LATER"}
        assert await worker.stop(signal.SIGTERM) == 0


async def test_full_flow(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> None:
    dep = deployment(nats_server, settings)
    async with served(
        "worker", "--app", APP, "--lease-ttl", "2", "--concurrency", "8", *dep
    ) as worker:
        line = await worker.expect("serving: ")
        assert "cli_echo, cli_fail, cli_slow" in line
        await worker.expect("ready")

        res = await sojourn(
            "start",
            "cli_echo",
            "--input",
            '{"text": "hi"}',
            "--run-id",
            "e1",
            "--wait",
            "--timeout",
            "30",
            *dep,
        )
        assert res.rc == 0, res
        assert res.out.splitlines() == [
            "run_id: e1",
            "accepted: new run",
            'output: {"echo":"hi","loud":"HI"}',
        ]

        again = await sojourn(
            "start", "cli_echo", "--input", '{"text": "hi"}', "--run-id", "e1", *dep
        )
        assert again.rc == 0 and "already exists" in again.out, again

        status = await sojourn("status", "e1", "--json", *dep)
        assert status.rc == 0, status
        doc = json.loads(status.out)
        assert doc["run_id"] == "e1" and doc["agent"] == "cli_echo"
        assert doc["status"] == "completed" and doc["steps_completed"] == 1
        assert doc["output"] == {"echo": "hi", "loud": "HI"} and doc["error"] is None
        assert doc["started_at"] and doc["ended_at"]
        human = await sojourn("status", "e1", *dep)
        assert "completed" in human.out and '"loud":"HI"' in human.out

        hist = await sojourn("history", "e1", *dep)
        assert hist.rc == 0, hist
        events = [line.split()[3] for line in hist.out.splitlines()[1:]]
        assert events == ["RunStarted", "StepStarted", "StepCompleted", "RunCompleted"]
        assert "shout pos=0 attempt=1" in hist.out
        hjson = json.loads((await sojourn("history", "e1", "--json", *dep)).out)
        assert [e["type"] for d in hjson for e in d["events"]] == [
            "run.started.v1",
            "step.started.v1",
            "step.completed.v1",
            "run.completed.v1",
        ]
        assert all({"seq", "writer", "events"} <= d.keys() for d in hjson)

        rejected = await sojourn("start", "cli_echo", "--input", '{"txt": 1}', *dep)
        assert_one_line_error(rejected, 1, "error: invalid_input:")
        unknown = await sojourn("start", "nobody", *dep)
        assert_one_line_error(unknown, 1, "error: unknown_agent:")

        failed = await sojourn("start", "cli_fail", "--run-id", "f1", "--wait", *dep)
        assert_one_line_error(failed, 1, "run f1 failed", "boom")
        fstatus = json.loads((await sojourn("status", "f1", "--json", *dep)).out)
        assert fstatus["status"] == "failed" and "boom" in fstatus["error"]["message"]

        slow = await sojourn("start", "cli_slow", "--input", "600", "--run-id", "s1", *dep)
        assert slow.rc == 0 and "accepted: new run" in slow.out, slow

        async def steps_done() -> bool:
            return (await client.state("s1")).steps_completed >= 2

        await wait_for(steps_done, DEADLINE, what="s1 to make progress")
        cancel = await sojourn("cancel", "s1", "--reason", "test over", *dep)
        assert cancel.rc == 0 and "cancel requested" in cancel.out, cancel

        async def cancelled() -> bool:
            return (await client.status("s1")) == "cancelled"

        await wait_for(cancelled, DEADLINE, what="s1 cancelled")
        shist = await sojourn("history", "s1", *dep)
        assert "CancelRequested" in shist.out and "RunCancelled" in shist.out
        again_cancel = await sojourn("cancel", "s1", *dep)
        assert again_cancel.rc == 0 and "already ended" in again_cancel.out

        assert await worker.stop(signal.SIGTERM) == 0
        assert "stopped" in worker.lines[-1]
        assert not any("Traceback" in line for line in worker.lines)

    schemas = await sojourn("schemas", "--out", str(tmp_path / "out"), *dep)
    assert schemas.rc == 0, schemas
    written = sorted(Path(p) for p in schemas.out.split())
    assert written and all(exists(p) and p.suffix == ".json" for p in written)
    assert (tmp_path / "out" / "run-event.schema.json") in written


async def test_dev_starts_a_server_and_stops_cleanly_on_sigint(tmp_path: Path) -> None:
    async with served(
        "dev",
        "--app",
        APP,
        "--port",
        "0",
        "--data-dir",
        str(tmp_path / "data"),
        "--prefix",
        "devtest",
    ) as dev:
        line = await dev.expect("nats: ")
        url = line.split("nats: ", 1)[1].strip()
        assert url.startswith("nats://127.0.0.1:") and not url.endswith(":0")
        await dev.expect("ready")
        res = await sojourn(
            "start",
            "cli_echo",
            "--input",
            '{"text": "dev"}',
            "--wait",
            "--nats",
            url,
            "--prefix",
            "devtest",
        )
        assert res.rc == 0 and 'output: {"echo":"dev","loud":"DEV"}' in res.out, res
        assert await dev.stop(signal.SIGINT) == 0
        assert dev.lines[-1] == "stopped"
        assert not any("Traceback" in line for line in dev.lines)
    assert exists(tmp_path / "data" / "jetstream")
    assert port_closed(url)


async def test_dev_with_nats_starts_only_a_worker(
    nats_server: EmbeddedServer, settings: Settings, tmp_path: Path
) -> None:
    async with served(
        "dev",
        "--app",
        APP,
        "--data-dir",
        str(tmp_path / "data"),
        *deployment(nats_server, settings),
    ) as dev:
        assert (await dev.expect("nats: ")).endswith(nats_server.url)
        await dev.expect("ready")
        assert await dev.stop(signal.SIGINT) == 0
        assert not any("nats-server" in line for line in dev.lines)
    # No server store: the data dir holds only the projector's SQLite read model and the
    # gateway's bearer tokens and callback keys.
    kept = sorted(p.name for p in (tmp_path / "data").iterdir())
    gateway = {"gateway-tokens", "callback-keys"}
    assert gateway <= set(kept), kept
    assert all(name.startswith("runs.sqlite3") for name in set(kept) - gateway), kept


# --- sojourn replay ----------------------------------------------------------------------------

REPLAY = ("replay", "--app", APP)


def write_history(
    path: Path, *, run_id: str = "g1", agent: str = "cli_echo", step: str = "shout"
) -> Path:
    """A history as ``sojourn history RUN --json`` prints it: one cli_echo run, completed."""
    events: list[RunEvent] = [
        RunStarted(run_id=run_id, agent=agent, input=msgspec.Raw(b'{"text": "hi"}')),
        StepStarted(position=0, name=step, attempt=1),
        StepCompleted(position=0, name=step, attempt=1, result=msgspec.Raw(b'"HI"')),
        RunCompleted(output=msgspec.Raw(b'{"echo": "hi", "loud": "HI"}')),
    ]
    path.write_bytes(encode([{"seq": 1, "writer": "test", "events": events}]))
    return path


async def test_replay_help_exits_0() -> None:
    res = await sojourn("replay", "--help")
    assert res.rc == 0 and res.err == "", res
    for flag in ("--app MODULE", "--run ID", "--all-live", "--from-file FILE", "--agent", "--json"):
        assert flag in res.out, res.out
    assert "replay" in (await sojourn("--help")).out


async def test_replay_argument_errors_exit_2(tmp_path: Path) -> None:
    """Each is refused before anything is read or connected to (the server is dead)."""
    not_json = tmp_path / "not-json.json"
    not_json.write_text("{not json")
    wrong_shape = tmp_path / "shape.json"
    wrong_shape.write_text('{"seq": 1, "events": []}')
    missing = tmp_path / "missing.json"
    cases = [
        ((), "nothing to replay: give --run ID, --all-live or --from-file FILE"),
        (("--run", "r1", "--all-live"), "--run and --all-live exclude each other"),
        (("--from-file", str(missing)), f"--from-file {missing}: cannot read"),
        (("--from-file", str(not_json)), f"--from-file {not_json}: "),
        (("--from-file", str(wrong_shape)), f"--from-file {wrong_shape}: "),
    ]
    results = await asyncio.gather(*(sojourn(*REPLAY, *args, "--nats", DEAD) for args, _ in cases))
    for res, (_, fragment) in zip(results, cases, strict=True):
        assert_one_line_error(res, 2, fragment)


async def test_replay_from_files_needs_no_broker(tmp_path: Path) -> None:
    good = write_history(tmp_path / "good.json")
    moved = write_history(tmp_path / "moved.json", run_id="g2", step="whisper")
    stranger = write_history(tmp_path / "stranger.json", run_id="g3", agent="nobody")

    ok = await sojourn(*REPLAY, "--from-file", str(good), "--nats", DEAD)
    assert ok.rc == 0 and ok.err == "", ok
    assert ok.out.splitlines() == ["g1  cli_echo  ok"]

    res = await sojourn(*REPLAY, *(f"--from-file={p}" for p in (good, moved, stranger)))
    assert res.rc == 1 and res.err == "", res
    lines = res.out.splitlines()
    assert len(lines) == 3, res.out
    assert lines[0].split() == ["g1", "cli_echo", "ok"]
    assert lines[1].startswith("g2  cli_echo  diverges at position 0: recorded "), lines
    assert "whisper" in lines[1] and "shout" in lines[1], lines
    assert lines[2].split(maxsplit=2) == ["g3", "nobody", f"agent 'nobody' is not in {APP}"]

    doc = json.loads((await sojourn(*REPLAY, "--json", f"--from-file={moved}")).out)
    assert [(d["run_id"], d["agent"], d["ok"]) for d in doc] == [("g2", "cli_echo", False)]
    assert doc[0]["divergence"]["position"] == 0 and doc[0]["source"] == str(moved)

    only = await sojourn(*REPLAY, "--agent", "nobody", f"--from-file={good}")
    assert only.rc == 0 and "no histories of agent nobody to replay" in only.out, only


async def test_replay_runs_from_the_broker(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> None:
    dep = deployment(nats_server, settings)
    fresh = await sojourn(*REPLAY, "--all-live", *dep)
    assert_one_line_error(fresh, 1, f"nothing has run with prefix '{settings.prefix}'")
    async with Worker([cli_echo, cli_slow], nats=nats_server.url, settings=settings):
        await client.start("cli_echo", {"text": "hi"}, run_id="e1")
        await client.result("e1", timeout=DEADLINE)
        await client.trigger("cli_slow", 600, run_id="s1")

        async def steps_done() -> bool:
            return (await client.state("s1")).steps_completed >= 2

        await wait_for(steps_done, DEADLINE, what="s1 to make progress")
        named, live, none, unknown = await asyncio.gather(
            sojourn(*REPLAY, "--run", "e1", "--run", "s1", "--run", "e1", *dep),
            sojourn(*REPLAY, "--all-live", *dep),
            sojourn(*REPLAY, "--all-live", "--agent", "cli_echo", *dep),
            sojourn(*REPLAY, "--run", "nosuchrun", *dep),
        )
        await client.cancel("s1")
    assert named.rc == 0 and named.out.splitlines() == ["e1  cli_echo  ok", "s1  cli_slow  ok"]
    assert live.rc == 0 and live.out.splitlines() == ["s1  cli_slow  ok"], live
    assert none.rc == 0 and none.out.splitlines() == ["no live runs of agent cli_echo to replay"]
    assert_one_line_error(unknown, 1, "no run with id 'nosuchrun'")

    # A golden history saved with `sojourn history --json` replays from the file alike.
    saved = await sojourn("history", "e1", "--json", *dep)
    golden = tmp_path / "e1.json"
    golden.write_text(saved.out)
    res = await sojourn(*REPLAY, "--from-file", str(golden), "--nats", DEAD)
    assert res.rc == 0 and res.out.splitlines() == ["e1  cli_echo  ok"], res
