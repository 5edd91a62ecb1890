"""``sojourn gateway``: the HTTP gateway (docs/gateway.md), until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import re
import webbrowser
from collections.abc import Callable
from typing import TypeVar

import httpx

from sojourn.schemas.codec import encode
from sojourn.schemas.errors import SojournError

from ..agents.callbacks import CALLBACK_KEYS_ENV, CallbackKeys
from ..client.client import Client
from ..console import console_routes
from ..gateway import (
    BearerTokens,
    GatewayConfig,
    GatewayServer,
    Policy,
    WebhookRoute,
    create_app,
    openapi_document,
    parse_actions,
    parse_route,
)
from ..gateway._sessions import SESSION_TTL, SessionKey, Sessions
from ..ops.health import PROCESS_HEALTH, gateway_check
from ._args import Command, add_log_level, monitoring_options
from ._common import EXIT_OK, UsageError, configure_logging, probed_options, serve_settings, serving
from ._render import out

__all__ = [
    "COMMANDS",
    "add_gateway_arguments",
    "callers",
    "cmd_console",
    "cmd_gateway",
    "describe",
    "gateway_config",
]

TOKENS_ENV = "SOJOURN_GATEWAY_TOKENS"

_GATEWAY_URL = re.compile(r"https?://[A-Za-z0-9.:\[\]-]{1,260}")

_ORIGIN = re.compile(
    r"https?://[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?|https?://\[[0-9A-Fa-f:.]{2,45}\](:[0-9]{1,5})?"
)

T = TypeVar("T")


def add_gateway_arguments(p: argparse.ArgumentParser, *, dev: bool = False) -> None:
    """The gateway's options (on ``sojourn gateway``, and on ``sojourn dev`` where a gateway
    runs too)."""
    g = p.add_argument_group("HTTP gateway")
    if not dev:
        g.add_argument(
            "--host",
            metavar="ADDR",
            default="127.0.0.1",
            help="address to listen on (default: 127.0.0.1; 0.0.0.0 for all interfaces)",
        )
        g.add_argument(
            "--port",
            metavar="PORT",
            type=int,
            default=8080,
            help="port to listen on; 0 picks a free one (default: 8080)",
        )
    g.add_argument(
        "--tokens",
        metavar="FILE",
        default=None,
        help=f"bearer tokens, one 'TOKEN ROLE NAME' per line, ROLE client or admin, NAME who "
        f"the history records as the caller (default: ${TOKENS_ENV}"
        + ("; sojourn dev makes DATA_DIR/gateway-tokens)" if dev else ")"),
    )
    g.add_argument(
        "--callback-keys",
        metavar="FILE",
        default=None,
        help=f"keys that verify callback tokens, one 'KID SECRET' per line (default: "
        f"${CALLBACK_KEYS_ENV}" + ("; sojourn dev makes DATA_DIR/callback-keys)" if dev else ")"),
    )
    g.add_argument(
        "--webhook",
        metavar="NAME=SCHEME:SECRET",
        action="append",
        default=[],
        help="a webhook route, POST /v1/webhooks/NAME/TOKEN: SCHEME stripe, github, standard "
        "or hmac-sha256; SECRET literal, env:VAR or file:PATH (two, comma-separated, while "
        "rotating); ';tolerance=SECONDS' (default 300). A routed route, POST "
        "/v1/webhooks/NAME, adds ';start=AGENT;id=PATH' or ';signal=NAME;id=PATH' (PATH: the "
        "body field naming the run, /a/b or a.b) and optionally ';prefix=TEXT'. Repeatable",
    )
    g.add_argument(
        "--admin-only",
        metavar="ACTIONS",
        default="",
        help="actions only admin tokens may take, comma-separated: start, read, signal, cancel "
        "(default: none; e.g. cancel)",
    )
    g.add_argument(
        "--max-streams",
        metavar="N",
        type=int,
        default=10_000,
        help="event streams (SSE) open at once; one more is answered 503 (default: 10000)",
    )
    g.add_argument(
        "--session-key",
        metavar="FILE",
        default=None,
        help="the key console session cookies are signed with (a line of at least 32 "
        "characters; give every gateway behind one load balancer the same file; default: a "
        "key of this process, whose sessions end with it)",
    )
    g.add_argument(
        "--session-ttl",
        metavar="SECONDS",
        type=float,
        default=SESSION_TTL,
        help=f"how long a console session lasts (default: {SESSION_TTL:.0f})",
    )
    g.add_argument(
        "--secure-cookies",
        action="store_true",
        help="mark the session cookie Secure (the gateway is reached over HTTPS, e.g. behind "
        "a TLS proxy)",
    )
    g.add_argument(
        "--cors-origin",
        metavar="ORIGIN",
        action="append",
        default=[],
        help="an origin (https://app.example.com) whose pages may call the API with a bearer "
        "token: answered with CORS headers (default: none, CORS closed). Repeatable",
    )
    g.add_argument(
        "--no-console",
        action="store_true",
        help="do not serve the web console under /ui/",
    )
    g.add_argument(
        "--max-body",
        metavar="BYTES",
        type=int,
        default=None,
        help="largest request body read (default: the deployment's max payload, 1 MiB)",
    )


def _load(flag: str, path: str, load: Callable[[str], T]) -> T:
    """``load(path)``; a file that cannot be read, or is malformed, is a usage error naming
    ``flag``."""
    try:
        return load(path)
    except OSError as e:
        raise UsageError(f"{flag} {path}: {e.strerror}") from None
    except ValueError as e:
        raise UsageError(f"{flag}: {e}") from None


def gateway_config(args: argparse.Namespace, max_payload: int) -> GatewayConfig:
    """The configuration ``args`` describe.

    Raises:
        UsageError: a file that cannot be read or is malformed, a bad route or action.
    """
    tokens_path = args.tokens or os.environ.get(TOKENS_ENV)
    if not tokens_path:
        raise UsageError(
            f"--tokens FILE (or ${TOKENS_ENV}) is required: one 'TOKEN ROLE NAME' per line; "
            "every endpoint but callbacks needs a bearer token"
        )
    tokens = _load("--tokens", tokens_path, BearerTokens.load)
    keys_path = args.callback_keys or os.environ.get(CALLBACK_KEYS_ENV)
    keys = _load("--callback-keys", keys_path, CallbackKeys.load) if keys_path else None
    routes: dict[str, WebhookRoute] = {}
    for text in args.webhook:
        try:
            route = parse_route(text)
        except ValueError as e:
            raise UsageError(f"--webhook: {e}") from None
        if route.name in routes:
            raise UsageError(f"--webhook: route {route.name!r} given twice")
        routes[route.name] = route
    if keys is None and any(not r.routed for r in routes.values()):
        raise UsageError(
            "--webhook needs --callback-keys: a webhook route without start= or signal= "
            "delivers a callback token"
        )
    try:
        admin_only = parse_actions(args.admin_only)
    except ValueError as e:
        raise UsageError(f"--admin-only: {e}") from None
    max_body = args.max_body if args.max_body is not None else max_payload
    if not 1 <= max_body <= max_payload:
        raise UsageError(f"--max-body: 1 to {max_payload} (the deployment's max payload)")
    if args.max_streams < 1:
        raise UsageError("--max-streams: at least 1")
    key = _load("--session-key", args.session_key, SessionKey.load) if args.session_key else None
    try:
        sessions = Sessions(
            key or SessionKey.random(), tokens, ttl=args.session_ttl, secure=args.secure_cookies
        )
    except ValueError as e:
        raise UsageError(f"--session-ttl: {e}") from None
    origins = []
    for origin in args.cors_origin:
        if not _ORIGIN.fullmatch(origin):
            raise UsageError(
                f"--cors-origin {origin[:64]!r}: an origin is scheme://host[:port], no path, "
                "no wildcard"
            )
        origins.append(origin)
    return GatewayConfig(
        max_streams=args.max_streams,
        tokens=tokens,
        policy=Policy(admin_only),
        callback_keys=keys,
        webhooks=routes,
        max_body=max_body,
        sessions=sessions,
        cors_origins=tuple(origins),
        console=not args.no_console,
    )


def callers(config: GatewayConfig, limit: int = 10) -> str:
    """The callers' names, the first ``limit`` of them: ``alice, bob`` or ``a, b ... (12)``."""
    names = sorted(config.tokens.names)
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} ... ({len(names)})"


def describe(config: GatewayConfig) -> str:
    """One line on what a gateway accepts (no secrets)."""
    tokens = config.tokens
    parts = [
        f"{len(tokens)} bearer tokens",
        "callbacks " + ("on" if config.callback_keys else "off (no --callback-keys)"),
    ]
    if tokens.unnamed:
        parts.append(f"{tokens.unnamed} without a name (sent as the gateway's own user)")
    if config.webhooks:
        parts.append(f"webhooks {', '.join(sorted(config.webhooks))}")
    if config.cors_origins:
        parts.append(f"CORS open to {', '.join(config.cors_origins)}")
    if config.policy.admin_only:
        parts.append(f"admin only: {', '.join(sorted(config.policy.admin_only))}")
    return "; ".join(parts)


async def cmd_gateway(args: argparse.Namespace) -> int:
    if args.openapi:
        out(encode(openapi_document()).decode())
        return EXIT_OK
    configure_logging(args.log_level, args.log_format, "sojourn-gateway")
    settings = serve_settings(args)
    config = gateway_config(args, settings.max_payload)
    opts = await probed_options(args)

    async def connect() -> Client:
        return await Client.connect(opts, settings=settings)

    async with serving(args) as (stopper, phase):
        try:
            app = create_app(connect, config, console_routes)
            server = GatewayServer(app, args.host, args.port)
            url = await server.start()
            PROCESS_HEALTH.add("gateway", gateway_check(app))
            phase.serving()
            PROCESS_HEALTH.refresh()
            out(f"gateway: {url} (nats {opts.display_url}, prefix {settings.prefix})")
            if config.console:
                out(f"  console: {url}/ui/ (sign in with a bearer token)")
            out(f"  {describe(config)}")
            if config.tokens.names:
                user = opts.user
                out(
                    f"  sends as its callers: {callers(config)}"
                    + (
                        f" (NATS user {user!r} must speak for them: python -m "
                        f"sojourn.broker.auth --speaks-for {user}=NAME,...)"
                        if user
                        else ""
                    )
                )
            out("ready; press Ctrl-C to stop")
            try:
                await stopper.wait()
                out(f"{stopper.name} received: stopping the gateway")
            finally:
                phase.stopping()
                PROCESS_HEALTH.refresh()
                await server.stop()
        finally:
            PROCESS_HEALTH.remove("gateway")
    out("stopped")
    return EXIT_OK


def _arguments(p: argparse.ArgumentParser) -> None:
    add_gateway_arguments(p)
    p.add_argument(
        "--openapi",
        action="store_true",
        help="print the OpenAPI document and exit (no connection, no tokens needed)",
    )
    add_log_level(p, "info")


async def cmd_console(args: argparse.Namespace) -> int:
    """Print the web console's URL once the gateway there serves it (and open it, ``--open``)."""
    base = args.url.rstrip("/")
    if not _GATEWAY_URL.fullmatch(base):
        raise UsageError(f"--url {base[:64]!r}: http(s)://host[:port] of a sojourn gateway")
    url = f"{base}/ui/"
    try:
        async with httpx.AsyncClient(timeout=5) as h:
            r = await h.get(url)
    except httpx.HTTPError as e:
        raise SojournError(f"no gateway answers at {base} ({type(e).__name__}): start one "
                           "with `sojourn gateway` or `sojourn dev`") from None  # fmt: skip
    if r.status_code != 200 or "/ui/static/app.js" not in r.text:
        raise SojournError(f"{base} serves no console (HTTP {r.status_code}; --no-console?)")
    out(f"console: {url} (sign in with a bearer token from the gateway's tokens file)")
    if args.open:
        webbrowser.open(url)
    return EXIT_OK


def _console_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default="http://127.0.0.1:8080",
        help="the gateway (default: http://127.0.0.1:8080, where sojourn dev serves it)",
    )
    p.add_argument("--open", action="store_true", help="open it in the default browser")


COMMANDS = (
    Command(
        "console",
        cmd_console,
        "Where the web console is: the URL of a running gateway's /ui/ (docs/console.md).",
        "sojourn console --url http://127.0.0.1:8080 --open",
        connects=False,
        detail="The console is served by every gateway (sojourn gateway, sojourn dev) unless "
        "it runs with --no-console; sign in there with one of its bearer tokens.",
        arguments=_console_arguments,
    ),
    Command(
        "gateway",
        cmd_gateway,
        "Serve sojourn's client API over HTTP: starts, signals, status, event streams, "
        "callback URLs and webhooks.",
        "sojourn gateway --port 8080 --tokens tokens.txt --callback-keys keys.txt "
        "--nats nats://nats:4222",
        parents=(monitoring_options,),
        detail="Stateless: run as many as you like behind a load balancer. It talks to NATS "
        "as one client (give it the client role's credentials); its HTTP callers need bearer "
        "tokens from --tokens, except on callback and webhook URLs, whose signed token is the "
        "credential. See docs/gateway.md.",
        arguments=_arguments,
    ),
)
