"""Plumbing the commands share: exit codes, settings and connection options from the command
line, connecting with a bound, reading JSON arguments, stopping on SIGINT/SIGTERM, logging and
the metrics endpoint (``serving``, around a serving command), and a command sent to one run
(``to_run``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import logging
import re
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from sojourn.broker.connection import Broker, ConnectOptions, JetStreamError
from sojourn.broker.server import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import BrokerUnavailable, RunNotFound, SojournError
from sojourn.schemas.names import validate_token

from .. import telemetry
from ..client.client import Client, PendingRun
from ..client.reports import lookup
from ..core.state import RunState
from ..ops.exposition import serve_metrics, stop_metrics
from ..ops.health import PROCESS_HEALTH, Phase
from ..telemetry.logs import setup_logging
from ._render import out

__all__ = [
    "CONNECT_TIMEOUT",
    "DEFAULT_PREFIX",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "Handler",
    "StopSignal",
    "UsageError",
    "bounded",
    "cli_sender",
    "configure_logging",
    "connect_client",
    "has_deployment",
    "lookup_current",
    "options_from",
    "parse_input",
    "probe",
    "probed_options",
    "require_deployment",
    "serve_settings",
    "serving",
    "settings_from",
    "start_metrics",
    "to_run",
]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
DEFAULT_PREFIX = "sojourn"
CONNECT_TIMEOUT = 5.0

T = TypeVar("T")
Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


class UsageError(Exception):
    """A bad argument value found after parsing (exit code 2)."""


def settings_from(args: argparse.Namespace, **extra: Any) -> Settings:
    """The deployment's ``Settings`` from ``--prefix``, ``--replicas`` and ``extra``."""
    prefix = args.prefix or DEFAULT_PREFIX
    validate_token(prefix, "prefix")
    replicas = getattr(args, "replicas", None)
    if replicas is not None:
        extra.setdefault("replicas", replicas)
    return Settings(prefix=prefix, **extra)


def serve_settings(args: argparse.Namespace, **extra: Any) -> Settings:
    """``settings_from`` for the serving commands, which check the settings before connecting:
    a value the settings refuse is a usage error (exit code 2)."""
    try:
        return settings_from(args, **extra)
    except ValueError as e:
        raise UsageError(str(e)) from None


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


def options_from(args: argparse.Namespace) -> ConnectOptions:
    """The connection options of the command line (flags; the environment fills the rest when
    connecting)."""
    return ConnectOptions(
        url=args.nats,
        creds=args.creds,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
    )


async def connect_client(args: argparse.Namespace) -> Client:
    opts = options_from(args)
    return await bounded(Client.connect(opts, settings=settings_from(args)), opts)


async def probe(opts: ConnectOptions) -> None:
    """Fail fast when nothing answers: a worker's own connect would retry forever."""
    broker = await bounded(Broker.connect(opts, name="sojourn-cli probe", reconnect=False), opts)
    await broker.close()


async def probed_options(args: argparse.Namespace) -> ConnectOptions:
    """The connection options of the command line, once a server answers there (``probe``)."""
    opts = options_from(args)
    await probe(opts)
    return opts


async def has_deployment(client: Client) -> bool:
    """Whether anything ever ran under the client's prefix (its events stream exists)."""
    try:
        await client.broker.api(f"$JS.API.STREAM.INFO.{client.names.events_stream}")
    except JetStreamError as e:
        if e.code != 404:
            raise
        return False
    return True


async def require_deployment(client: Client, run_id: str) -> None:
    """A missing events stream means nothing ever ran under this prefix: say so plainly."""
    if not await has_deployment(client):
        raise RunNotFound(
            f"no run with id '{run_id}': nothing has run with prefix "
            f"'{client.settings.prefix}' on {client.broker.url} (check --prefix/--nats)",
            run_id=run_id,
        )


def cli_sender(client: Client) -> str | None:
    """Who the CLI acts as: the connection's user where it authenticates (``None``: the
    client fills it in), else ``cli-<login name>`` as a sender token."""
    if client.identity is not None:
        return None
    try:
        login = getpass.getuser()
    except Exception:
        login = ""
    return ("cli-" + re.sub(r"[^A-Za-z0-9_-]", "_", login))[:128] if login else "cli"


def parse_input(text: str, flag: str = "--input") -> Any:
    """A JSON argument, or ``@FILE`` to read it from a file; ``UsageError`` if it is not JSON."""
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


class StopSignal:
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


@contextlib.asynccontextmanager
async def serving(args: argparse.Namespace) -> AsyncIterator[tuple[StopSignal, Phase]]:
    """What a serving command holds while it runs: SIGINT/SIGTERM caught (``StopSignal``), its
    phase in the process's health and the metrics endpoint (``--metrics-port``), all given up
    on the way out."""
    stopper = StopSignal()
    phase = Phase()
    PROCESS_HEALTH.add("process", phase)
    metrics_server = None
    try:
        metrics_server = start_metrics(args)
        yield stopper, phase
    finally:
        stopper.remove()
        PROCESS_HEALTH.remove("process")
        if metrics_server is not None:
            stop_metrics(metrics_server)


def configure_logging(level: str, log_format: str = "text", service: str | None = None) -> None:
    """Logging on stderr (``--log-level``, ``--log-format``); for a serving command
    (``service``: its default ``service.name``), OpenTelemetry traces too, when the ``otel``
    extra is installed and the ``OTEL_*`` environment asks for an exporter
    (docs/operations.md, "Tracing")."""
    setup_logging(level, log_format)
    if service is not None and telemetry.configure(service):
        logging.getLogger("sojourn").info("tracing: spans exported (OTEL_* environment)")


def start_metrics(args: argparse.Namespace) -> Any:
    """Serve Prometheus metrics when ``--metrics-port`` is given; the server, or ``None``."""
    if args.metrics_port is None:
        return None
    server = serve_metrics(args.metrics_port, args.metrics_host)
    host, port = server.server_address[:2]
    out(f"metrics: http://{host}:{port}/metrics")
    return server


async def lookup_current(client: Client, run_id: str) -> tuple[str, RunState | PendingRun]:
    """Like ``lookup``, for commands sent to a run: a run that continued as new is followed to
    its chain's current run (where the intake would forward the message too), said on stdout."""
    state = await lookup(client, run_id)
    if isinstance(state, RunState) and state.continued_as:
        current = await client.current_run(run_id)
        if current != run_id:
            out(f"run {run_id} continued as new: its chain's current run is {current}")
            return current, await lookup(client, current)
    return run_id, state


@contextlib.asynccontextmanager
async def to_run(
    args: argparse.Namespace,
) -> AsyncIterator[tuple[Client, RunState | PendingRun]]:
    """For a command sent to the run ``args.run_id``: a connected client and the run as it
    stands. A run that continued as new is followed to its chain's current run, which
    ``args.run_id`` becomes (``lookup_current``)."""
    validate_token(args.run_id, "run_id")
    async with await connect_client(args) as client:
        await require_deployment(client, args.run_id)
        args.run_id, state = await lookup_current(client, args.run_id)
        yield client, state
