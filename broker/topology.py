"""Creating sojourn's streams and durable consumers, idempotently, and reporting how existing
ones differ from sojourn's config.

Called by every worker at start-up and by the client before its first publish, so a fresh
server needs no manual setup. See docs/design.md and docs/wire.md.

What exists is read, never rewritten on start: an operator may have tuned it (replicas,
retention of disposable data). A difference in a tunable key is logged; one in a key sojourn
relies on stops the start with the command that fixes it (``sojourn.broker.drift`` says which
keys are which and why). Users with least privilege (docs/operations.md, "Security") so start
against streams an admin or the first worker created. ``sojourn topology`` reports, and
``sojourn topology --apply`` (an admin) brings everything to sojourn's config.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from sojourn.schemas.config import Settings
from sojourn.schemas.errors import BrokerUnavailable, PermissionDenied, SojournError
from sojourn.schemas.priority import PRIORITIES, PRIORITY_DEFAULT, Priority

from .connection import Broker, JetStreamError
from .drift import Finding, KeyDiff, consumer_finding, reconciled, stream_finding
from .names import Names

__all__ = [
    "SETTLE_FOR",
    "TopologyMismatch",
    "agent_wake_consumer_config",
    "apply_topology",
    "check",
    "consumer_configs",
    "ensure_topology",
    "fire_consumer_config",
    "fix_command",
    "inspect_topology",
    "mismatch",
    "optional_keys",
    "retry_unsettled",
    "stream_configs",
]

log = logging.getLogger("sojourn.broker")

SETTLE_FOR = 30.0
"""Seconds ``ensure_topology`` keeps retrying what a cluster cannot answer yet: a stream whose
leader died answers nothing until the survivors elect one (4-9 s), and a cluster that is still
forming (every node up, but the meta leader not yet sure of every peer) refuses to place a
replicated stream ("no suitable peers for placement, peer offline")."""

_NO_PEERS = 10005
"""JetStream's ``JSClusterNoPeersErr``: not enough peers it believes online to place a stream."""

_T = TypeVar("_T")

_NS = 1_000_000_000
_DAY = 86_400


def optional_keys(names: Names, stream: str) -> frozenset[str]:
    """Keys of ``stream``'s config that sojourn can do without on a stream that exists: the
    events stream's ``allow_atomic`` (an events stream created before group commit works, its
    appends go one by one; ``sojourn topology --apply`` turns it on)."""
    return frozenset({"allow_atomic"}) if stream == names.events_stream else frozenset()


def stream_configs(names: Names, settings: Settings) -> list[dict[str, Any]]:
    """The stream configs of a deployment (JetStream API JSON)."""
    dedup = int(settings.dedup_window * _NS)
    return [
        {  # the source of truth: one subject per run, never deleted. Purgeable only so that
            # retention can remove ended runs (by subject); only the watchdog role may purge it,
            # and JetStream cannot lift deny_purge from an existing stream.
            "name": names.events_stream,
            "subjects": [names.events_all],
            "retention": "limits",
            "storage": "file",
            "discard": "old",
            "max_msgs": -1,
            "max_bytes": -1,
            "max_age": 0,
            "deny_delete": True,
            "deny_purge": False,
            "allow_direct": True,
            "allow_atomic": True,  # group commit (broker/commits.py); optional, see below
            "duplicate_window": dedup,
            "num_replicas": settings.replicas,
        },
        {  # what the outside world publishes; the publish ack is the durable receipt
            "name": names.inbox_stream,
            "subjects": names.inbox_subjects,
            "retention": "workqueue",
            "storage": "file",
            "discard": "old",
            "max_age": 0,
            # A stored start not yet taken is a pending run: found by run id with a direct get.
            "allow_direct": True,
            "duplicate_window": dedup,
            "num_replicas": settings.replicas,
        },
        {  # "this run has something to do"; timers are schedules that target wake subjects
            "name": names.wake_stream,
            "subjects": names.wake_subjects,
            "retention": "limits",
            "storage": "file",
            "max_msgs_per_subject": 1,
            "allow_msg_schedules": True,
            "allow_msg_ttl": True,
            "allow_rollup_hdrs": True,
            "allow_direct": True,
            "duplicate_window": dedup,
            "num_replicas": settings.replicas,
        },
        {  # every rejected inbound message, verbatim, with the reason
            "name": names.dlq_stream,
            "subjects": [names.dlq_all],
            "retention": "limits",
            "storage": "file",
            "max_age": 30 * _DAY * _NS,
            "allow_direct": True,
            "num_replicas": settings.replicas,
        },
        {  # one lease message per run; CAS on the subject sequence decides ownership
            "name": names.leases_stream,
            "subjects": [names.leases_all],
            "retention": "limits",
            "storage": "file",
            "max_msgs_per_subject": 1,
            "max_age": _DAY * _NS,
            "allow_direct": True,
            "num_replicas": settings.replicas,
        },
        {  # worker heartbeats, watchdog action claims, wedged runs: one message per subject.
            # No max age: a wedge record must outlive any outage; heartbeats and claims carry
            # their own Nats-TTL, so the subjects of workers long gone do not pile up.
            "name": names.health_stream,
            "subjects": [
                names.workers_all,
                f"{names.prefix}.watch.*",
                f"{names.prefix}.wedge.*",
                names.leader("*"),
            ],
            "retention": "limits",
            "storage": "file",
            "max_msgs_per_subject": 1,
            "max_age": 0,
            "allow_msg_ttl": True,
            "allow_direct": True,
            "num_replicas": settings.replicas,
        },
        {  # the runs KV bucket: one view per run, laid out as NATS KV clients expect
            "name": names.runs_kv_stream,
            "subjects": [names.run_keys_all],
            "retention": "limits",
            "storage": "file",
            "discard": "new",
            "max_msgs_per_subject": 1,
            "max_age": 0,
            "allow_rollup_hdrs": True,
            "deny_delete": True,
            "allow_direct": True,
            "allow_atomic": True,  # the projector writes views in batches
            "duplicate_window": dedup,
            "num_replicas": settings.replicas,
        },
        {  # every view written, on <prefix>.runs.<agent>.<run_id>: run timelines and watches
            "name": names.changes_stream,
            "subjects": [names.changes_all],
            "retention": "limits",
            "storage": "file",
            "discard": "old",
            "max_age": int(settings.changes_max_age * _NS),
            "allow_direct": True,
            "allow_atomic": True,
            "duplicate_window": dedup,
            "num_replicas": settings.replicas,
        },
        {  # runs' output chunks (ctx.stream, ctx.progress): resumable by stream sequence
            "name": names.output_stream,
            "subjects": [names.outputs_all],
            "retention": "limits",
            "storage": "file",
            "discard": "old",
            "max_age": int(settings.output_max_age * _NS),
            "allow_direct": True,
            "duplicate_window": dedup,
            "num_replicas": settings.replicas,
        },
        {  # large values' pieces, content-addressed: one message per piece, written once
            # (create-only on its subject), shared by every value and run that holds it. Kept
            # forever like histories: retention does not know which pieces a run still shares.
            "name": names.values_stream,
            "subjects": [names.values_all],
            "retention": "limits",
            "storage": "file",
            "discard": "new",
            "max_msgs_per_subject": 1,
            "max_age": 0,
            "allow_direct": True,
            "duplicate_window": dedup,
            "num_replicas": settings.replicas,
        },
        {  # schedules: each one's record (rewritten by CAS), its next fire (a one-shot message
            # schedule, which needs limits retention: a work queue could remove it), and its
            # fired message, which the agent's fire consumer takes
            "name": names.schedules_stream,
            "subjects": [names.schedules_all],
            "retention": "limits",
            "storage": "file",
            "discard": "old",
            "max_msgs_per_subject": 1,
            "max_age": 0,
            "allow_msg_schedules": True,
            "allow_rollup_hdrs": True,
            "allow_direct": True,
            "duplicate_window": dedup,
            "num_replicas": settings.replicas,
        },
        {  # agents any worker has ever served (what "unknown agent" means)
            "name": names.agents_stream,
            # and their holds (an operator's pause of every run of an agent) and held runs, and
            # the shared rate limits' records
            "subjects": [
                f"{names.prefix}.agent.*",
                names.holds_all,
                names.held("*", "*"),
                names.limits_all,
            ],
            "retention": "limits",
            "storage": "file",
            "max_msgs_per_subject": 1,
            "allow_msg_ttl": True,  # a resumed held run's last record expires
            "allow_direct": True,
            "num_replicas": settings.replicas,
        },
    ]


def consumer_configs(names: Names, settings: Settings) -> list[tuple[str, dict[str, Any]]]:
    """The inbox's consumers, one a lane (decision 0049: ``intake`` takes priority 3's starts
    and every other message, ``intake-p<n>`` the starts and spawns of priority n), and the
    unrouted wakes' consumer. The inbox is a work queue: the lanes' filters never overlap."""
    ack_wait = int(max(settings.lease_ttl, 1.0) * _NS)
    lanes = [
        (names.intake_lane_consumer(p), names.default_lane_subjects if p == 3 else None, p)
        for p in PRIORITIES
    ]
    return [
        *(
            (
                names.inbox_stream,
                {
                    "durable_name": durable,
                    "filter_subjects": subjects or names.lane_subjects(p),
                    "ack_policy": "explicit",
                    "deliver_policy": "all",
                    # Like a wake, a trigger whose run is executing at once is kept alive by the
                    # worker's keepalive; if the worker dies it comes back after one lease
                    # period.
                    "ack_wait": ack_wait,
                    "max_deliver": -1,
                    "max_ack_pending": 10_000,
                },
            )
            for durable, subjects, p in lanes
        ),
        (names.wake_stream, _wake_consumer(names.wake_consumer, names.unrouted_wakes, ack_wait)),
    ]


def agent_wake_consumer_config(
    names: Names, settings: Settings, agent: str, priority: Priority = PRIORITY_DEFAULT
) -> dict[str, Any]:
    """The durable consumer of ``agent``'s wakes of ``priority`` (``<prefix>.wake.<agent>.*``,
    or ``<prefix>.wake.p<n>.<agent>.*``), created by the first worker that serves the agent and
    shared by all that do: a worker pulls only wakes of runs it can execute, so no wake is
    taken by a worker that must hand it back."""
    ack_wait = int(max(settings.lease_ttl, 1.0) * _NS)
    return _wake_consumer(
        names.agent_wake_consumer(agent, priority), names.agent_wakes(agent, priority), ack_wait
    )


def fire_consumer_config(names: Names, settings: Settings, agent: str) -> dict[str, Any]:
    """The durable consumer of the fires of ``agent``'s schedules, created by the first worker
    that serves the agent and shared by all that do. A fire whose run executes at once is kept
    unacknowledged (alive) until the run rests, like a trigger."""
    ack_wait = int(max(settings.lease_ttl, 1.0) * _NS)
    return _wake_consumer(names.fire_consumer(agent), names.schedule_fires(agent), ack_wait)


def _wake_consumer(durable: str, filter_subject: str, ack_wait: int) -> dict[str, Any]:
    return {
        "durable_name": durable,
        "filter_subject": filter_subject,
        "ack_policy": "explicit",
        "deliver_policy": "all",
        "ack_wait": ack_wait,
        "max_deliver": -1,
        "max_ack_pending": 100_000,
    }


class TopologyMismatch(SojournError):
    """Streams or durable consumers exist with a config that differs from sojourn's in keys it
    relies on (``sojourn.broker.drift``). sojourn leaves them alone and refuses to start: an
    admin fixes them (``sojourn topology --apply``).

    Attributes:
        findings: the incompatible streams and consumers, with the keys that differ.
    """

    def __init__(self, message: str, findings: Sequence[Finding]) -> None:
        super().__init__(message)
        self.findings = tuple(findings)


def fix_command(names: Names) -> str:
    """The command that brings a deployment's streams and consumers to sojourn's config."""
    prefix = "" if names.prefix == "sojourn" else f" --prefix {names.prefix}"
    return f"sojourn topology --apply{prefix}"


def _values(diffs: Sequence[KeyDiff]) -> str:
    return "; ".join(f"{d.key}: sojourn's {d.ours!r}, the server's {d.theirs!r}" for d in diffs)


def mismatch(names: Names, findings: Sequence[Finding]) -> TopologyMismatch:
    """The error for incompatible ``findings``: each stream or consumer, its keys, both
    values, and the command that fixes them."""
    parts = [f"{f.what} ({_values(f.relied)})" for f in findings]
    return TopologyMismatch(
        "refusing to start: "
        + "; and ".join(parts)
        + f" differ{'s' if len(parts) == 1 else ''} from sojourn's config in keys it relies on, "
        "and sojourn does not rewrite what an operator changed. See `sojourn topology`; fix "
        f"with `{fix_command(names)}` (admin credentials)",
        findings,
    )


_reported: set[tuple[str, str | None, tuple[KeyDiff, ...]]] = set()
"""Tunable drift already logged by this process (once is enough: it is not a problem)."""


def _report_drift(names: Names, finding: Finding) -> None:
    key = (finding.stream, finding.consumer, finding.diffs)
    if key in _reported:
        return
    _reported.add(key)
    log.info(
        "%s differs from this sojourn's config in tunable keys, left as they are (%s); "
        "`%s` keeps them too, see `sojourn topology`",
        finding.what,
        _values(finding.diffs),
        fix_command(names),
    )


async def ensure_topology(
    broker: Broker,
    names: Names,
    settings: Settings,
    *,
    consumers: bool = True,
    settle_for: float = SETTLE_FOR,
) -> list[Finding]:
    """Create the streams that are missing (and, with ``consumers``, the workers' durable
    consumers); never change one that exists. One that differs from sojourn's config only in
    tunable keys (replicas, retention of disposable data, ...) is left as it is, logged once
    at INFO; one that differs in a key sojourn relies on fails the start.

    Bringing existing streams to this config is ``sojourn topology --apply``'s job, done on
    purpose by an admin (it used to happen on every start, undoing operators' tuning).

    A cluster between states (a leader election, nodes still meeting each other) is waited
    for, at most ``settle_for`` seconds (``SETTLE_FOR``).

    Returns:
        What was found for every stream and consumer.

    Raises:
        BrokerUnavailable: JetStream did not answer for ``settle_for`` seconds.
        JetStreamError: JetStream refused a stream or consumer (for ``settle_for`` seconds, if
            it was for want of peers).
        TopologyMismatch: a stream or consumer differs in a key sojourn relies on; the
            message names them, the keys, both values and the command that fixes them.
        PermissionDenied: a stream is missing and this user may not create it, or may not even
            read it (credentials made for another prefix); the message says which and what to do.
    """
    who = f"user '{broker.user}'" if broker.user else "this connection"
    found: list[Finding] = []
    for cfg in stream_configs(names, settings):
        name = cfg["name"]
        try:
            ensure = functools.partial(broker.ensure_stream, cfg, optional_keys(names, name))
            found.append(await retry_unsettled(ensure, settle_for))
        except PermissionDenied as e:
            if ".STREAM.INFO." in e.subject:
                raise PermissionDenied(
                    f"{who} may not read stream {name}: are its credentials for prefix "
                    f"'{names.prefix}'? (check --prefix)",
                    subject=e.subject,
                ) from None
            raise PermissionDenied(
                f"stream {name} does not exist and {who} may not create it: start a "
                f"worker for prefix '{names.prefix}' first (workers and admins create the "
                "streams)",
                subject=e.subject,
            ) from None
    if consumers:
        for stream, ccfg in consumer_configs(names, settings):
            found.append(
                await retry_unsettled(
                    functools.partial(broker.ensure_consumer, stream, ccfg), settle_for
                )
            )
    check(names, found)
    return found


def _unsettled(e: BaseException) -> bool:
    """Whether ``e`` says the cluster is between states (electing, forming), not no."""
    if isinstance(e, BrokerUnavailable):
        return True
    return isinstance(e, JetStreamError) and (e.code == 503 or e.err_code == _NO_PEERS)


async def retry_unsettled(call: Callable[[], Awaitable[_T]], settle_for: float = SETTLE_FOR) -> _T:
    """``call()`` (idempotent), retried for ``settle_for`` seconds while the cluster is between
    states, instead of a start-up that crash-loops through a leader election or a cluster that
    is still forming; any other error at once."""
    deadline = time.monotonic() + settle_for
    while True:
        try:
            return await call()
        except (BrokerUnavailable, JetStreamError) as e:
            if not _unsettled(e) or time.monotonic() > deadline:
                raise
            log.warning("topology: %s; retrying (a cluster electing or forming?)", e)
            await asyncio.sleep(0.5)


def check(names: Names, found: Sequence[Finding]) -> None:
    """Log tunable drift once; raise ``TopologyMismatch`` for what sojourn cannot work with.

    For callers that ensure a consumer of their own (``Broker.ensure_consumer``) too."""
    for f in found:
        if f.state == "drift":
            _report_drift(names, f)
    bad = [f for f in found if f.state == "incompatible"]
    if bad:
        raise mismatch(names, bad)


async def inspect_topology(
    broker: Broker,
    names: Names,
    settings: Settings,
    consumers: Sequence[tuple[str, dict[str, Any]]] = (),
) -> list[Finding]:
    """Every stream and durable consumer of the deployment compared with sojourn's config,
    changing nothing (``sojourn topology``). ``consumers`` adds durable consumers to the
    ones ``consumer_configs`` names (e.g. per-agent ones)."""
    found: list[Finding] = []
    for cfg in stream_configs(names, settings):
        optional = optional_keys(names, cfg["name"])
        found.append(stream_finding(cfg, await broker.stream_config(cfg["name"]), optional))
    for stream, ccfg in [*consumer_configs(names, settings), *consumers]:
        live = await broker.consumer_config(stream, ccfg["durable_name"])
        found.append(consumer_finding(stream, ccfg, live))
    return found


async def apply_topology(
    broker: Broker,
    names: Names,
    settings: Settings,
    *,
    replicas: int | None = None,
    consumers: Sequence[tuple[str, dict[str, Any]]] = (),
) -> list[Finding]:
    """Bring the deployment to sojourn's config (``sojourn topology --apply``, admin): create
    what is missing, set every key sojourn relies on, keep the tunable keys an operator
    changed; with ``replicas``, set every stream's replica count to it too.

    Returns:
        What was found before anything was changed (``inspect_topology``).

    Raises:
        JetStreamError: the server refused a change (some keys, such as ``storage``, cannot be
            changed on a live stream: the message says which).
    """
    before = await inspect_topology(broker, names, settings, consumers)
    ours_streams = {c["name"]: c for c in stream_configs(names, settings)}
    ours_consumers = {
        (s, c["durable_name"]): c for s, c in [*consumer_configs(names, settings), *consumers]
    }
    for f in before:
        if f.consumer is None:
            ours = ours_streams[f.stream]
            live = await broker.stream_config(f.stream)
            if live is None:
                await broker.ensure_stream(ours)
                continue
            want = reconciled(ours, live, f.diffs)
            if replicas is not None:
                want["num_replicas"] = replicas
            if want != live:
                await broker.api(f"$JS.API.STREAM.UPDATE.{f.stream}", want)
        else:
            ccfg = ours_consumers[(f.stream, f.consumer)]
            clive = await broker.consumer_config(f.stream, f.consumer)
            if clive is None:
                await broker.ensure_consumer(f.stream, ccfg)
                continue
            cwant = reconciled(ccfg, clive, f.diffs)
            if cwant != clive:
                await broker.api(
                    f"$JS.API.CONSUMER.CREATE.{f.stream}.{f.consumer}",
                    {"stream_name": f.stream, "config": cwant, "action": "update"},
                )
    return before
