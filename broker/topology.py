"""Creating sojourn's streams and durable consumers, idempotently.

Called by every worker at start-up and by the client before its first publish, so a fresh
server needs no manual setup. See docs/design.md and docs/wire.md.

Streams are looked at before anything is written: one that exists with sojourn's config is left
alone, so users with least privilege (docs/operations.md, "Security") start against streams an
admin or the first worker created.
"""

from __future__ import annotations

import logging
from typing import Any

from sojourn.schemas.config import Settings
from sojourn.schemas.errors import PermissionDenied

from .connection import Broker
from .names import Names

__all__ = ["ensure_topology", "stream_configs"]

log = logging.getLogger("sojourn.broker")

_NS = 1_000_000_000
_DAY = 86_400


def stream_configs(names: Names, settings: Settings) -> list[dict[str, Any]]:
    """The stream configs of a deployment (JetStream API JSON)."""
    dedup = int(settings.dedup_window * _NS)
    return [
        {  # the source of truth: one subject per run, never deleted, never purged
            "name": names.events_stream,
            "subjects": [names.events_all],
            "retention": "limits",
            "storage": "file",
            "discard": "old",
            "max_msgs": -1,
            "max_bytes": -1,
            "max_age": 0,
            "deny_delete": True,
            "deny_purge": True,
            "allow_direct": True,
            "duplicate_window": dedup,
            "num_replicas": 1,
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
            "num_replicas": 1,
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
            "num_replicas": 1,
        },
        {  # every rejected inbound message, verbatim, with the reason
            "name": names.dlq_stream,
            "subjects": [names.dlq_all],
            "retention": "limits",
            "storage": "file",
            "max_age": 30 * _DAY * _NS,
            "allow_direct": True,
            "num_replicas": 1,
        },
        {  # one lease message per run; CAS on the subject sequence decides ownership
            "name": names.leases_stream,
            "subjects": [names.leases_all],
            "retention": "limits",
            "storage": "file",
            "max_msgs_per_subject": 1,
            "max_age": _DAY * _NS,
            "allow_direct": True,
            "num_replicas": 1,
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
            "num_replicas": 1,
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
            "num_replicas": 1,
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
            "num_replicas": 1,
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
            "num_replicas": 1,
        },
        {  # agents any worker has ever served (what "unknown agent" means)
            "name": names.agents_stream,
            "subjects": [f"{names.prefix}.agent.*"],
            "retention": "limits",
            "storage": "file",
            "max_msgs_per_subject": 1,
            "allow_direct": True,
            "num_replicas": 1,
        },
    ]


def consumer_configs(names: Names, settings: Settings) -> list[tuple[str, dict[str, Any]]]:
    ack_wait = int(max(settings.lease_ttl, 1.0) * _NS)
    return [
        (
            names.inbox_stream,
            {
                "durable_name": names.intake_consumer,
                "ack_policy": "explicit",
                "deliver_policy": "all",
                # Like a wake, a trigger whose run is executing at once is kept alive by the
                # worker's keepalive; if the worker dies it comes back after one lease period.
                "ack_wait": ack_wait,
                "max_deliver": -1,
                "max_ack_pending": 10_000,
            },
        ),
        (
            names.wake_stream,
            {
                "durable_name": names.wake_consumer,
                "filter_subject": f"{names.prefix}.wake.*",
                "ack_policy": "explicit",
                "deliver_policy": "all",
                "ack_wait": ack_wait,
                "max_deliver": -1,
                "max_ack_pending": 100_000,
            },
        ),
    ]


async def ensure_topology(
    broker: Broker,
    names: Names,
    settings: Settings,
    *,
    consumers: bool = True,
    update: bool = True,
) -> None:
    """Create the streams that are missing (and the workers' durable consumers); with
    ``update``, bring streams that differ from sojourn's config to it.

    A stream that differs and that this user may not update (no worker may update the events
    stream) is left as it is, with a warning: it works, and an admin can update it.

    Raises:
        PermissionDenied: a stream is missing and this user may not create it, or may not even
            read it (credentials made for another prefix); the message says which and what to do.
    """
    who = f"user '{broker.user}'" if broker.user else "this connection"
    for cfg in stream_configs(names, settings):
        name = cfg["name"]
        try:
            await broker.ensure_stream(cfg, update=update)
        except PermissionDenied as e:
            if ".STREAM.INFO." in e.subject:
                raise PermissionDenied(
                    f"{who} may not read stream {name}: are its credentials for prefix "
                    f"'{names.prefix}'? (check --prefix)",
                    subject=e.subject,
                ) from None
            if ".STREAM.CREATE." in e.subject:
                raise PermissionDenied(
                    f"stream {name} does not exist and {who} may not create it: start a "
                    f"worker for prefix '{names.prefix}' first (workers and admins create the "
                    "streams)",
                    subject=e.subject,
                ) from None
            log.warning(
                "stream %s differs from this sojourn's config, and %s may not update it; "
                "it is left as it is (an admin can update it, e.g. by starting a worker with "
                "admin credentials)",
                name,
                who,
            )
    if consumers:
        for stream, ccfg in consumer_configs(names, settings):
            await broker.ensure_consumer(stream, ccfg)
