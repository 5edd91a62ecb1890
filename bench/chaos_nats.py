"""The chaos harness's broker: one nats-server, or a 3-node loopback cluster, and its faults.

``SingleNats`` is an ``EmbeddedServer`` whose fault is ``restart_nats``: SIGKILL the server,
wait 0.1 to 1 s, start it again on the same store and port (everything is down meanwhile).

``ClusterNats`` (``bench.chaos --cluster``) is a ``LocalCluster`` of 3 nodes with R3 streams.
Its faults:

- ``kill_node``: SIGKILL one node, half of the time the leader of the events stream (the node
  every append goes through), otherwise any node; wait 0.2 to 2 s; start it again on its
  store and ports, wait until the cluster is healthy and the node has caught up on every
  stream. One node at a time, never more: with two of three gone there is no quorum, writes
  stop, and that is a stall the harness would time out on, not a violation.
- ``restart_nats``: SIGKILL every node, wait 0.1 to 1 s, start them all again (a whole-cluster
  crash; optional, not among the cluster's default faults).

Both serialise their faults under one lock, and ``heal`` (the end of the fault window) leaves
every node up, the cluster healthy and every stream led.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections import Counter
from pathlib import Path

from sojourn.broker import BROKER_ERRORS, Broker, EmbeddedServer
from sojourn.broker.cluster import LocalCluster

__all__ = ["ClusterNats", "SingleNats"]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class SingleNats:
    """One ``EmbeddedServer`` (temporary store, free port, ``sync_interval: always``)."""

    replicas = 1
    kinds = ("restart_nats",)

    def __init__(self, store: Path) -> None:
        self.server = EmbeddedServer(store_dir=store, port=0)
        self.lock = asyncio.Lock()
        self.down = 0.0
        """Seconds the server was down, in total."""
        self.kills: Counter[str] = Counter()

    @property
    def url(self) -> str:
        return self.server.url

    async def start(self) -> None:
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop()

    async def inject(self, kind: str, rng: random.Random, broker: Broker) -> None:
        """``restart_nats``: SIGKILL the server, then start it again on its store and port."""
        del broker
        assert kind == "restart_nats", kind
        async with self.lock:
            down = rng.uniform(0.1, 1.0)
            t0 = time.monotonic()
            self.server.kill()
            self.kills["server"] += 1
            await asyncio.sleep(down)
            for attempt in range(5):
                try:
                    await self.server.start()
                    break
                except Exception as e:  # the port lingering, a slow recovery: try again
                    _log(f"  nats-server restart attempt {attempt + 1} failed: {e}")
                    await asyncio.sleep(1.0)
            else:
                raise RuntimeError("the nats-server could not be restarted")
            self.down += time.monotonic() - t0

    async def heal(self, broker: Broker) -> None:
        """Nothing to do: every fault restarts the server before it returns."""
        del broker

    def summary(self) -> tuple[str, str]:
        return "nats-server down", f"{self.down:.1f} s in total"


class ClusterNats:
    """A 3-node ``LocalCluster`` on loopback; streams are R3 (``replicas``)."""

    replicas = 3
    kinds = ("kill_node", "restart_nats")

    def __init__(self, root: Path, *, size: int = 3) -> None:
        self.cluster = LocalCluster(root, size=size)
        self.lock = asyncio.Lock()
        self.down = 0.0
        """Seconds during which a node was down, in total (one node at a time)."""
        self.whole_down = 0.0
        """Seconds during which the whole cluster was down (``restart_nats``)."""
        self.kills: Counter[str] = Counter()
        """Node kills by role: ``events leader``, ``other node``, ``whole cluster``."""
        self.catch_up: list[float] = []
        """Seconds from a node's restart until it was current on every stream."""
        self.slow_catch_up = 0
        self.events_stream = ""
        self.streams: list[str] = []
        """Every stream of the deployment (set by the harness once it knows its names)."""

    @property
    def url(self) -> str:
        return self.cluster.urls

    async def start(self) -> None:
        await self.cluster.start()

    async def stop(self) -> None:
        self.cluster.stop()

    async def _victim(self, rng: random.Random, broker: Broker) -> tuple[int, str]:
        """The events stream's leader half of the time (if one is known), else any node."""
        size = len(self.cluster.nodes)
        if rng.random() < 0.5:
            try:
                async with asyncio.timeout(5):
                    leader = await self.cluster.stream_leader(broker, self.events_stream)
                return leader, "events leader"
            except (AssertionError, TimeoutError, *BROKER_ERRORS):
                pass  # no leader right now (an election): fall through to any node
        return rng.randrange(size), "other node"

    async def inject(self, kind: str, rng: random.Random, broker: Broker) -> None:
        if kind == "kill_node":
            await self._kill_node(rng, broker)
        elif kind == "restart_nats":
            await self._restart_all(rng, broker)
        else:
            raise ValueError(kind)

    async def _kill_node(self, rng: random.Random, broker: Broker) -> None:
        async with self.lock:
            assert not self.cluster.down, f"nodes down before a kill: {self.cluster.down}"
            index, role = await self._victim(rng, broker)
            if role == "other node":  # it may still be the leader, by chance: say so
                try:
                    async with asyncio.timeout(5):
                        if await self.cluster.stream_leader(broker, self.events_stream) == index:
                            role = "events leader"
                except (AssertionError, TimeoutError, *BROKER_ERRORS):
                    pass
            t0 = time.monotonic()
            self.cluster.kill(index)
            self.kills[role] += 1
            await asyncio.sleep(rng.uniform(0.2, 2.0))
            await self.cluster.restart(index)  # waits until the cluster is healthy
            self.down += time.monotonic() - t0
            t1 = time.monotonic()
            try:
                await self.cluster.wait_caught_up(broker, self.streams, index, timeout=60)
                self.catch_up.append(time.monotonic() - t1)
            except AssertionError as e:
                # Not a violation (nothing was lost); but the next kill could then stall
                # writes until it catches up, so it is reported.
                self.slow_catch_up += 1
                _log(f"  {e}")

    async def _restart_all(self, rng: random.Random, broker: Broker) -> None:
        async with self.lock:
            t0 = time.monotonic()
            for node in self.cluster.nodes:
                self.cluster.kill(node.index)
            self.kills["whole cluster"] += 1
            await asyncio.sleep(rng.uniform(0.1, 1.0))
            await self.cluster.start()  # same ports and stores; waits until healthy
            await self.cluster.wait_stream_leaders(broker, self.streams)
            self.whole_down += time.monotonic() - t0

    async def heal(self, broker: Broker) -> None:
        """Every node up, the cluster healthy, every stream led by a running node."""
        async with self.lock:
            for index in self.cluster.down:
                await self.cluster.restart(index)
            await self.cluster.wait_healthy()
            await self.cluster.wait_stream_leaders(broker, self.streams)

    def summary(self) -> tuple[str, str]:
        kills = ", ".join(f"{k} {v}" for k, v in sorted(self.kills.items())) or "none"
        caught = f"caught up in max {max(self.catch_up):.1f} s" if self.catch_up else "no catch-up"
        if self.slow_catch_up:
            caught += f", {self.slow_catch_up} not within 60 s"
        text = f"{sum(self.kills.values())} ({kills}); one node down {self.down:.1f} s in total"
        if self.whole_down:
            text += f", all down {self.whole_down:.1f} s"
        return "node kills", f"{text}; {caught}"
