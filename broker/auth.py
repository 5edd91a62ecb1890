"""Least-privilege NATS users for a sojourn deployment, as nats-server configuration.

``render_accounts`` turns a prefix and a list of users, each with a role (``client``,
``worker``, ``watchdog``, ``admin``: ``sojourn.schemas.auth.Role``), into an ``accounts`` block
for nats-server: one account with JetStream enabled, and per user exactly the subjects its role
needs (docs/operations.md, "Security", says what each may do and why). Pure: no I/O.

Two rules carry the trust boundary:

- a user may publish inbox messages only in the authenticated form naming itself,
  ``<prefix>.as.<user>.<kind>...``: the intake records that token as who sent the message, so
  no user can speak for another, and the anonymous forms are closed to everyone but admins.
  The one exception is explicit: a ``client`` user given ``speaks_for`` names (an HTTP gateway,
  whose callers each have a name in its tokens file) may also start, signal, cancel and send
  schedule requests as exactly those names, never control messages;
- run histories (``<prefix>.ev.*``) are written by workers only, and no role but ``admin`` may
  delete a stream, delete a message or update the events stream's configuration (which could
  shorten its retention); only the ``watchdog`` (which runs retention: ended runs' histories
  archived, then removed, ``sojourn.actors.ops.archive``) and ``admin`` may purge the events
  stream.

Replies are private: a restricted user may subscribe to its own inboxes only,
``_INBOX.<user>.>``, the prefix its connection makes every reply inbox under
(``names.inbox_prefix``); only workers publish on other users' inboxes (they answer requests).

Print the block for a prefix (users ``client``, ``worker``, ``watchdog``, ``admin`` with
passwords from ``$SOJOURN_<USER>_PASSWORD``)::

    python -m sojourn.broker.auth --prefix sojourn
    python -m sojourn.broker.auth --user client:client --user client2:client   # rotation
    python -m sojourn.broker.auth --user gateway:client --user worker:worker ... \
        --speaks-for gateway=alice,bob        # a gateway whose tokens file names alice and bob
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sojourn.schemas.auth import ROLES, Role
from sojourn.schemas.errors import InvalidName
from sojourn.schemas.priority import PRIORITIES

from .names import REPLY_PREFIX, Names, user_inboxes, validate_token

__all__ = [
    "ACCOUNT",
    "AuthUser",
    "Permissions",
    "default_users",
    "password_env_var",
    "permissions_for",
    "render_accounts",
]

ACCOUNT = "SOJOURN"
"""The name of the account the rendered users live in."""

_ENV_REF = re.compile(r"\$[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class AuthUser:
    """One NATS user of a deployment.

    Attributes:
        name: the user name; a subject token, because it is the ``<sender>`` of the
            authenticated inbox subjects (``<prefix>.as.<name>...``).
        password: the password as nats-server should see it: plain text, a bcrypt hash
            (``$2a$...``, from ``nats server passwd``), or an environment variable reference
            (``$SOJOURN_CLIENT_PASSWORD``) that the server resolves when it reads its config.
        role: what the user may do.
        prefix: the deployment whose subjects the role applies to; ``None`` (the default):
            the prefix ``render_accounts`` is given. Several deployments can share a server.
        speaks_for: other names this user may send inbox messages as (start, signal, cancel,
            schedule requests; never control messages): the names of an HTTP gateway's callers
            (its tokens file's NAMEs), so the history records each caller, not the gateway.
            Only for the ``client`` role. Kept sorted, without repeats or the user's own name.
    """

    name: str
    password: str
    role: Role
    prefix: str | None = None
    speaks_for: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        validate_token(self.name, "user name")
        if self.prefix is not None:
            Names(self.prefix)  # validates it
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}: use one of {', '.join(ROLES)}")
        if not self.password:
            raise ValueError(f"user {self.name!r} needs a password")
        if isinstance(self.speaks_for, str):
            raise TypeError("speaks_for is a sequence of names, not one string")
        names = _speaks_for(self.name, self.speaks_for)
        if names and self.role != "client":
            raise ValueError(
                f"user {self.name!r}: only a client user (an HTTP gateway) may speak for others, "
                f"not a {self.role} user"
            )
        object.__setattr__(self, "speaks_for", names)


def _speaks_for(user: str, names: Iterable[str]) -> tuple[str, ...]:
    """``names`` validated, sorted, without repeats or ``user`` itself (it speaks for itself)."""
    return tuple(sorted({validate_token(n, "name to speak for") for n in names} - {user}))


@dataclass(frozen=True, slots=True)
class Permissions:
    """What a user may publish and subscribe to (nats-server ``permissions``)."""

    publish_allow: tuple[str, ...]
    publish_deny: tuple[str, ...]
    subscribe_allow: tuple[str, ...]


def _streams(names: Names) -> list[str]:
    return [
        names.events_stream,
        names.inbox_stream,
        names.wake_stream,
        names.dlq_stream,
        names.leases_stream,
        names.agents_stream,
        names.health_stream,
        names.values_stream,
        names.schedules_stream,
        *_read_side(names),
    ]


def _read_side(names: Names) -> list[str]:
    """The streams the read side keeps: run views (KV), their changes, runs' output."""
    return [names.runs_kv_stream, names.changes_stream, names.output_stream]


def _following(stream: str) -> list[str]:
    """Follow a stream with an ordered consumer (a watch, a resumed output stream): create
    ephemeral consumers on it, answer its flow control; nothing durable, nothing acked (an
    ephemeral consumer goes away by itself once its reader is gone: no delete is needed)."""
    return [
        f"$JS.API.CONSUMER.CREATE.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.INFO.{stream}.>",
        f"$JS.FC.{stream}.>",
    ]


def _direct_get(stream: str) -> list[str]:
    # Both forms: a JSON request on the stream's subject (batches, next by subject), and the
    # last message of a subject named in the request subject itself.
    return [f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>"]


def _reading(names: Names) -> list[str]:
    """Read a deployment: its runs, leases, health and agents, and stream info."""
    out = ["$JS.API.INFO"]
    out += [f"$JS.API.STREAM.INFO.{s}" for s in (*_streams(names), names.archive_stream)]
    for stream in (
        names.events_stream,
        names.archive_stream,  # the histories of archived runs (retention)
        names.inbox_stream,  # a pending run: its start, stored and not yet taken
        names.leases_stream,
        names.health_stream,
        names.agents_stream,
        names.values_stream,  # large values by reference: a run's input, output, results
        names.schedules_stream,  # schedules' records (`sojourn schedule list`)
        *_read_side(names),
    ):
        out += _direct_get(stream)
    for stream in _read_side(names):
        out += _following(stream)
    out.append(names.query_runs)  # the run listing service (request/reply)
    return out


def _never(names: Names) -> list[str]:
    """Denied to every restricted role, whatever its allow list says: what could destroy or
    shorten history, or remove a message behind the runtime's back."""
    return [
        "$JS.API.STREAM.DELETE.>",
        "$JS.API.STREAM.MSG.DELETE.>",
        f"$JS.API.STREAM.PURGE.{names.events_stream}",
        f"$JS.API.STREAM.UPDATE.{names.events_stream}",
        f"$JS.API.STREAM.RESTORE.{names.events_stream}",
    ]


def _retention(names: Names) -> list[str]:
    """Retention (the watchdog's archiver): write archived histories to the object store,
    purge an ended run's subjects from the streams that hold them (its events, wakes and
    timers, lease, output, watchdog claim and wedge record) and the keyed starts' records
    nothing needs any more, mark its view archived, and hold the archiver's leadership."""
    archive = names.archive_stream
    return [
        f"$O.{names.archive_bucket}.>",
        f"$JS.API.STREAM.CREATE.{archive}",
        f"$JS.API.STREAM.PURGE.{archive}",  # the chunks of a replaced or deleted archive
        *(
            f"$JS.API.STREAM.PURGE.{s}"
            for s in (
                names.events_stream,
                names.wake_stream,
                names.leases_stream,
                names.output_stream,
                names.health_stream,
                names.schedules_stream,  # keyed starts' records nothing needs (decision 0053)
            )
        ),
        names.run_keys_all,
        names.leader("archiver"),
    ]


def _snapshot_reading(names: Names) -> list[str]:
    """Read the run model's snapshot (the watchdog starts from it; the bucket may be
    missing: a direct get on a missing stream answers nothing)."""
    return [f"$JS.API.STREAM.INFO.{names.snapshots_stream}", *_direct_get(names.snapshots_stream)]


def _snapshot_writing(names: Names) -> list[str]:
    """Store the run model's snapshot (the projector leader, which runs with the worker role):
    create the bucket on demand, write its chunks and description, purge the replaced one's
    chunks (nothing else in that stream is ever purged)."""
    stream = names.snapshots_stream
    return [
        f"$O.{names.snapshots_bucket}.>",
        f"$JS.API.STREAM.CREATE.{stream}",
        f"$JS.API.STREAM.PURGE.{stream}",
        *_snapshot_reading(names),
    ]


def _client_inbox(names: Names, sender: str) -> list[str]:
    """What a client sends as ``sender``: starts, signals, updates, cancels and schedule
    requests (add, pause, resume, trigger, delete); never a control message."""
    return [
        *(names.start("*", sender, priority=p) for p in PRIORITIES),
        *(names.start("*", sender, "*", priority=p) for p in PRIORITIES),
        names.signal("*", ">", sender),
        names.update("*", ">", sender),
        names.cancel("*", sender),
        names.schedule("*", sender),
    ]


def permissions_for(
    names: Names, user: str, role: Role, *, speaks_for: Iterable[str] = ()
) -> Permissions | None:
    """The permissions of ``user`` with ``role`` in the deployment ``names``; ``None`` for
    ``admin`` (unrestricted within the account). ``speaks_for``: the other names a client user
    may send as (``AuthUser.speaks_for``).

    Raises:
        InvalidName: ``user`` or a name in ``speaks_for`` is not a token.
        ValueError: ``speaks_for`` names for a role other than ``client``.
    """
    validate_token(user, "user name")
    others = _speaks_for(user, speaks_for)
    if others and role != "client":
        raise ValueError(f"only a client user may speak for others, not a {role} user")
    p = names.prefix
    # Replies come to each user's own inboxes only (``_INBOX.<user>.>``: the prefix its
    # connection makes its inboxes under, ``names.inbox_prefix``), so no user sees another's
    # PubAcks, direct-get answers or the intake's answers. Answering is the worker's: it
    # publishes on any inbox.
    own_inboxes = user_inboxes(user)
    any_inbox = f"{REPLY_PREFIX}.>"
    if role == "admin":
        return None
    if role == "client":
        publish = [
            *_client_inbox(names, user),
            # an HTTP gateway's callers, each recorded under its own name (``speaks_for``)
            *(s for other in others for s in _client_inbox(names, other)),
            # the HTTP gateway (a client) keeps the callback and webhook requests it refused
            names.dlq("http"),
            *_reading(names),
        ]
        # Clients watch a run with a core subscription on its event subject, its views on
        # the change subjects, its output live on the output subject.
        subscribe: tuple[str, ...] = (
            own_inboxes,
            # the intake answers a message sent as ``other`` only under ``_INBOX.<other>``
            *(user_inboxes(other) for other in others),
            names.events_all,
            f"{p}.runs.>",
            names.outputs_all,
        )
        return Permissions(tuple(publish), tuple(_never(names)), subscribe)
    if role == "watchdog":
        publish = [names.wake("*"), names.wake("*", "*"), names.watch("*"), *_reading(names)]
        publish += _retention(names)
        publish += _snapshot_reading(names)
        purge_events = f"$JS.API.STREAM.PURGE.{names.events_stream}"
        deny = [d for d in _never(names) if d != purge_events]  # retention purges ended runs
        return Permissions(tuple(publish), tuple(deny), (own_inboxes,))
    if role == "worker":
        streams = _streams(names)
        publish = [
            names.events_all,
            *names.wake_subjects,
            names.leases_all,
            names.workers_all,
            names.wedge("*"),
            names.dlq_all,
            names.agent("*"),
            # agents' holds and the runs they hold (an operator's pause --agent)
            names.hold("*"),
            names.held("*", "*"),
            names.limit("*"),  # shared rate limits' records (compare-and-set)
            names.values_all,  # large values' pieces (written once, by digest)
            # schedules' records and next fires (never a fire: only the broker stores those)
            names.schedule_record("*"),
            names.schedule_timer("*"),
            # keyed starts' records and debounce bursts' next fires (decision 0047)
            *(f"{names.prefix}.schedule.flow.{k}.*.*" for k in ("single", "burst", "timer")),
            # concurrency keys' slots records and queue entries (decision 0048)
            f"{names.prefix}.schedule.flow.slots.*.*",
            f"{names.prefix}.schedule.flow.queue.*.*.*",
            # child runs, the cancel cascade and child runs' end notices, in its own name
            names.start("*", user),
            names.start("*", user, "*"),
            *(names.spawn("*", user, p) for p in PRIORITIES),  # on the parent's lane
            names.cancel("*", user),
            names.child_end("*", "*", user),
            # the intake's notice that a cancel is recorded (read by every worker)
            names.interrupt("*"),
            # asking whether another worker's connection is still there (a core request)
            names.presence_all,
            # signals that reached a run as it continued as new, passed on to the next run
            names.signal("*", ">", user),
            # the read side: a projector runs with the worker role; steps write output
            names.run_keys_all,
            names.changes_all,
            names.outputs_all,
            names.leader("*"),
            any_inbox,  # the intake's and the listing service's answers, to anyone
            "$JS.API.INFO",
            *(f"$JS.API.STREAM.INFO.{s}" for s in streams),
            # A fresh deployment: the first worker creates the streams. No worker updates
            # one: what exists is an operator's (`sojourn topology --apply` is an admin's).
            *(f"$JS.API.STREAM.CREATE.{s}" for s in streams),
            # Timers (a run's, a schedule's next fire) are purged by subject filter, and so are
            # deleted schedules; no other stream is ever purged.
            f"$JS.API.STREAM.PURGE.{names.wake_stream}",
            f"$JS.API.STREAM.PURGE.{names.schedules_stream}",
            *(d for s in streams for d in _direct_get(s)),
            *_snapshot_writing(names),
        ]
        # The intake's consumers (a lane each); on the wake stream the unrouted wakes'
        # (``workers``) and one per agent and lane (``wake-<agent>``, ``wakep1-<agent>``, for
        # whatever agents a worker serves): any name there.
        for stream, consumer in (
            *((names.inbox_stream, names.intake_lane_consumer(p)) for p in PRIORITIES),
            (names.wake_stream, "*"),
            (names.schedules_stream, "*"),  # fire-<agent>
        ):
            publish += [
                # info first: an existing consumer is compared, never rewritten on start
                f"$JS.API.CONSUMER.INFO.{stream}.{consumer}",
                f"$JS.API.CONSUMER.CREATE.{stream}.{consumer}",
                f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}",
                f"$JS.ACK.{stream}.{consumer}.>",
            ]
        publish += [d for s in _read_side(names) for d in _following(s)]
        # The listing service listens on its subject (the replies go to the asker's inbox);
        # a projector takes appends on the event subjects as hints to read at once; every
        # worker hears the intake's interrupt notices.
        subscribe = (
            own_inboxes,
            names.query_runs,
            names.events_all,
            names.interrupts_all,
            names.presence_all,  # a worker answers on its own (``Names.presence``)
            names.holds_all,  # agents' holds, as they are recorded
            names.limits_all,  # shared rate limits, as they are written (blocks, rates)
        )
        return Permissions(tuple(publish), tuple(_never(names)), subscribe)
    raise ValueError(f"unknown role {role!r}")


def _q(value: str) -> str:
    # JSON strings are nats-server config strings; quoting keeps `$JS...` from being read as a
    # variable reference and wildcards from being read as anything but text.
    return json.dumps(value, ensure_ascii=False)


def _password(value: str) -> str:
    if _ENV_REF.fullmatch(value):
        return value  # unquoted: the server resolves the variable when it reads the config
    return _q(value)


def _subjects(key: str, subjects: Sequence[str], indent: str) -> list[str]:
    lines = [f"{indent}{key}: ["]
    lines += [f"{indent}  {_q(s)}" for s in subjects]
    lines.append(f"{indent}]")
    return lines


def render_accounts(
    prefix: str, users: Sequence[AuthUser], *, account: str = ACCOUNT, indent: str = ""
) -> str:
    """An ``accounts { <account> { jetstream: enabled, users: [...] } }`` block for nats-server,
    each user with its role's permissions (``permissions_for``) under ``prefix`` (or the user's
    own ``prefix``).

    With accounts configured, a connection without valid credentials is refused
    ('Authorization Violation').

    Raises:
        InvalidName: the prefix or a user name is not valid.
        ValueError: no users, or two users share a name.
    """
    names = Names(prefix)
    validate_token(account, "account name")
    if not users:
        raise ValueError("render_accounts needs at least one user")
    seen: set[str] = set()
    for u in users:
        if u.name in seen:
            raise ValueError(f"two users are named {u.name!r}")
        seen.add(u.name)
    for u in users:
        # A name is one identity: a gateway speaking for a user of its own would make that
        # user's messages and the gateway's caller's indistinguishable in the history.
        own = u.prefix or prefix
        clash = [
            n
            for n in u.speaks_for
            if any(v.name == n and (v.prefix or prefix) == own for v in users)
        ]
        if clash:
            raise ValueError(
                f"user {u.name!r} may not speak for {clash[0]!r}: that is a user of its own"
            )
    i1, i2, i3, i4, i5, i6 = (indent + "  " * n for n in range(1, 7))
    out = [
        f"{indent}# Users of the sojourn deployment with prefix {prefix!r}, generated by",
        f"{indent}# sojourn.broker.auth; the roles: docs/operations.md, Security.",
        f"{indent}accounts {{",
        f"{i1}{account} {{",
        f"{i2}jetstream: enabled",
        f"{i2}users: [",
    ]
    for u in users:
        perms = permissions_for(
            Names(u.prefix) if u.prefix else names, u.name, u.role, speaks_for=u.speaks_for
        )
        out += [
            f"{i3}{{",
            f"{i4}# role: {u.role}"
            + (f", prefix {u.prefix!r}" if u.prefix else "")
            + (f", speaks for {', '.join(u.speaks_for)}" if u.speaks_for else ""),
            f"{i4}user: {_q(u.name)}",
            f"{i4}password: {_password(u.password)}",
        ]
        if perms is not None:
            out += [f"{i4}permissions: {{", f"{i5}publish: {{"]
            out += _subjects("allow", perms.publish_allow, i6)
            out += _subjects("deny", perms.publish_deny, i6)
            out += [f"{i5}}}", f"{i5}subscribe: {{"]
            out += _subjects("allow", perms.subscribe_allow, i6)
            out += [f"{i5}}}", f"{i4}}}"]
        out.append(f"{i3}}}")
    out += [f"{i2}]", f"{i1}}}", f"{indent}}}", ""]
    return "\n".join(out)


def password_env_var(user: str) -> str:
    """The environment variable the deploy config reads ``user``'s password from:
    ``SOJOURN_<USER>_PASSWORD`` (upper-cased, ``-`` as ``_``)."""
    return f"SOJOURN_{validate_token(user, 'user name').upper().replace('-', '_')}_PASSWORD"


def default_users(
    specs: Sequence[tuple[str, Role]] | None = None,
    speaks_for: Mapping[str, Sequence[str]] | None = None,
) -> list[AuthUser]:
    """Users whose passwords are environment variable references (``password_env_var``);
    by default one per role, named after it. ``speaks_for``: by user name, the other names
    that (client) user may send as (``AuthUser.speaks_for``).

    Raises:
        ValueError: ``speaks_for`` names a user that is not among them, or one not a client.
    """
    pairs = list(specs) if specs is not None else [(r, r) for r in ROLES]
    extra = dict(speaks_for or {})
    unknown = sorted(set(extra) - {name for name, _ in pairs})
    if unknown:
        raise ValueError(f"--speaks-for names {unknown[0]!r}, which is not one of the users")
    return [
        AuthUser(name, "$" + password_env_var(name), role, speaks_for=tuple(extra.get(name, ())))
        for name, role in pairs
    ]


def _user_spec(text: str) -> tuple[str, Role]:
    name, _, role = text.partition(":")
    for r in ROLES:
        if role == r:
            return validate_token(name, "user name"), r
    raise argparse.ArgumentTypeError(f"{text!r}: use NAME:ROLE, ROLE one of {', '.join(ROLES)}")


def _speaks_for_spec(text: str) -> tuple[str, tuple[str, ...]]:
    user, sep, rest = text.partition("=")
    names = tuple(n.strip() for n in rest.split(",") if n.strip())
    if not sep or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: use USER=NAME[,NAME...]")
    try:
        return validate_token(user, "user name"), tuple(
            validate_token(n, "name to speak for") for n in names
        )
    except InvalidName as e:
        raise argparse.ArgumentTypeError(e.message) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Print the accounts block for a prefix (``python -m sojourn.broker.auth --help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m sojourn.broker.auth",
        description="Print a nats-server accounts block with least-privilege sojourn users "
        "whose passwords come from $SOJOURN_<USER>_PASSWORD.",
    )
    parser.add_argument("--prefix", default="sojourn", help="deployment prefix (default: sojourn)")
    parser.add_argument(
        "--user",
        action="append",
        type=_user_spec,
        metavar="NAME:ROLE",
        help="a user (repeat; default: client, worker, watchdog and admin, one per role)",
    )
    parser.add_argument(
        "--speaks-for",
        action="append",
        type=_speaks_for_spec,
        default=[],
        metavar="USER=NAME[,NAME...]",
        help="names the client USER may also send as: an HTTP gateway's callers, the NAMEs "
        "of its tokens file (repeat; docs/gateway.md)",
    )
    args = parser.parse_args(argv)
    speaks_for: dict[str, list[str]] = {}
    for user, names in args.speaks_for:
        speaks_for.setdefault(user, []).extend(names)
    try:
        text = render_accounts(args.prefix, default_users(args.user, speaks_for))
    except ValueError as e:  # InvalidName is one
        parser.error(str(e))
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
