"""The serving commands: ``dev`` (a local server and a worker), ``worker``, ``watchdog`` and
``demo``. Each runs until Ctrl-C (or SIGTERM), except ``watchdog --once`` and ``demo``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sojourn.broker.auth import AuthUser
from sojourn.broker.connection import ConnectOptions
from sojourn.broker.server import EmbeddedServer, write_private
from sojourn.schemas.auth import ROLES
from sojourn.schemas.codec import encode
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import SojournError
from sojourn.schemas.health import BEAT_RUNS_MAX, Liveness, LivenessState

from ..agents.callbacks import CALLBACK_KEYS_ENV, CallbackKeys, generate_key_file_text
from ..client.client import Client
from ..console import console_routes
from ..gateway import GatewayConfig, GatewayServer, create_app
from ..ops.health import PROCESS_HEALTH, watchdog_check, worker_check
from ..ops.watchdog import Watchdog
from ..worker.app import load_app
from ..worker.worker import Worker
from ._args import (
    Command,
    _non_negative_float,
    _port,
    _positive_int,
    add_json,
    add_log_level,
    add_seconds,
    monitoring_options,
    parent_parser,
)
from ._common import EXIT_OK, UsageError, configure_logging, probed_options, serve_settings, serving
from ._gateway import add_gateway_arguments, callers, describe, gateway_config
from ._projector import running_projector
from ._read import age_seconds
from ._render import liveness_line, out

__all__ = ["COMMANDS", "cmd_demo", "cmd_dev", "cmd_watchdog", "cmd_worker"]

DEV_AUTH_DIR = "auth"
DEV_PASSWORDS = "passwords.json"


def _dev_users(data_dir: str, speaks_for: Iterable[str] = ()) -> tuple[Path, list[AuthUser]]:
    """One user per role, named after it, with a random password made once per data dir and
    kept in ``<data_dir>/auth/passwords.json`` (mode 0600), so a restart keeps them. The
    ``client`` user, which the dev gateway connects as, speaks for ``speaks_for`` (its
    callers' names)."""
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
    names = tuple(speaks_for)
    return auth_dir, [
        AuthUser(role, passwords[role], role, speaks_for=names if role == "client" else ())
        for role in ROLES
    ]


def _write_dev_urls(server: EmbeddedServer, auth_dir: Path) -> None:
    """``<auth_dir>/<role>.url``: the URL with that user's password, as ``--nats`` takes it,
    readable by its owner only."""
    for user in server.auth:
        write_private(auth_dir / f"{user.name}.url", server.url_for(user.name))


def _dev_gateway_files(data_dir: str) -> tuple[Path, Path]:
    """``DATA_DIR/gateway-tokens`` (a client and an admin bearer token, their callers named
    ``http-client`` and ``http-admin``) and ``DATA_DIR/callback-keys``, made once per data dir
    (mode 0600) and kept after."""
    root = Path(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    tokens, keys = root / "gateway-tokens", root / "callback-keys"
    if not tokens.exists():
        write_private(
            tokens,
            "# sojourn dev's bearer tokens: TOKEN ROLE NAME (NAME: who the history records)\n"
            f"{secrets.token_urlsafe(24)} client http-client\n"
            f"{secrets.token_urlsafe(24)} admin http-admin\n",
        )
    if not keys.exists():
        write_private(
            keys, "# sojourn dev's callback keys: KID SECRET\n" + generate_key_file_text()
        )
    return tokens, keys


def _dev_gateway_config(args: argparse.Namespace, settings: Settings) -> GatewayConfig:
    """The dev gateway's configuration: ``--tokens`` and ``--callback-keys``, else the files
    ``_dev_gateway_files`` makes (read before the server starts: with ``--auth`` the client
    user speaks for the tokens' names)."""
    tokens, keys = _dev_gateway_files(args.data_dir)
    args.tokens = args.tokens or str(tokens)
    args.callback_keys = args.callback_keys or str(keys)
    return gateway_config(args, settings.max_payload)


async def _dev_gateway(
    args: argparse.Namespace, opts: ConnectOptions, settings: Settings, config: GatewayConfig
) -> GatewayServer | None:
    """The gateway of ``sojourn dev`` on 127.0.0.1 (``None`` when its port is taken: dev goes
    on without it, saying so)."""

    async def connect() -> Client:
        return await Client.connect(opts, settings=settings)

    try:
        app = create_app(connect, config, console_routes)
        server = GatewayServer(app, "127.0.0.1", args.gateway_port)
    except SojournError as e:
        out(f"gateway: not started ({e}; choose another with --gateway-port)")
        return None
    url = await server.start()
    sends = f"; sends as its callers {callers(config)}" if config.tokens.names else ""
    out(f"gateway: {url} (bearer tokens in {args.tokens}; {describe(config)}{sends})")
    if config.console:
        out(f"console: {url}/ui/ (sign in with a token from {args.tokens})")
    return server


async def _serve(args: argparse.Namespace, *, dev: bool) -> int:
    configure_logging(args.log_level, args.log_format, "sojourn-worker")
    app = load_app(args.app)
    extra: dict[str, Any] = {"lease_ttl": args.lease_ttl}
    if args.dead_after is not None:
        extra["worker_dead_after"] = args.dead_after
        extra["worker_beat_interval"] = min(0.25, args.dead_after / 4)
    if args.timer_backstop is not None:
        extra["timer_backstop"] = args.timer_backstop
    settings = serve_settings(args, **extra)
    auth = dev and args.auth
    if auth and args.nats is not None:
        raise UsageError("--auth configures the local server: it cannot be used with --nats")
    gw_config = _dev_gateway_config(args, settings) if dev and not args.no_gateway else None
    server: EmbeddedServer | None = None
    async with serving(args) as (stopper, phase):
        try:
            if dev and args.nats is None:
                names = gw_config.tokens.names if gw_config is not None else frozenset[str]()
                auth_dir, users = _dev_users(args.data_dir, names) if auth else (Path(), [])
                try:
                    server = EmbeddedServer(
                        store_dir=args.data_dir,
                        port=args.port,
                        auth=users or None,
                        auth_prefix=settings.prefix,
                    )
                except ValueError as e:  # a caller named like a user: one name, one identity
                    raise UsageError(f"--auth: {e} (rename it in {args.tokens})") from None
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
                opts = watch_opts = await probed_options(args)
                if dev:
                    out(f"nats: {opts.display_url}")
            keys: CallbackKeys | None = None
            if gw_config is not None and not os.environ.get(CALLBACK_KEYS_ENV):
                keys = CallbackKeys.load(args.callback_keys)
            worker = Worker(
                app.agents,
                nats=opts,
                settings=settings,
                concurrency=args.concurrency,
                worker_id=args.worker_id,
                callback_keys=keys,
            )
            await worker.start()
            PROCESS_HEALTH.add("worker", worker_check(worker))
            watchdog = None
            try:
                if dev and not args.no_watchdog:
                    watchdog = await Watchdog(nats=watch_opts, settings=settings).start()
                    PROCESS_HEALTH.add("watchdog", watchdog_check(watchdog))
                async with contextlib.AsyncExitStack() as stack:
                    if gw_config is not None:
                        # The gateway is a client of the deployment (the client role, with --auth,
                        # speaking for its callers' names).
                        gw_opts = (
                            ConnectOptions(url=server.url_for("client"))
                            if auth and server
                            else opts
                        )
                        gateway = await _dev_gateway(args, gw_opts, settings, gw_config)
                        if gateway is not None:
                            stack.push_async_callback(gateway.stop)
                    projector = None
                    if dev and not args.no_projector:
                        # The projector writes the read side: the worker role may (broker/auth.py).
                        sqlite = Path(args.data_dir) / "runs.sqlite3"
                        projector = await stack.enter_async_context(
                            running_projector(opts, settings, sqlite=sqlite)
                        )
                    extras = [
                        x for x, on in (("a watchdog", watchdog), ("a projector", projector)) if on
                    ]
                    out(
                        f"serving: {', '.join(app.agent_names)} (app {app.name}, prefix "
                        f"{settings.prefix}, worker {worker.worker_id}"
                        + (f", with {' and '.join(extras)})" if extras else ")")
                    )
                    phase.serving()
                    PROCESS_HEALTH.refresh()
                    out("ready; press Ctrl-C to stop")
                    await stopper.wait(server)
                    out(f"{stopper.name} received: stopping the worker")
                    phase.stopping()
                    PROCESS_HEALTH.refresh()
            finally:
                phase.stopping()
                if watchdog is not None:
                    PROCESS_HEALTH.remove("watchdog")
                    await watchdog.stop()
                PROCESS_HEALTH.remove("worker")
                await worker.stop()
        finally:
            if server is not None:
                await server.stop()
    out("stopped")
    return EXIT_OK


async def cmd_dev(args: argparse.Namespace) -> int:
    return await _serve(args, dev=True)


async def cmd_worker(args: argparse.Namespace) -> int:
    return await _serve(args, dev=False)


async def cmd_watchdog(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_format)
    extra: dict[str, Any] = {"lease_ttl": args.lease_ttl}
    if args.stall_after is not None:
        extra["stall_after"] = args.stall_after
    if args.overdue_after is not None:
        extra["overdue_after"] = args.overdue_after
    if args.retain_ended is not None:
        try:
            extra["retain_ended"] = float(age_seconds(args.retain_ended))
        except UsageError:
            raise UsageError(
                f"--retain-ended {args.retain_ended!r}: a number and a unit s, m, h or d "
                "(3600s, 90m, 12h, 30d)"
            ) from None
    settings = serve_settings(args, **extra)
    opts = await probed_options(args)
    if args.once:
        judged = await Watchdog(nats=opts, settings=settings).survey()
        order: dict[LivenessState, int] = {"wedged": 0, "stalled": 1, "orphaned": 2, "overdue": 3}
        rows = sorted(judged.values(), key=lambda v: (order.get(v.state, 9), v.run_id))
        if args.json:
            out(encode(rows).decode())
            return EXIT_OK
        flagged = sum(1 for v in rows if v.flagged)
        out(f"{len(rows)} live run{'s' if len(rows) != 1 else ''}, {flagged} flagged")
        for liv in rows if args.all else [v for v in rows if v.flagged]:
            out(liveness_line(liv))
        return EXIT_OK

    def report(liv: Liveness, before: Liveness | None) -> None:
        if liv.flagged or (before is not None and before.flagged):
            out(liveness_line(liv))

    async with serving(args) as (stopper, phase):
        watchdog = await Watchdog(
            nats=opts, settings=settings, interval=args.interval, on_change=report
        ).start()
        PROCESS_HEALTH.add("watchdog", watchdog_check(watchdog))
        phase.serving()
        PROCESS_HEALTH.refresh()
        out(
            f"watching prefix {settings.prefix} on {opts.display_url} (stalled after "
            f"{settings.stall_threshold:g}s of silence, overdue {settings.overdue_after:g}s "
            "past due); press Ctrl-C to stop"
        )
        try:
            await stopper.wait()
        finally:
            phase.stopping()
            PROCESS_HEALTH.remove("watchdog")
            await watchdog.stop()
    out("stopped")
    return EXIT_OK


async def cmd_demo(args: argparse.Namespace) -> int:
    # Imported here, not at the top: the demo uses this package's rendering helpers, and only
    # this command needs the demo.
    from ._demo import run_demo

    return await run_demo(nats=args.nats, prefix=args.prefix, keep=args.keep)


# --- arguments ---------------------------------------------------------------------------------


def _concurrency(text: str) -> int:
    value = _positive_int(text)
    if value > BEAT_RUNS_MAX:
        raise argparse.ArgumentTypeError(
            f"at most {BEAT_RUNS_MAX} (a heartbeat lists every run its worker executes), got {text}"
        )
    return value


def _worker_options() -> argparse.ArgumentParser:
    """The options of a process that executes runs (``dev``, ``worker``)."""
    serve, s = parent_parser("worker")
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
        type=_concurrency,
        default=256,
        help=f"runs executed at once (default: 256, at most {BEAT_RUNS_MAX})",
    )
    add_seconds(
        s,
        "--lease-ttl",
        "the ack deadline of wakes and triggers, kept alive while their run executes (default: 30)",
        default=30.0,
    )
    add_seconds(
        s,
        "--dead-after",
        "seconds without a heartbeat after which other workers take over a worker's "
        "runs (default: 1.5; give every worker the same)",
    )
    add_seconds(
        s,
        "--timer-backstop",
        "how long after a deadline the broker's copy of a timer fires when this worker "
        "keeps the timer in process and wakes the run itself (default: 2; 0: no timers in "
        "process, the broker fires every timer at its deadline)",
        parse=_non_negative_float,
    )
    s.add_argument(
        "--worker-id",
        metavar="ID",
        default=None,
        help="name in logs and history (default: host-pid-random)",
    )
    add_log_level(s, "info")
    return serve


def _dev_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-watchdog", action="store_true", help="do not run a watchdog in this process"
    )
    p.add_argument(
        "--no-gateway", action="store_true", help="do not run the HTTP gateway in this process"
    )
    p.add_argument(
        "--gateway-port",
        metavar="PORT",
        type=_port,
        default=8080,
        help="port of the HTTP gateway on 127.0.0.1; 0 picks a free one (default: 8080)",
    )
    add_gateway_arguments(p, dev=True)
    p.add_argument(
        "--no-projector",
        action="store_true",
        help="do not run a projector in this process (its SQLite model is DATA_DIR/runs.sqlite3)",
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


def _watchdog_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--once", action="store_true", help="read everything, print the flagged runs, exit"
    )
    p.add_argument("--all", action="store_true", help="with --once: list every live run")
    add_json(p, "with --once: print a JSON array")
    add_seconds(
        p,
        "--lease-ttl",
        "the workers' --lease-ttl (judges leases written by older versions; default: 30)",
        default=30.0,
    )
    add_seconds(
        p,
        "--stall-after",
        "silence after which an owner counts as stalled (default: the workers' "
        "worker_dead_after, 1.5 s)",
    )
    p.add_argument(
        "--retain-ended",
        metavar="AGE",
        default=None,
        help="move ended runs older than AGE (30d, 12h...) out of the hot streams, every 5 "
        "minutes, as `sojourn archive` does (default: keep everything)",
    )
    add_seconds(
        p,
        "--overdue-after",
        "how long past due a timer or signal may be before its run is overdue (default: 60)",
    )
    add_seconds(p, "--interval", "seconds between two judgements (default: half a heartbeat)")
    add_log_level(p, "warning")


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")


COMMANDS = (
    Command(
        "dev",
        cmd_dev,
        "Run a local NATS server and a worker for an app, until Ctrl-C.",
        "sojourn dev --app examples.greeter --port 4222 --metrics-port 9300",
        parents=(_worker_options, monitoring_options),
        detail="With --nats, no server is started: only the worker, on that server. A "
        "watchdog runs in the same process (--no-watchdog to leave it out).",
        arguments=_dev_arguments,
    ),
    Command(
        "worker",
        cmd_worker,
        "Serve an app's agents on an existing NATS server.",
        "sojourn worker --app myapp.agents --nats nats://nats:4222 --concurrency 64",
        parents=(_worker_options, monitoring_options),
        detail="Stops cleanly on SIGINT or SIGTERM: running steps get a "
        "few seconds to finish, the rest resume on another worker.",
    ),
    Command(
        "watchdog",
        cmd_watchdog,
        "Judge every live run's liveness; re-wake stalled, orphaned and overdue runs.",
        "sojourn watchdog --nats nats://nats:4222 --metrics-port 9300",
        parents=(monitoring_options,),
        detail="Runs until Ctrl-C, printing a line whenever a run becomes (or stops being) "
        "stalled, orphaned, overdue or wedged. Several watchdogs may run at once: each "
        "problem is acted on by one of them. With --once, prints the flagged runs and exits.",
        arguments=_watchdog_arguments,
    ),
    Command(
        "demo",
        cmd_demo,
        "Kill a worker in the middle of a step and watch nothing happen twice.",
        "sojourn demo --keep",
        detail="Starts a NATS server in a temporary directory (or uses --nats, under a fresh "
        "prefix unless --prefix is given), two "
        "worker processes for examples/welcome.py and one run; SIGKILLs the first "
        "worker mid-step, lets the second finish, and checks every effect.",
        arguments=_demo_arguments,
    ),
)
