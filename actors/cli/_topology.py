"""``sojourn topology``: how the deployment's streams and durable consumers compare with
sojourn's config, and (``--apply``, an admin) bringing them to it.

Workers and clients create what is missing and never rewrite what exists (an operator may have
tuned it); this command is where a deliberate rewrite happens, and where an operator sees why a
worker refused to start.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from sojourn.broker.connection import Broker
from sojourn.broker.drift import Finding
from sojourn.broker.names import Names
from sojourn.broker.registry import AgentRegistry
from sojourn.broker.topology import (
    agent_wake_consumer_config,
    apply_topology,
    fire_consumer_config,
    fix_command,
    inspect_topology,
)
from sojourn.schemas.names import validate_token
from sojourn.schemas.priority import PRIORITIES

from ._args import Command, add_json, add_seconds
from ._common import EXIT_ERROR, EXIT_OK, UsageError, bounded, options_from, settings_from
from ._render import out

__all__ = ["COMMANDS", "cmd_topology", "topology_lines"]

_BAD = ("missing", "incompatible")


def _value(v: Any) -> str:
    return json.dumps(v, sort_keys=True)


def topology_lines(found: Sequence[Finding]) -> list[str]:
    """One line per stream and consumer (``STATE  WHAT``), then one per differing key."""
    lines = []
    for f in found:
        lines.append(f"{f.state:<12}  {f.what}")
        for d in f.diffs:
            why = "relied on" if d.relied else "tunable"
            lines.append(
                f"{'':<12}    {d.key}: sojourn {_value(d.ours)}, server {_value(d.theirs)} ({why})"
            )
    return lines


def _summary(found: Sequence[Finding]) -> str:
    counts: dict[str, int] = {}
    for f in found:
        counts[f.state] = counts.get(f.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


async def cmd_topology(args: argparse.Namespace) -> int:
    try:
        settings = settings_from(args, lease_ttl=args.lease_ttl)
        agents = [validate_token(a, "agent") for a in args.agents]
    except ValueError as e:
        raise UsageError(str(e)) from None
    names = Names(settings.prefix)
    opts = options_from(args)
    broker = await bounded(Broker.connect(opts, name="sojourn-cli topology", reconnect=False), opts)
    try:
        if not agents:  # every agent a worker registered: their wake and fire consumers too
            agents = await AgentRegistry(broker, names).known()
        extra = [
            (names.wake_stream, agent_wake_consumer_config(names, settings, a, p))
            for a in agents
            for p in PRIORITIES
        ] + [(names.schedules_stream, fire_consumer_config(names, settings, a)) for a in agents]
        if args.apply:
            before = await apply_topology(
                broker, names, settings, replicas=args.replicas, consumers=extra
            )
            changed = [f for f in before if f.state != "ok"]
            if not args.json:
                for f in changed:
                    out(f"applied       {f.what} (was {f.state})")
        found = await inspect_topology(broker, names, settings, extra)
    finally:
        await broker.close()
    fine = not any(f.state in _BAD for f in found)
    if args.json:
        out(
            json.dumps(
                {
                    "prefix": settings.prefix,
                    "ok": fine,
                    "findings": [f.to_json() for f in found],
                },
                sort_keys=True,
            )
        )
        return EXIT_OK if fine else EXIT_ERROR
    for line in topology_lines(found):
        out(line)
    out(_summary(found))
    if not fine:
        out(f"fix with: {fix_command(names)} (admin credentials)")
    return EXIT_OK if fine else EXIT_ERROR


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--apply", action="store_true", help="create what is missing, fix what is incompatible"
    )
    add_json(p, "print one JSON object")
    add_seconds(
        p,
        "--lease-ttl",
        "the workers' --lease-ttl, which the consumers' ack_wait follows (default: 30)",
        default=30.0,
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


COMMANDS = (
    Command(
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
        arguments=_arguments,
    ),
)
