"""What the commands' arguments share: the argument types, the option groups several commands
take (the deployment and its credentials, monitoring, ``--log-level``, ``--json``, a run id),
and ``Command``, the one description of a subcommand that every command family gives
``build_parser``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sojourn.broker.connection import ENV_CREDS, ENV_TLS_CA, ENV_TLS_CERT, ENV_TLS_KEY

from ._common import DEFAULT_PREFIX, Handler

__all__ = [
    "Command",
    "Formatter",
    "_non_negative_float",
    "_port",
    "_positive_float",
    "_positive_int",
    "add_json",
    "add_json_value",
    "add_log_level",
    "add_run_id",
    "add_seconds",
    "connection_options",
    "monitoring_options",
    "parent_parser",
]


class Formatter(argparse.RawDescriptionHelpFormatter):
    """The help layout of ``sojourn`` and its commands: descriptions as written, option help
    from column 30."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30)


# --- argument types -----------------------------------------------------------------------------


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _whole_number(text: str, what: str) -> int:
    """``text`` as an int; ``what`` names the argument in the error when it is not one."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None


def _port(text: str) -> int:
    value = _whole_number(text, "a port number")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r} (0-65535)")
    return value


def _replicas(text: str) -> int:
    value = _whole_number(text, "a number")
    if not 1 <= value <= 5:
        raise argparse.ArgumentTypeError(f"must be from 1 to 5, got {text}")
    return value


# --- arguments several commands take ------------------------------------------------------------


def add_log_level(group: Any, default: str) -> None:
    """``--log-level``, on a parser or an argument group."""
    group.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=default,
        help=f"log level on stderr (default: {default})",
    )
    group.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="log lines as text, or one JSON object a line for log pipelines; both carry "
        "the current span's trace_id and span_id when the process traces (default: text)",
    )


def add_seconds(
    group: Any,
    flag: str,
    what: str,
    *,
    default: float | None = None,
    parse: Callable[[str], float] = _positive_float,
) -> None:
    """An option taking a number of seconds (positive, unless ``parse`` says otherwise), on a
    parser or an argument group; ``what`` is its help."""
    group.add_argument(flag, metavar="SECONDS", type=parse, default=default, help=what)


def add_json(p: argparse.ArgumentParser, what: str) -> None:
    """``--json``; ``what`` is its help: what the command prints with it."""
    p.add_argument("--json", action="store_true", help=what)


def add_json_value(p: argparse.ArgumentParser, flag: str, what: str) -> None:
    """An option taking a JSON value (``null`` if not given), which ``parse_input`` reads;
    ``what`` is its help."""
    p.add_argument(flag, metavar="JSON", default="null", help=what)


def add_run_id(p: argparse.ArgumentParser) -> None:
    """The ``RUN`` positional of the commands on one run."""
    p.add_argument("run_id", metavar="RUN", help="run id")


def parent_parser(title: str) -> tuple[argparse.ArgumentParser, argparse._ArgumentGroup]:
    """A parser to give commands as a parent (it has no ``-h``), and its one argument group,
    ``title``, for the options the commands share."""
    parser = argparse.ArgumentParser(add_help=False)
    return parser, parser.add_argument_group(title)


def connection_options() -> argparse.ArgumentParser:
    """The deployment and how to reach it (``--nats``, ``--prefix``, ``--replicas``,
    ``--creds``, ``--tls-*``): the parent parser of every command that connects."""
    common, g = parent_parser("deployment")
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
    g.add_argument(
        "--replicas",
        metavar="N",
        type=_replicas,
        default=None,
        help="copies of each stream sojourn creates, 1-5 (default: 1; 3 on a cluster, see "
        "deploy/nats/); existing streams keep theirs",
    )
    c = common.add_argument_group(
        "credentials and TLS",
        "A user and password go in the URL (nats://user:password@host:4222).",
    )
    for flag, what, env in (
        ("--creds", "NATS credentials file (JWT + seed) to authenticate with", ENV_CREDS),
        ("--tls-ca", "CA certificate to verify the server's certificate with", ENV_TLS_CA),
        ("--tls-cert", "client certificate, for servers that verify clients", ENV_TLS_CERT),
        ("--tls-key", "the client certificate's private key", ENV_TLS_KEY),
    ):
        c.add_argument(flag, metavar="FILE", default=None, help=f"{what} (default: ${env})")
    return common


def monitoring_options() -> argparse.ArgumentParser:
    """``--metrics-port`` and ``--metrics-host``: the parent parser of the serving commands."""
    observe, o = parent_parser("monitoring")
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
    return observe


# --- commands ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One ``sojourn`` subcommand: its name, its handler, its help (``summary`` in the list of
    ``sojourn --help``, then ``detail`` and an ``example`` in its own), the option groups it
    shares (``parents``, each a function making a parent parser; ``connects``: the connection
    options too) and the function adding its own arguments."""

    name: str
    handler: Handler
    summary: str
    example: str
    detail: str = ""
    parents: tuple[Callable[[], argparse.ArgumentParser], ...] = ()
    connects: bool = True
    arguments: Callable[[argparse.ArgumentParser], None] | None = None

    def add_to(
        self, sub: argparse._SubParsersAction[argparse.ArgumentParser]
    ) -> argparse.ArgumentParser:
        """Add this command's parser to ``sub``; it is returned."""
        parents = (*self.parents, connection_options) if self.connects else self.parents
        p = sub.add_parser(
            self.name,
            parents=[make() for make in parents],
            help=self.summary,
            description=self.summary + (f"\n\n{self.detail}" if self.detail else ""),
            epilog=f"example:\n  {self.example}",
            formatter_class=Formatter,
        )
        p.set_defaults(handler=self.handler)
        if self.arguments is not None:
            self.arguments(p)
        return p
