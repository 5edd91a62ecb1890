"""The ``sojourn`` command line.

Serve agents (``dev``, ``worker``), start and inspect runs (``start``, ``status``, ``history``,
``cancel``), export the wire schemas (``schemas``) and watch a worker die mid-step without
anything happening twice (``demo``). Run ``sojourn COMMAND --help`` for each command's options.

User errors print one line on stderr (``error: ...``) and exit non-zero, never a traceback:
1 for errors, 2 for bad arguments, 130 when interrupted.

Example:
    $ sojourn dev --app examples.greeter
    $ sojourn start greeter --input '{"name": "Ada", "email": "ada@example.com"}' --wait
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import logging
import os
import re
import secrets
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import nats.errors

from sojourn.broker.auth import AuthUser
from sojourn.broker.connection import (
    ENV_CREDS,
    ENV_TLS_CA,
    ENV_TLS_CERT,
    ENV_TLS_KEY,
    Broker,
    ConnectOptions,
    JetStreamError,
)
from sojourn.broker.names import validate_token
from sojourn.broker.server import EmbeddedServer, write_private
from sojourn.schemas.auth import ROLES
from sojourn.schemas.codec import encode
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import BrokerUnavailable, RunNotFound, SojournError, UnknownAgent
from sojourn.schemas.events import (
    CancelRequested,
    RunCancelled,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunResumed,
    RunStarted,
    RunSuspended,
    StepCompleted,
    StepFailed,
    StepStarted,
    ValueRecorded,
)
from sojourn.schemas.export import export_schemas
from sojourn.schemas.health import Liveness

from .app import load_app
from .client import Client, TriggerRejected
from .metrics import serve_metrics, stop_metrics
from .state import RunState
from .watchdog import Watchdog
from .worker import Worker

__all__ = ["build_parser", "describe_event", "main"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
DEFAULT_PREFIX = "sojourn"
CONNECT_TIMEOUT = 5.0
INTAKE_WAIT = 2.0
"""Seconds ``start`` waits for the intake's answer when ``--wait`` is not given."""

T = TypeVar("T")
Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


class UsageError(Exception):
    """A bad argument value found after parsing (exit code 2)."""


# --- small formatting helpers ------------------------------------------------------------------


def out(*parts: object) -> None:
    print(*parts, flush=True)


def clock(at: float) -> str:
    """``HH:MM:SS.mmm`` (UTC) of a unix time."""
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S.%f")[:-3]


def _stamp(at: float | None) -> str:
    if not at:
        return "-"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _iso(at: float | None) -> str | None:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds") if at else None


def _short(raw: Any, limit: int = 60) -> str:
    text = bytes(raw).decode(errors="replace") if raw is not None else "null"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(text: str) -> str:
    return " | ".join(line.strip() for line in str(text).splitlines() if line.strip())


def describe_event(e: RunEvent) -> tuple[str, str]:
    """An event's type name and its key fields, for timelines."""
    match e:
        case RunStarted():
            version = f" version={e.code_version}" if e.code_version else ""
            detail = f"agent={e.agent}{version} input={_short(e.input)}"
        case StepStarted():
            detail = f"{e.name} pos={e.position} attempt={e.attempt}"
        case StepCompleted():
            detail = (
                f"{e.name} pos={e.position} attempt={e.attempt} took={e.duration:.3f}s"
                f" -> {_short(e.result, 40)}"
            )
        case StepFailed():
            detail = (
                f"{e.name} pos={e.position} attempt={e.attempt} took={e.duration:.3f}s"
                f" error={e.error.type}: {one_line(e.error.message)}"
            )
        case ValueRecorded():
            detail = f"ctx.{e.kind}() pos={e.position} = {_short(e.value, 40)}"
        case RunCompleted():
            detail = f"output={_short(e.output)}"
        case RunFailed():
            detail = f"error={e.error.type}: {one_line(e.error.message)}"
        case CancelRequested():
            detail = f"reason={e.reason!r}" + (f" by={e.by}" if e.by else "")
        case RunCancelled():
            detail = f"reason={e.reason!r}"
        case RunSuspended():
            detail = f"reason={e.reason}: {one_line(e.detail)}"
        case RunResumed():
            detail = (f"by={e.by} " if e.by else "") + (f"note={e.note!r}" if e.note else "")
        case _:  # waits, signals, children and any later event type: its fields
            detail = _fields(e)
    return type(e).__name__, detail.strip()


def _fields(e: RunEvent) -> str:
    """``key=value`` of an event's non-empty fields (JSON payloads shortened)."""
    parts = []
    for name in e.__struct_fields__:
        value = getattr(e, name)
        if name == "at" or value is None or value == ():
            continue
        if isinstance(value, msgspec.Raw):
            text = _short(value, 40)
        elif isinstance(value, float) and name in ("deadline",):
            text = clock(value)
        elif isinstance(value, tuple):
            text = ",".join(map(str, value))
        else:
            text = str(value)
        parts.append(f"{'pos' if name == 'position' else name}={text}")
    return " ".join(parts)


def _public_status(state: RunState) -> str:
    return "pending" if state.status == "new" else state.status


# --- plumbing shared by commands ---------------------------------------------------------------


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    prefix = args.prefix or DEFAULT_PREFIX
    validate_token(prefix, "prefix")
    return Settings(prefix=prefix, **extra)


async def bounded(connect: Awaitable[T], target: str | ConnectOptions | None) -> T:
    """``connect``, or ``BrokerUnavailable`` after ``CONNECT_TIMEOUT``: a backstop for an
    address that accepts TCP but never completes the NATS handshake."""
    opts = target if isinstance(target, ConnectOptions) else ConnectOptions(url=target)
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT):
            return await connect
    except TimeoutError:
        raise BrokerUnavailable(
            f"no NATS server answered at {opts.display_url} within {CONNECT_TIMEOUT:g}s; "
            "start one with `sojourn dev`, or point --nats / SOJOURN_NATS_URL at yours"
        ) from None


def _options(args: argparse.Namespace) -> ConnectOptions:
    """The connection options of the command line (flags; the environment fills the rest when
    connecting)."""
    return ConnectOptions(
        url=args.nats,
        creds=args.creds,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
    )


async def _connect(args: argparse.Namespace) -> Client:
    settings = _settings(args)
    opts = _options(args)
    return await bounded(Client.connect(opts, settings=settings), opts)


async def _probe(opts: ConnectOptions) -> None:
    """Fail fast when nothing answers: a worker's own connect would retry forever."""
    broker = await bounded(Broker.connect(opts, name="sojourn-cli probe", reconnect=False), opts)
    await broker.close()


async def _require_deployment(client: Client, run_id: str) -> None:
    """A missing events stream means nothing ever ran under this prefix: say so plainly."""
    try:
        await client.broker.api(f"$JS.API.STREAM.INFO.{client.names.events_stream}")
    except JetStreamError as e:
        if e.code != 404:
            raise
        raise RunNotFound(
            f"no run with id '{run_id}': nothing has run with prefix "
            f"'{client.settings.prefix}' on {client.broker.url} (check --prefix/--nats)",
            run_id=run_id,
        ) from None


def _cli_sender(client: Client) -> str | None:
    """Who the CLI acts as: the connection's user where it authenticates (``None``: the
    client fills it in), else ``cli-<login name>`` as a sender token."""
    if client.identity is not None:
        return None
    try:
        login = getpass.getuser()
    except Exception:
        login = ""
    return ("cli-" + re.sub(r"[^A-Za-z0-9_-]", "_", login))[:128] if login else "cli"


def _parse_input(text: str, flag: str = "--input") -> Any:
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as e:
            raise UsageError(f"{flag} {text}: cannot read: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise UsageError(
                f"{flag} {text}: not UTF-8 text (byte {e.start}: {e.reason}); JSON must be UTF-8"
            ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(
            f'{flag} is not valid JSON: {e} (quote it: {flag} \'{{"name": "Ada"}}\')'
        ) from None


class _StopSignal:
    """SIGINT/SIGTERM set an event instead of raising, so we can shut down in order."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.name = ""
        self._loop = asyncio.get_running_loop()
        for sig in self.SIGNALS:
            self._loop.add_signal_handler(sig, self._fire, sig)

    def _fire(self, sig: int) -> None:
        if self.event.is_set():
            print(
                "still stopping; waiting for running steps to finish", file=sys.stderr, flush=True
            )
            return
        self.name = signal.Signals(sig).name
        self.event.set()

    async def wait(self, server: EmbeddedServer | None = None) -> None:
        while not self.event.is_set():
            if server is not None and not server.running:
                raise SojournError(f"nats-server exited unexpectedly; see {server.log_file}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.event.wait(), 0.5)

    def remove(self) -> None:
        for sig in self.SIGNALS:
            with contextlib.suppress(Exception):
                self._loop.remove_signal_handler(sig)


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


# --- commands ----------------------------------------------------------------------------------


def _start_metrics(args: argparse.Namespace) -> Any:
    if args.metrics_port is None:
        return None
    server = serve_metrics(args.metrics_port, args.metrics_host)
    host, port = server.server_address[:2]
    out(f"metrics: http://{host}:{port}/metrics")
    return server


DEV_AUTH_DIR = "auth"
DEV_PASSWORDS = "passwords.json"


def _dev_users(data_dir: str) -> tuple[Path, list[AuthUser]]:
    """One user per role, named after it, with a random password made once per data dir and
    kept in ``<data_dir>/auth/passwords.json`` (mode 0600), so a restart keeps them."""
    auth_dir = Path(data_dir).absolute() / DEV_AUTH_DIR
    auth_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    auth_dir.chmod(0o700)
    path = auth_dir / DEV_PASSWORDS
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        saved = {}
    except (OSError, ValueError) as e:
        raise SojournError(f"cannot read {path}: {e}; remove it to make new passwords") from None
    if not isinstance(saved, dict):
        saved = {}
    passwords = {r: saved[r] for r in ROLES if isinstance(saved.get(r), str) and saved[r]}
    if len(passwords) < len(ROLES):
        for role in ROLES:
            passwords.setdefault(role, secrets.token_urlsafe(24))
        write_private(path, json.dumps(passwords, indent=2) + "\n")
    return auth_dir, [AuthUser(role, passwords[role], role) for role in ROLES]


def _write_dev_urls(server: EmbeddedServer, auth_dir: Path) -> None:
    """``<auth_dir>/<role>.url``: the URL with that user's password, as ``--nats`` takes it,
    readable by its owner only."""
    for user in server.auth:
        write_private(auth_dir / f"{user.name}.url", server.url_for(user.name))


async def _serve(args: argparse.Namespace, *, dev: bool) -> int:
    _configure_logging(args.log_level)
    app = load_app(args.app)
    settings = _settings(args, lease_ttl=args.lease_ttl)
    auth = dev and args.auth
    if auth and args.nats is not None:
        raise UsageError("--auth configures the local server: it cannot be used with --nats")
    stopper = _StopSignal()
    server: EmbeddedServer | None = None
    metrics_server = None
    try:
        metrics_server = _start_metrics(args)
        if dev and args.nats is None:
            auth_dir, users = _dev_users(args.data_dir) if auth else (Path(), [])
            server = EmbeddedServer(
                store_dir=args.data_dir,
                port=args.port,
                auth=users or None,
                auth_prefix=settings.prefix,
            )
            await server.start()
            version = ".".join(map(str, server.version or ()))
            out(f"nats: {server.url}")
            out(f"nats-server {version}, data in {server.store_dir} (log: {server.log_file})")
            if auth:
                _write_dev_urls(server, auth_dir)
                out(
                    f"auth: users {', '.join(ROLES)}; each one's URL, password included, is in "
                    f"{auth_dir}/<user>.url (mode 0600)"
                )
                out(f'  e.g. sojourn status RUN --nats "$(cat {auth_dir}/client.url)"')
                opts = ConnectOptions(url=server.url_for("worker"))
                watch_opts = ConnectOptions(url=server.url_for("watchdog"))
            else:
                opts = watch_opts = ConnectOptions(url=server.url)
        else:
            opts = watch_opts = _options(args)
            await _probe(opts)
            if dev:
                out(f"nats: {opts.display_url}")
        worker = Worker(
            app.agents,
            nats=opts,
            settings=settings,
            concurrency=args.concurrency,
            worker_id=args.worker_id,
        )
        await worker.start()
        watchdog = None
        try:
            if dev and not args.no_watchdog:
                watchdog = await Watchdog(nats=watch_opts, settings=settings).start()
            out(
                f"serving: {', '.join(app.agent_names)} (app {app.name}, prefix "
                f"{settings.prefix}, worker {worker.worker_id}"
                + (", with a watchdog)" if watchdog else ")")
            )
            out("ready; press Ctrl-C to stop")
            await stopper.wait(server)
            out(f"{stopper.name} received: stopping the worker")
        finally:
            if watchdog is not None:
                await watchdog.stop()
            await worker.stop()
    finally:
        try:
            if server is not None:
                await server.stop()
        finally:
            stopper.remove()
            if metrics_server is not None:
                stop_metrics(metrics_server)
    out("stopped")
    return EXIT_OK


async def cmd_dev(args: argparse.Namespace) -> int:
    return await _serve(args, dev=True)


async def cmd_worker(args: argparse.Namespace) -> int:
    return await _serve(args, dev=False)


def _liveness_line(liv: Liveness) -> str:
    parts = [f"{liv.run_id:<24} {liv.agent or '?':<16} {liv.state:<9}"]
    if liv.owner:
        beat = (
            f", last heartbeat {time.time() - liv.last_heartbeat:.1f}s ago"
            if (liv.last_heartbeat)
            else ""
        )
        parts.append(f"owner {liv.owner}{beat}")
    if liv.step:
        parts.append(f"step {liv.step}")
    if liv.on:
        parts.append("on " + ", ".join(liv.on))
    if liv.reason:
        parts.append(one_line(liv.reason))
    return "  ".join(parts)


async def cmd_watchdog(args: argparse.Namespace) -> int:
    _configure_logging(args.log_level)
    extra: dict[str, Any] = {"lease_ttl": args.lease_ttl}
    if args.stall_after is not None:
        extra["stall_after"] = args.stall_after
    if args.overdue_after is not None:
        extra["overdue_after"] = args.overdue_after
    try:
        settings = _settings(args, **extra)
    except ValueError as e:
        raise UsageError(str(e)) from None
    opts = _options(args)
    await _probe(opts)
    if args.once:
        judged = await Watchdog(nats=opts, settings=settings).survey()
        order = {"wedged": 0, "stalled": 1, "orphaned": 2, "overdue": 3}
        rows = sorted(judged.values(), key=lambda v: (order.get(v.state, 9), v.run_id))
        if args.json:
            out(encode(rows).decode())
            return EXIT_OK
        flagged = sum(1 for v in rows if v.flagged)
        out(f"{len(rows)} live run{'s' if len(rows) != 1 else ''}, {flagged} flagged")
        for liv in rows if args.all else [v for v in rows if v.flagged]:
            out(_liveness_line(liv))
        return EXIT_OK

    def report(liv: Liveness, before: Liveness | None) -> None:
        if liv.flagged or (before is not None and before.flagged):
            out(_liveness_line(liv))

    stopper = _StopSignal()
    metrics_server = None
    try:
        metrics_server = _start_metrics(args)
        watchdog = await Watchdog(
            nats=opts, settings=settings, interval=args.interval, on_change=report
        ).start()
        out(
            f"watching prefix {settings.prefix} on {opts.display_url} (stalled after "
            f"{settings.stall_threshold:g}s of silence, overdue {settings.overdue_after:g}s "
            "past due); press Ctrl-C to stop"
        )
        try:
            await stopper.wait()
        finally:
            await watchdog.stop()
    finally:
        stopper.remove()
        if metrics_server is not None:
            stop_metrics(metrics_server)
    out("stopped")
    return EXIT_OK


async def cmd_start(args: argparse.Namespace) -> int:
    payload = _parse_input(args.input)
    validate_token(args.agent, "agent name")
    if args.run_id is not None:
        validate_token(args.run_id, "run_id")
    timeout: float | None = args.timeout
    intake_timeout = (timeout or 86_400.0) if args.wait else (timeout or INTAKE_WAIT)
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    run_id = args.run_id or uuid.uuid4().hex
    async with await _connect(args) as client:
        trigger = asyncio.ensure_future(
            client.trigger(args.agent, payload, run_id=run_id, wait=True, timeout=intake_timeout)
        )
        out(f"run_id: {run_id}")
        if args.wait:
            done, _ = await asyncio.wait({trigger}, timeout=INTAKE_WAIT)
            if not done:
                out(
                    f"queued: no worker answered yet; waiting for a worker serving "
                    f"{args.agent} (the trigger is stored: Ctrl-C stops only the waiting)"
                )
        try:
            receipt = await trigger
        except UnknownAgent as e:
            raise TriggerRejected("unknown_agent", e.message, run_id=run_id) from None
        if receipt.queued:
            out(
                f"queued: no worker answered yet; the trigger is stored and will run when a "
                f"worker serving {args.agent} starts"
            )
        elif receipt.created:
            out("accepted: new run")
        else:
            out("accepted: a run with this id already exists (it was not started again)")
        if not args.wait:
            return EXIT_OK
        remaining = None if deadline is None else max(deadline - loop.time(), 0.0)
        try:
            result = await client.result(receipt.run_id, timeout=remaining)
        except TimeoutError:
            raise SojournError(
                f"run {receipt.run_id} did not finish within {timeout:g}s; it keeps going "
                f"(see `sojourn status {receipt.run_id}`)",
                run_id=receipt.run_id,
            ) from None
        out(f"output: {encode(result).decode()}")
    return EXIT_OK


def _status_json(state: RunState, run_id: str) -> dict[str, Any]:
    error = state.error
    return {
        "run_id": state.run_id or run_id,
        "agent": state.agent,
        "status": _public_status(state),
        "steps_completed": state.steps_completed,
        "step_attempts": state.step_attempts,
        "events": state.events,
        "output": state.output,
        "error": None
        if error is None
        else {"type": error.type, "message": error.message, "traceback": error.traceback},
        "started_at": _iso(state.started_at),
        "ended_at": _iso(state.ended_at),
        "updated_at": _iso(state.updated_at),
        "code_version": state.code_version,
        "cancel_requested": state.cancel_requested,
        "waiting_on": list(state.waiting_on),
        "deadline": _iso(state.deadline),
        "buffered_signals": [r.name for r in state.signals],
        "children": list(state.children),
        "parent_run_id": state.parent_run_id,
        "suspended_reason": state.suspended_reason,
        "suspended_detail": state.suspended_detail,
        "anomalies": list(state.anomalies),
    }


async def cmd_status(args: argparse.Namespace) -> int:
    validate_token(args.run_id, "run_id")
    async with await _connect(args) as client:
        await _require_deployment(client, args.run_id)
        state = await client.state(args.run_id)
        liv = await client.liveness(args.run_id)
    if args.json:
        body = _status_json(state, args.run_id)
        body["liveness"] = msgspec.to_builtins(liv)
        out(encode(body).decode())
        return EXIT_OK
    live = liv.state + (f": {one_line(liv.reason)}" if liv.reason else "")
    if liv.owner:
        live += f" (owner {liv.owner}"
        if liv.last_heartbeat:
            live += f", last heartbeat {time.time() - liv.last_heartbeat:.1f}s ago"
        live += ")"
    rows: list[tuple[str, str]] = [
        ("run", state.run_id or args.run_id),
        ("agent", state.agent + (f" (version {state.code_version})" if state.code_version else "")),
        ("status", _public_status(state)),
        ("liveness", live),
        ("steps", f"{state.steps_completed} completed, {state.step_attempts} attempts"),
    ]
    last = state.ops[-1] if state.ops else None
    if state.status == "running" and last is not None and last.status == "started":
        rows.append(("executing", f"{last.name} pos={last.position} attempt={last.attempts}"))
    if liv.details is not None:
        rows.append(("progress", _short(liv.details, 200)))
    if state.status == "waiting":
        rows.append(("waiting on", ", ".join(state.waiting_on) or "-"))
        if state.deadline is not None:
            left = state.deadline - time.time()
            rows.append(("deadline", f"{_stamp(state.deadline)} (in {max(left, 0.0):.1f}s)"))
    if state.signals:
        rows.append(("signals", "buffered: " + ", ".join(r.name for r in state.signals)))
    if state.children:
        rows.append(("children", ", ".join(state.children)))
    if state.parent_run_id:
        rows.append(("parent", state.parent_run_id))
    rows.append(("started", _stamp(state.started_at)))
    ended = _stamp(state.ended_at)
    if state.ended_at and state.started_at:
        ended += f" (after {state.ended_at - state.started_at:.3f}s)"
    rows.append(("ended", ended))
    if state.cancel_requested is not None and state.status != "cancelled":
        rows.append(("cancel", f"requested: {state.cancel_requested}"))
    if state.suspended_reason:
        rows.append(
            ("suspended", f"{state.suspended_reason}: {one_line(state.suspended_detail or '')}")
        )
    rows.append(
        ("error", f"{state.error.type}: {one_line(state.error.message)}" if state.error else "-")
    )
    rows.append(("output", bytes(state.output).decode() if state.output is not None else "-"))
    for key, value in rows:
        out(f"{key:<10} {value}")
    return EXIT_OK


async def cmd_history(args: argparse.Namespace) -> int:
    validate_token(args.run_id, "run_id")
    async with await _connect(args) as client:
        await _require_deployment(client, args.run_id)
        history = await client.history(args.run_id)
    if not history:
        raise RunNotFound(f"no run with id '{args.run_id}'", run_id=args.run_id)
    if args.json:
        out(
            encode(
                [{"seq": d.seq, "writer": d.writer, "events": list(d.events)} for d in history]
            ).decode()
        )
        return EXIT_OK
    width = max(len("writer"), *(len(d.writer) for d in history))
    out(f"{'seq':>5}  {'time (UTC)':<12}  {'writer':<{width}}  event")
    for d in history:
        for e in d.events:
            name, detail = describe_event(e)
            out(f"{d.seq:>5}  {clock(e.at):<12}  {d.writer:<{width}}  {name:<15} {detail}")
    return EXIT_OK


async def cmd_cancel(args: argparse.Namespace) -> int:
    validate_token(args.run_id, "run_id")
    async with await _connect(args) as client:
        await _require_deployment(client, args.run_id)
        state = await client.state(args.run_id)
        if state.terminal:
            out(f"run {args.run_id} already ended ({state.status}): nothing to cancel")
            return EXIT_OK
        by = _cli_sender(client)
        await client.cancel(args.run_id, args.reason, by=by)
    out(
        f"cancel requested for run {args.run_id}: it stops before its next step "
        f"(see `sojourn status {args.run_id}`)"
    )
    return EXIT_OK


async def cmd_signal(args: argparse.Namespace) -> int:
    validate_token(args.run_id, "run_id")
    payload = _parse_input(args.payload, "--payload")
    async with await _connect(args) as client:
        await _require_deployment(client, args.run_id)
        state = await client.state(args.run_id)  # a typo'd run id is an error here, not a DLQ
        if state.terminal:
            raise UsageError(f"run {args.run_id} has ended ({state.status}): signal not sent")
        sid = await client.signal(
            args.run_id, args.name, payload, signal_id=args.signal_id, sender=args.sender
        )
    out(
        f"signal {args.name} sent to run {args.run_id} (id {sid}); it is buffered until the "
        "run waits for it"
    )
    return EXIT_OK


async def cmd_resume(args: argparse.Namespace) -> int:
    validate_token(args.run_id, "run_id")
    async with await _connect(args) as client:
        await _require_deployment(client, args.run_id)
        state = await client.state(args.run_id)
        if state.status != "suspended":
            raise UsageError(f"run {args.run_id} is {_public_status(state)}, not suspended")
        by = _cli_sender(client)
        await client.resume(args.run_id, args.note, by=by)
    out(f"resume requested for run {args.run_id} (it was suspended: {state.suspended_reason})")
    return EXIT_OK


async def cmd_decide(args: argparse.Namespace) -> int:
    validate_token(args.run_id, "run_id")
    result = _parse_input(args.result, "--result")
    async with await _connect(args) as client:
        await _require_deployment(client, args.run_id)
        state = await client.state(args.run_id)
        if state.status != "suspended" or state.suspended_reason not in ("in_doubt", "crash_loop"):
            raise UsageError(f"run {args.run_id} is not suspended on an in-doubt step")
        by = _cli_sender(client)
        op = state.op(args.position)
        if op is None or op.kind != "step" or op.status != "started":
            raise UsageError(
                f"position {args.position} of run {args.run_id} is not an in-doubt step"
                + (f" (it holds a {op.kind} that is {op.status})" if op is not None else "")
                + "; `sojourn status` names the step that waits for a decision"
            )
        await client.decide(args.run_id, args.position, args.action, result, by=by)
    out(f"decided {args.action} for step {args.position} of run {args.run_id}; it resumes")
    return EXIT_OK


async def cmd_schemas(args: argparse.Namespace) -> int:
    for path in export_schemas(args.out):
        out(path)
    return EXIT_OK


async def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo  # demo imports this module; import it only when needed

    return await run_demo(nats=args.nats, prefix=args.prefix, keep=args.keep)


# --- the parser --------------------------------------------------------------------------------


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30)


def _version() -> str:
    try:
        return metadata.version("sojourn")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "unknown"


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _log_level(group: Any, default: str) -> None:
    group.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=default,
        help=f"log level on stderr (default: {default})",
    )


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r} (0-65535)")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``sojourn`` argument parser (exposed for tests and docs)."""
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("deployment")
    g.add_argument(
        "--nats",
        metavar="URL",
        default=None,
        help="NATS server URL (default: $SOJOURN_NATS_URL or nats://127.0.0.1:4222)",
    )
    g.add_argument(
        "--prefix",
        metavar="NAME",
        default=None,
        help=f"deployment prefix of subjects and streams (default: {DEFAULT_PREFIX})",
    )
    c = common.add_argument_group(
        "credentials and TLS",
        "A user and password go in the URL (nats://user:password@host:4222).",
    )
    c.add_argument(
        "--creds",
        metavar="FILE",
        default=None,
        help=f"NATS credentials file (JWT + seed) to authenticate with (default: ${ENV_CREDS})",
    )
    c.add_argument(
        "--tls-ca",
        metavar="FILE",
        default=None,
        help=f"CA certificate to verify the server's certificate with (default: ${ENV_TLS_CA})",
    )
    c.add_argument(
        "--tls-cert",
        metavar="FILE",
        default=None,
        help=f"client certificate, for servers that verify clients (default: ${ENV_TLS_CERT})",
    )
    c.add_argument(
        "--tls-key",
        metavar="FILE",
        default=None,
        help=f"the client certificate's private key (default: ${ENV_TLS_KEY})",
    )

    observe = argparse.ArgumentParser(add_help=False)
    o = observe.add_argument_group("monitoring")
    o.add_argument(
        "--metrics-port",
        metavar="PORT",
        type=_port,
        default=None,
        help="serve Prometheus metrics on this port at /metrics (default: off; 0 picks one)",
    )
    o.add_argument(
        "--metrics-host",
        metavar="ADDR",
        default="127.0.0.1",
        help="address to serve metrics on (default: 127.0.0.1; 0.0.0.0 for all interfaces)",
    )

    serve = argparse.ArgumentParser(add_help=False)
    s = serve.add_argument_group("worker")
    s.add_argument(
        "--app",
        metavar="MODULE",
        required=True,
        help="module whose module-level agents to serve, imported with the current "
        "directory on sys.path (e.g. examples.greeter)",
    )
    s.add_argument(
        "--concurrency",
        metavar="N",
        type=_positive_int,
        default=256,
        help="runs executed at once (default: 256)",
    )
    s.add_argument(
        "--lease-ttl",
        metavar="SECONDS",
        type=_positive_float,
        default=30.0,
        help="seconds before another worker may take over a run of a worker that "
        "died (default: 30)",
    )
    s.add_argument(
        "--worker-id",
        metavar="ID",
        default=None,
        help="name in logs and history (default: host-pid-random)",
    )
    _log_level(s, "info")

    parser = argparse.ArgumentParser(
        prog="sojourn",
        formatter_class=_Formatter,
        description="sojourn: durable, event-sourced AI agents on NATS JetStream.",
        epilog="examples:\n"
        "  sojourn demo                                  see a crash recovered\n"
        "  sojourn dev --app examples.greeter            server + worker, locally\n"
        '  sojourn start greeter --input \'{"name": "Ada", "email": "a@b.c"}\' --wait\n\n'
        "user errors print one line and exit 1 (2 for bad arguments).",
    )
    parser.add_argument("--version", action="version", version=f"sojourn {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(
        name: str,
        handler: Handler,
        summary: str,
        example: str,
        parents: Sequence[argparse.ArgumentParser] = (),
        detail: str = "",
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            parents=[*parents, common],
            help=summary,
            description=summary + (f"\n\n{detail}" if detail else ""),
            epilog=f"example:\n  {example}",
            formatter_class=_Formatter,
        )
        p.set_defaults(handler=handler)
        return p

    p = command(
        "dev",
        cmd_dev,
        "Run a local NATS server and a worker for an app, until Ctrl-C.",
        "sojourn dev --app examples.greeter --port 4222 --metrics-port 9300",
        parents=[serve, observe],
        detail="With --nats, no server is started: only the worker, on that server. A "
        "watchdog runs in the same process (--no-watchdog to leave it out).",
    )
    p.add_argument(
        "--no-watchdog", action="store_true", help="do not run a watchdog in this process"
    )
    p.add_argument(
        "--port",
        type=int,
        default=4222,
        help="client port of the local server; 0 picks a free one (default: 4222)",
    )
    p.add_argument(
        "--data-dir",
        metavar="DIR",
        default=".sojourn",
        help="where the local server keeps its data (default: .sojourn)",
    )
    p.add_argument(
        "--auth",
        action="store_true",
        help="the local server refuses anonymous connections: one user per role (client, "
        "worker, watchdog, admin) with a password made once per data dir; each one's URL is "
        "written to DATA_DIR/auth/<user>.url (mode 0600), for --nats",
    )

    command(
        "worker",
        cmd_worker,
        "Serve an app's agents on an existing NATS server.",
        "sojourn worker --app myapp.agents --nats nats://nats:4222 --concurrency 64",
        parents=[serve, observe],
        detail="Stops cleanly on SIGINT or SIGTERM: running steps get a "
        "few seconds to finish, the rest resume on another worker.",
    )

    p = command(
        "watchdog",
        cmd_watchdog,
        "Judge every live run's liveness; re-wake stalled, orphaned and overdue runs.",
        "sojourn watchdog --nats nats://nats:4222 --metrics-port 9300",
        parents=[observe],
        detail="Runs until Ctrl-C, printing a line whenever a run becomes (or stops being) "
        "stalled, orphaned, overdue or wedged. Several watchdogs may run at once: each "
        "problem is acted on by one of them. With --once, prints the flagged runs and exits.",
    )
    p.add_argument(
        "--once", action="store_true", help="read everything, print the flagged runs, exit"
    )
    p.add_argument("--all", action="store_true", help="with --once: list every live run")
    p.add_argument("--json", action="store_true", help="with --once: print a JSON array")
    p.add_argument(
        "--lease-ttl",
        metavar="SECONDS",
        type=_positive_float,
        default=30.0,
        help="the workers' --lease-ttl; heartbeats come every third of it, at most 5 s "
        "(default: 30)",
    )
    p.add_argument(
        "--stall-after",
        metavar="SECONDS",
        type=_positive_float,
        default=None,
        help="silence after which an owner counts as stalled (default: 3 heartbeats, at "
        "most 2/3 of the lease)",
    )
    p.add_argument(
        "--overdue-after",
        metavar="SECONDS",
        type=_positive_float,
        default=None,
        help="how long past due a timer or signal may be before its run is overdue (default: 60)",
    )
    p.add_argument(
        "--interval",
        metavar="SECONDS",
        type=_positive_float,
        default=None,
        help="seconds between two judgements (default: half a heartbeat)",
    )
    _log_level(p, "warning")

    p = command(
        "start",
        cmd_start,
        "Start a run of an agent and print its run id.",
        'sojourn start greeter --input \'{"name": "Ada", "email": "a@b.c"}\' --wait',
        detail="Prints the run id and the intake's answer. Without a worker serving the "
        "agent the trigger is stored and runs when one starts.",
    )
    p.add_argument("agent", metavar="AGENT", help="agent name")
    p.add_argument(
        "--input",
        metavar="JSON",
        default="null",
        help="the run's input as JSON, or @FILE to read it from a file (default: null)",
    )
    p.add_argument(
        "--run-id",
        metavar="ID",
        default=None,
        help="idempotency: starting the same run id twice is one run (default: a fresh id)",
    )
    p.add_argument(
        "--wait", action="store_true", help="wait for the run's result and print its output"
    )
    p.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_positive_float,
        default=None,
        help="give up waiting after this long (default: 2 for the intake's answer; "
        "no limit with --wait)",
    )

    p = command(
        "status",
        cmd_status,
        "Show a run's status, steps, times, error and output.",
        "sojourn status 5f0c9e2d --json",
    )
    p.add_argument("run_id", metavar="RUN", help="run id")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = command(
        "history",
        cmd_history,
        "Show a run's history, one line per event.",
        "sojourn history 5f0c9e2d",
    )
    p.add_argument("run_id", metavar="RUN", help="run id")
    p.add_argument(
        "--json", action="store_true", help="print a JSON array of {seq, writer, events}"
    )

    p = command(
        "cancel",
        cmd_cancel,
        "Ask a run to stop; it ends before its next step.",
        "sojourn cancel 5f0c9e2d --reason 'wrong customer'",
    )
    p.add_argument("run_id", metavar="RUN", help="run id")
    p.add_argument("--reason", metavar="TEXT", default="", help="recorded in the history")

    p = command(
        "signal",
        cmd_signal,
        "Send a signal to a run (buffered until the run waits for it).",
        'sojourn signal 5f0c9e2d docs.signed --payload \'{"by": "ada@example.com"}\'',
        detail="Durable: the run need not be waiting, nor any worker running. The same "
        "--signal-id sent twice counts once.",
    )
    p.add_argument("run_id", metavar="RUN", help="run id")
    p.add_argument("name", metavar="NAME", help="signal name, e.g. docs.signed")
    p.add_argument(
        "--payload",
        metavar="JSON",
        default="null",
        help="the signal's payload as JSON, or @FILE (default: null)",
    )
    p.add_argument(
        "--signal-id", metavar="ID", default=None, help="idempotency id (default: a fresh one)"
    )
    p.add_argument("--sender", metavar="WHO", default=None, help="recorded in the history")

    p = command(
        "resume",
        cmd_resume,
        "Lift a run's suspension (a poll cap or budget reached, a fixed non-determinism).",
        "sojourn resume 5f0c9e2d --note 'job is slow today'",
    )
    p.add_argument("run_id", metavar="RUN", help="run id")
    p.add_argument("--note", metavar="TEXT", default="", help="recorded in the history")

    p = command(
        "decide",
        cmd_decide,
        "Settle an in-doubt step of a suspended run, then resume it.",
        "sojourn decide 5f0c9e2d 3 skip --result '\"ch_123\"'",
        detail='For steps declared @step(in_doubt="ask"), and runs suspended as a crash loop '
        "(Settings.crash_loop_limit): retry runs the step again with the same idempotency "
        "key; skip records --result as its result without running it; fail fails the step.",
    )
    p.add_argument("run_id", metavar="RUN", help="run id")
    p.add_argument("position", metavar="POSITION", type=int, help="the step's position")
    p.add_argument("action", choices=("retry", "skip", "fail"), help="what to do")
    p.add_argument(
        "--result",
        metavar="JSON",
        default="null",
        help="the step's result for skip, as JSON (default: null)",
    )

    p = command(
        "schemas",
        cmd_schemas,
        "Write JSON Schemas of the wire messages into a directory.",
        "sojourn schemas --out ./schemas-json",
    )
    p.add_argument("--out", metavar="DIR", required=True, help="directory to write into")

    p = command(
        "demo",
        cmd_demo,
        "Kill a worker in the middle of a step and watch nothing happen twice.",
        "sojourn demo --keep",
        detail="Starts a NATS server in a temporary directory (or uses --nats, under a fresh "
        "prefix unless --prefix is given), two "
        "worker processes for examples/welcome.py and one run; SIGKILLs the first "
        "worker mid-step, lets the second finish, and checks every effect.",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    return parser


# --- entry point -------------------------------------------------------------------------------


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a Linux dependency
        return None
    return uvloop.new_event_loop


def _error(message: str) -> None:
    print(f"error: {one_line(message)}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (the console script exits with it)."""
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            return runner.run(handler(args))
    except UsageError as e:
        _error(str(e))
        return EXIT_USAGE
    except TriggerRejected as e:
        _error(f"{e.code}: {e.message.split(': ', 1)[-1]}")
        return EXIT_ERROR
    except SojournError as e:
        _error(e.message)
        return EXIT_ERROR
    except nats.errors.Error as e:
        _error(f"NATS: {type(e).__name__}: {e}")
        return EXIT_ERROR
    except ValueError as e:  # a value given on the command line that the library refused
        _error(str(e))
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (`sojourn ... | head -1`): like any Unix tool, stop quietly.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # keeps the interpreter's exit quiet
        return EXIT_OK
    except OSError as e:
        _error(str(e))
        return EXIT_ERROR
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
