"""A worker's pull consumers, one per priority lane (decision 0049).

The inbox has a consumer per priority: ``intake`` (priority 3's starts and every message that
is not a start) and ``intake-p<n>`` (the starts and spawns of priority n). Each agent's wakes
have one per priority too (``wake-<agent>``, ``wakep<n>-<agent>``), and its schedules' fires one.
A worker pulls each in a loop of its own; the loops wait for an execution slot in priority
order (``SlotGate``), so the most urgent lane with work takes the next free slot. The laned
loops poll less often (``LANE_POLL``): a message that arrives is delivered at once to the
pull request waiting for it, so a longer poll costs no latency, only fewer idle requests.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field

from sojourn.broker.connection import Broker, PullConsumer
from sojourn.broker.names import Names
from sojourn.broker.topology import (
    agent_wake_consumer_config,
    check,
    fire_consumer_config,
    retry_unsettled,
)
from sojourn.schemas.config import Settings
from sojourn.schemas.priority import PRIORITIES, PRIORITY_DEFAULT, Priority

from .faults import pause

__all__ = ["LANE_POLL", "Lane", "Lanes", "open_lanes"]

LANE_POLL = 5.0
"""Seconds a laned loop's pull request waits before it is made again (the default lane's
loops: 1 s)."""


@dataclass(frozen=True, slots=True)
class Lane:
    """One pull consumer a worker takes from, and the priority of what it holds."""

    consumer: str
    sub: PullConsumer
    priority: Priority

    @property
    def poll(self) -> float:
        return 1.0 if self.priority == PRIORITY_DEFAULT else LANE_POLL


@dataclass(slots=True)
class Lanes:
    """What a worker pulls: the inbox's lanes, the wake consumers' lanes (the unrouted one and
    each agent's), and each agent's fires."""

    intake: list[Lane] = field(default_factory=list)
    wakes: list[Lane] = field(default_factory=list)
    fires: dict[str, PullConsumer] = field(default_factory=dict)


async def open_lanes(b: Broker, names: Names, settings: Settings, agents: Iterable[str]) -> Lanes:
    """Bind the inbox's lanes (made by ``ensure_topology``) and make and bind each agent's wake
    lanes and fire consumer (the first worker serving an agent makes them)."""
    lanes = Lanes()
    for p in PRIORITIES:
        consumer = names.intake_lane_consumer(p)
        lanes.intake.append(Lane(consumer, await b.pull(names.inbox_stream, consumer), p))
    unrouted = names.wake_consumer
    lanes.wakes.append(Lane(unrouted, await b.pull(names.wake_stream, unrouted), PRIORITY_DEFAULT))
    pause("agent_consumers")
    for name in sorted(agents):
        for p in PRIORITIES:
            config = agent_wake_consumer_config(names, settings, name, p)
            ensure = functools.partial(b.ensure_consumer, names.wake_stream, config)
            check(names, [await retry_unsettled(ensure)])
            consumer = config["durable_name"]
            lanes.wakes.append(Lane(consumer, await b.pull(names.wake_stream, consumer), p))
    for name in sorted(agents):
        config = fire_consumer_config(names, settings, name)
        ensure = functools.partial(b.ensure_consumer, names.schedules_stream, config)
        check(names, [await retry_unsettled(ensure)])
        lanes.fires[name] = await b.pull(names.schedules_stream, config["durable_name"])
    return lanes
