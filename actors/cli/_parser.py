"""The ``sojourn`` argument parser and its argument types."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from sojourn.broker.connection import ENV_CREDS, ENV_TLS_CA, ENV_TLS_CERT, ENV_TLS_KEY
from sojourn.schemas.health import BEAT_RUNS_MAX

from ._archive import cmd_archive
from ._budget import add_budget_arguments, cmd_budget
from ._common import DEFAULT_PREFIX, Handler
from ._gateway import add_gateway_arguments, cmd_gateway
from ._projector import cmd_projector
from ._read import cmd_runs
from ._runs import (
    cmd_cancel,
    cmd_decide,
    cmd_history,
    cmd_replay,
    cmd_resume,
    cmd_schemas,
    cmd_signal,
    cmd_start,
    cmd_status,
    cmd_terminate,
)
from ._schedule import add_schedule_commands, cmd_schedule
from ._serve import cmd_demo, cmd_dev, cmd_watchdog, cmd_worker
from ._stream import cmd_stream
from ._topology import cmd_topology
from ._watch import cmd_watch

__all__ = ["build_parser"]


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


def _replicas(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 1 <= value <= 5:
        raise argparse.ArgumentTypeError(f"must be from 1 to 5, got {text}")
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


def _concurrency(text: str) -> int:
    value = _positive_int(text)
    if value > BEAT_RUNS_MAX:
        raise argparse.ArgumentTypeError(
            f"at most {BEAT_RUNS_MAX} (a heartbeat lists every run its worker executes), got {text}"
        )
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
        type=_concurrency,
        default=256,
        help=f"runs executed at once (default: 256, at most {BEAT_RUNS_MAX})",
    )
    s.add_argument(
        "--lease-ttl",
        metavar="SECONDS",
        type=_positive_float,
        default=30.0,
        help="the ack deadline of wakes and triggers, kept alive while their run executes "
        "(default: 30)",
    )
    s.add_argument(
        "--dead-after",
        metavar="SECONDS",
        type=_positive_float,
        default=None,
        help="seconds without a heartbeat after which other workers take over a worker's "
        "runs (default: 1.5; give every worker the same)",
    )
    s.add_argument(
        "--timer-backstop",
        metavar="SECONDS",
        type=_non_negative_float,
        default=None,
        help="how long after a deadline the broker's copy of a timer fires when this worker "
        "keeps the timer in process and wakes the run itself (default: 2; 0: no timers in "
        "process, the broker fires every timer at its deadline)",
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
        connects: bool = True,
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            parents=[*parents, common] if connects else list(parents),
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
        "--no-gateway",
        action="store_true",
        help="do not run the HTTP gateway in this process",
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

    p = command(
        "gateway",
        cmd_gateway,
        "Serve sojourn's client API over HTTP: starts, signals, status, event streams, "
        "callback URLs and webhooks.",
        "sojourn gateway --port 8080 --tokens tokens.txt --callback-keys keys.txt "
        "--nats nats://nats:4222",
        parents=[observe],
        detail="Stateless: run as many as you like behind a load balancer. It talks to NATS "
        "as one client (give it the client role's credentials); its HTTP callers need bearer "
        "tokens from --tokens, except on callback and webhook URLs, whose signed token is the "
        "credential. See docs/gateway.md.",
    )
    add_gateway_arguments(p)
    p.add_argument(
        "--openapi",
        action="store_true",
        help="print the OpenAPI document and exit (no connection, no tokens needed)",
    )
    _log_level(p, "info")

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
        help="the workers' --lease-ttl (judges leases written by older versions; default: 30)",
    )
    p.add_argument(
        "--stall-after",
        metavar="SECONDS",
        type=_positive_float,
        default=None,
        help="silence after which an owner counts as stalled (default: the workers' "
        "worker_dead_after, 1.5 s)",
    )
    p.add_argument(
        "--retain-ended",
        metavar="AGE",
        default=None,
        help="move ended runs older than AGE (30d, 12h...) out of the hot streams, every 5 "
        "minutes, as `sojourn archive` does (default: keep everything)",
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
        "projector",
        cmd_projector,
        "Keep the read side: run views in KV, change messages, the SQLite model, listings.",
        "sojourn projector --nats nats://nats:4222 --sqlite /var/lib/sojourn/runs.sqlite3",
        parents=[observe],
        detail="Follows the events stream and writes each run's view to the runs KV bucket "
        "and to <prefix>.runs.<agent>.<run_id>, and the runs and steps of every run into an "
        "SQLite file that answers `sojourn runs`. Several projectors may run: one writes the "
        "views, each keeps its own SQLite file and answers listings. Runs until Ctrl-C.",
    )
    p.add_argument(
        "--sqlite",
        metavar="PATH",
        default=None,
        help="the SQLite read model (default: .sojourn/runs-<prefix>.sqlite3)",
    )
    p.add_argument(
        "--no-sqlite",
        action="store_true",
        help="keep only the KV views and change messages (no listings from this process)",
    )
    p.add_argument(
        "--rebuild",
        action="store_true",
        help="rebuild the read models from the start of the events stream, then go on",
    )
    _log_level(p, "info")

    p = command(
        "runs",
        cmd_runs,
        "List runs: by agent, status, liveness and time, most recently updated first.",
        "sojourn runs --agent greeter --status waiting --since 1h",
        detail="Asks a projector's read model (`sojourn projector`, also run by `sojourn "
        "dev`). Prints one line per run: RUN_ID  AGENT  STATUS  LIVENESS  UPDATED  STEP.",
    )
    p.add_argument("--agent", metavar="AGENT", default=None, help="only runs of this agent")
    p.add_argument(
        "--schedule", metavar="NAME", default=None, help="only runs this schedule started"
    )
    p.add_argument(
        "--status",
        metavar="STATUS",
        action="append",
        default=[],
        help="only runs with this status (repeatable): pending, running, waiting, suspended, "
        "completed, failed, cancelled",
    )
    p.add_argument(
        "--liveness",
        metavar="STATE",
        action="append",
        default=[],
        help="only runs judged so (repeatable): stalled, orphaned, overdue, wedged, ...",
    )
    p.add_argument(
        "--since",
        metavar="AGE",
        default=None,
        help="only runs updated within this long: 90s, 30m, 1h, 2d",
    )
    p.add_argument(
        "--limit",
        metavar="N",
        type=_positive_int,
        default=50,
        help="at most this many runs (default: 50)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON array of run views")

    p = command(
        "watch",
        cmd_watch,
        "Follow a run live: its waits, retries, signals and timings, until it ends.",
        "sojourn watch 5f0c9e2d",
        detail="Prints the run's timeline so far, then each change as it happens; exits 0 "
        "when the run ends (1 if it never existed).",
    )
    p.add_argument("run_id", metavar="RUN", help="run id")
    p.add_argument("--json", action="store_true", help="print each view as one JSON line")

    p = command(
        "stream",
        cmd_stream,
        "Print a run's output stream (ctx.stream tokens, ctx.progress), resumable by offset.",
        "sojourn stream 5f0c9e2d --after 120",
        detail="Prints the chunks after OFFSET, then new ones as they come, until the run "
        "ends. With --json each chunk is one JSON line with its offset: pass the last one "
        "to --after to resume exactly where a reader stopped.",
    )
    p.add_argument("run_id", metavar="RUN", help="run id")
    p.add_argument(
        "--after",
        metavar="OFFSET",
        type=int,
        default=0,
        help="resume after this offset (default: 0, from the start)",
    )
    p.add_argument("--json", action="store_true", help="print each chunk as one JSON line")

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
    add_budget_arguments(p, "each replaces the agent's own for this run")
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
        "Ask a run to stop: its running step is interrupted, its compensation runs.",
        "sojourn cancel 5f0c9e2d --reason 'wrong customer'",
    )
    p.add_argument("run_id", metavar="RUN", help="run id")
    p.add_argument("--reason", metavar="TEXT", default="", help="recorded in the history")

    p = command(
        "terminate",
        cmd_terminate,
        "End a run at once, without its compensation (on_cancel).",
        "sojourn terminate 5f0c9e2d --reason 'runaway loop'",
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
        "budget",
        cmd_budget,
        "Change a run's budget limits; a run suspended for its budget resumes.",
        "sojourn budget 5f0c9e2d --usd 5 --steps 500",
        detail="Each limit given replaces the run's own (the others stay). A run suspended "
        "because it used up a limit resumes at once and checks its new limits at its next "
        "step: if one is still used up it is suspended again, naming it. Needs the admin role "
        "where the deployment authenticates.",
    )
    p.add_argument("run_id", metavar="RUN", help="run id")
    add_budget_arguments(p, "the run's new limits")

    p = command(
        "schedule",
        cmd_schedule,
        "Recurring runs kept by the broker: add, list, pause, resume, trigger, delete.",
        "sojourn schedule add hourly-report --agent report --cron '0 * * * *'",
        detail="A schedule starts a run of its agent at every fire time, exactly once per fire "
        "(the run id derives from the fire time), with no process needed for the fire itself. "
        "`sojourn schedule ACTION --help` for each action.",
        connects=False,  # each action takes the connection options
    )
    add_schedule_commands(p, common)

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
        "replay",
        cmd_replay,
        "Replay stored histories against an app's code, executing nothing; exit 1 on a divergence.",
        "sojourn replay --app myapp.agents --all-live --from-file golden/order.json",
        detail="Prints one line per history: RUN_ID  AGENT  ok, or RUN_ID  AGENT  diverges at "
        "position N: recorded X, code now calls Y. Exits 0 when every history replays, 1 on "
        "any divergence (or a history of an agent the app does not define): a gate before a "
        "deploy. --from-file reads what `sojourn history RUN --json` prints and needs no "
        "server; --run and --all-live read the deployment's histories.",
    )
    p.add_argument(
        "--app",
        metavar="MODULE",
        required=True,
        help="module whose module-level agents to check, imported as `sojourn worker --app` "
        "does (e.g. examples.greeter)",
    )
    p.add_argument(
        "--run",
        metavar="ID",
        action="append",
        default=[],
        dest="runs",
        help="a run to replay, ended or not (repeatable)",
    )
    p.add_argument(
        "--all-live", action="store_true", help="every run that has not ended (not with --run)"
    )
    p.add_argument(
        "--from-file",
        metavar="FILE",
        action="append",
        default=[],
        dest="files",
        help="a history saved with `sojourn history RUN --json > FILE` (repeatable; no "
        "server needed)",
    )
    p.add_argument("--agent", metavar="AGENT", default=None, help="only histories of this agent")
    p.add_argument("--json", action="store_true", help="print a JSON array, one object per run")

    p = command(
        "topology",
        cmd_topology,
        "Compare the deployment's streams and consumers with sojourn's config; --apply fixes.",
        "sojourn topology --nats nats://admin:pw@nats:4222 --apply --replicas 3",
        detail="Prints one line per stream and durable consumer: missing, ok, drift (differs "
        "in keys an operator may tune: left as it is) or incompatible (differs in a key sojourn "
        "relies on: workers refuse to start), with the keys and both values. Exits 0 when "
        "nothing is missing or incompatible, else 1. Workers never rewrite an existing stream; "
        "--apply (admin credentials) creates what is missing and sets what sojourn relies on, "
        "keeping what was tuned (the replica count too, unless --replicas is given).",
    )
    p.add_argument(
        "--apply", action="store_true", help="create what is missing, fix what is incompatible"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--lease-ttl",
        metavar="SECONDS",
        type=_positive_float,
        default=30.0,
        help="the workers' --lease-ttl, which the consumers' ack_wait follows (default: 30)",
    )
    p.add_argument(
        "--agent",
        metavar="AGENT",
        action="append",
        default=[],
        dest="agents",
        help="check the wake consumer of this agent (repeatable; default: every agent a "
        "worker has registered)",
    )

    p = command(
        "schemas",
        cmd_schemas,
        "Write JSON Schemas of the wire messages into a directory.",
        "sojourn schemas --out ./schemas-json",
    )
    p.add_argument("--out", metavar="DIR", required=True, help="directory to write into")

    p = command(
        "archive",
        cmd_archive,
        "Move ended runs older than an age out of the hot streams (one pass; cron-friendly).",
        "sojourn archive --older-than 30d --dry-run",
        detail="Finds ended runs in the read side's views (a projector must be running), "
        "checks each against its own history, copies the history to the object store "
        "bucket <PREFIX>_ARCHIVE, reads the copy back and compares it, then purges the run's "
        "events, wakes, timers, lease and output. `sojourn history` and `sojourn status` "
        "still read archived runs. Runs that have not ended are never touched, nor a child "
        "run whose parent has not ended. Needs watchdog or admin credentials. Exits 1 if "
        "any run could not be moved (it stays hot; the next pass retries it).",
    )
    p.add_argument(
        "--older-than",
        metavar="AGE",
        default="30d",
        help="move runs that ended at least this long ago: 3600s, 90m, 12h, 30d (default: 30d)",
    )
    p.add_argument(
        "--policy",
        metavar="POLICY",
        default=None,
        help="object_store (keep a verified copy: the default) or discard (keep nothing)",
    )
    p.add_argument(
        "--limit",
        metavar="N",
        type=_positive_int,
        default=None,
        help="move at most this many runs, oldest end first (default: all that are due)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="list the runs that would move; change nothing"
    )
    p.add_argument("--json", action="store_true", help="print the pass's report as JSON")

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
