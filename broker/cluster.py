"""A loopback JetStream cluster (3 nodes by default), for development, tests and benchmarks.

Loopback only, temporary stores: every node is a real ``nats-server`` process (the binary
``find_nats_server`` finds) with its own client, cluster-route and monitoring ports on
127.0.0.1 and its own store directory under the ``root`` it is given. No TLS, no auth, no
persistence beyond ``root``: it exists so that tests, ``bench.chaos --cluster`` and a developer
can kill, restart and drain nodes of a real cluster on one machine. It is not a way to deploy
one (``deploy/nats/`` documents that; the configuration here is the same, shrunk to loopback).

A cluster forms only after the routes connect and a JetStream meta leader is elected:
``wait_healthy`` waits on exactly that, never on a fixed sleep.

Example:
    cluster = LocalCluster(tmp_path)
    await cluster.start()
    broker = await Broker.connect(cluster.urls)  # every node's URL, comma-separated
    cluster.kill(await cluster.stream_leader(broker, "X_EVENTS"))
    await cluster.restart(...)                   # same ports, same store
    cluster.stop()
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .connection import BROKER_ERRORS, Broker
from .server import die_with_parent, find_nats_server

__all__ = ["LocalCluster", "Node"]

CLUSTER_NAME = "sojourn-local"
_NOT_YET: tuple[type[BaseException], ...] = (AssertionError, *BROKER_ERRORS)
"""What asking for a stream's leader raises while the survivors are still electing one."""
_LIVE: set[int] = set()


def _kill_leftovers() -> None:
    for pid in list(_LIVE):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


atexit.register(_kill_leftovers)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Node:
    """One member: its name, ports, store, and the process while it runs."""

    index: int
    name: str
    port: int
    cluster_port: int
    http_port: int
    store: Path
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LocalCluster:
    """Three (``size``) nats-server processes forming one JetStream cluster on loopback.

    Args:
        root: directory for each node's config, log and store (``<root>/n<i>/``).
        size: number of nodes.
        sync_interval: JetStream's fsync interval on every node (``always``, as deploy/nats/).
        lame_duck_duration: how long a node in lame duck mode takes to let its clients go
            (nats-server's minimum is 30 s).
    """

    def __init__(
        self,
        root: Path,
        *,
        size: int = 3,
        sync_interval: str = "always",
        lame_duck_duration: str = "30s",
    ) -> None:
        self.root = root
        self.binary = find_nats_server()
        self.sync_interval = sync_interval
        self.lame_duck_duration = lame_duck_duration
        self.nodes = [
            Node(i, f"n{i + 1}", _free_port(), _free_port(), _free_port(), root / f"n{i + 1}")
            for i in range(size)
        ]

    @property
    def urls(self) -> str:
        """Every node's client URL, comma-separated, as ``--nats`` and ``Broker.connect`` take."""
        return ",".join(n.url for n in self.nodes)

    @property
    def down(self) -> list[int]:
        """The indexes of the nodes not running now."""
        return [n.index for n in self.nodes if not n.running]

    def node_named(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def _config(self, node: Node) -> str:
        routes = ", ".join(f'"nats-route://127.0.0.1:{n.cluster_port}"' for n in self.nodes)
        return "\n".join(
            [
                f'server_name: "{node.name}"',
                f'listen: "127.0.0.1:{node.port}"',
                f'http: "127.0.0.1:{node.http_port}"',
                "max_payload: 8MB",
                f'lame_duck_duration: "{self.lame_duck_duration}"',
                'lame_duck_grace_period: "1s"',
                "jetstream {",
                f"  store_dir: {json.dumps(str(node.store))}",
                f"  sync_interval: {self.sync_interval}",
                "  max_memory_store: 256MB",
                "  max_file_store: 2GB",
                "}",
                "cluster {",
                f'  name: "{CLUSTER_NAME}"',
                f'  listen: "127.0.0.1:{node.cluster_port}"',
                f"  routes: [{routes}]",
                "}",
                "",
            ]
        )

    # --- processes ------------------------------------------------------------------------------

    def _launch(self, node: Node) -> None:
        node.store.mkdir(parents=True, exist_ok=True)
        conf = node.store / "nats.conf"
        conf.write_text(self._config(node), encoding="utf-8")
        node.log = (node.store / "nats.log").open("ab")
        node.proc = subprocess.Popen(
            [self.binary, "-c", str(conf)],
            stdin=subprocess.DEVNULL,
            stdout=node.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        _LIVE.add(node.proc.pid)

    def _reap(self, node: Node, timeout: float = 30.0) -> None:
        if node.proc is not None:
            node.proc.wait(timeout)
            _LIVE.discard(node.proc.pid)
        if node.log is not None:
            node.log.close()
        node.proc, node.log = None, None

    async def start(self) -> LocalCluster:
        """Start every node; return once the cluster is healthy."""
        for node in self.nodes:
            self._launch(node)
        await self.wait_healthy()
        return self

    def kill(self, index: int) -> None:
        """SIGKILL node ``index``: a crash, nothing flushed."""
        node = self.nodes[index]
        if node.running:
            assert node.proc is not None
            node.proc.kill()
        self._reap(node)

    async def restart(self, index: int) -> None:
        """Start node ``index`` again (after ``kill`` or ``lame_duck``) on its ports and store,
        and wait until the cluster is healthy again."""
        node = self.nodes[index]
        if node.running:
            raise RuntimeError(f"{node.name} is running")
        self._reap(node)
        self._launch(node)
        await self.wait_healthy()

    def lame_duck(self, index: int) -> None:
        """Put node ``index`` in lame duck mode (SIGUSR2, what ``nats-server --signal ldm=PID``
        sends): it stops accepting clients, moves its leaderships away, lets its clients go
        over ``lame_duck_duration``, then exits."""
        node = self.nodes[index]
        assert node.proc is not None and node.running
        node.proc.send_signal(signal.SIGUSR2)

    async def wait_exited(self, index: int, timeout: float = 60.0) -> None:
        node = self.nodes[index]
        proc = node.proc
        assert proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while proc.poll() is None:
            if loop.time() > deadline:
                raise AssertionError(f"{node.name} did not exit within {timeout}s")
            await asyncio.sleep(0.1)
        self._reap(node)

    def stop(self) -> None:
        """Kill every node (also from a finalizer: synchronous, never raises)."""
        for node in self.nodes:
            with contextlib.suppress(Exception):
                if node.running:
                    assert node.proc is not None
                    node.proc.kill()
                self._reap(node, timeout=10)

    # --- health ---------------------------------------------------------------------------------

    def _get(self, node: Node, path: str) -> tuple[int, Any]:
        url = f"http://127.0.0.1:{node.http_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, {}
        except (OSError, ValueError):
            return 0, {}

    async def monitor(self, index: int, path: str) -> tuple[int, Any]:
        """GET ``path`` on node ``index``'s monitoring port: ``(status, JSON)``, 0 if down."""
        return await asyncio.to_thread(self._get, self.nodes[index], path)

    async def healthy(self) -> bool:
        """Every running node answers ``/healthz?js-enabled-only=true`` with 200, sees all its
        routes, all agree on one JetStream meta leader, and the leader sees every other running
        node as a current, online peer."""
        leaders = set()
        for node in self.nodes:
            if not node.running:
                continue
            code, _ = await self.monitor(node.index, "/healthz?js-enabled-only=true")
            if code != 200:
                return False
            _, jsz = await self.monitor(node.index, "/jsz")
            leader = (jsz.get("meta_cluster") or {}).get("leader")
            if not leader:
                return False
            leaders.add(leader)
        running = {n.name for n in self.nodes if n.running}
        if len(leaders) != 1 or not leaders <= running:
            return False
        # The meta leader places streams on the peers it believes online and current: until
        # it has heard from every node, creating an R3 stream fails ("peer offline").
        _, jsz = await self.monitor(self.node_named(leaders.pop()).index, "/jsz")
        meta = jsz.get("meta_cluster") or {}
        current = {
            str(r.get("name"))
            for r in meta.get("replicas") or []
            if r.get("current") and not r.get("offline")
        }
        return running - {meta.get("leader")} <= current

    async def wait_healthy(self, timeout: float = 60.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not await self.healthy():
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is not None:
                    tail = (node.store / "nats.log").read_text(errors="replace")[-2000:]
                    raise AssertionError(f"{node.name} exited: {tail}")
            if loop.time() > deadline:
                raise AssertionError(f"the cluster was not healthy within {timeout}s")
            await asyncio.sleep(0.1)

    # --- streams --------------------------------------------------------------------------------

    @staticmethod
    async def stream_cluster(broker: Broker, stream: str) -> dict[str, Any]:
        """The ``cluster`` part of the stream's info: ``leader`` and ``replicas``."""
        info = await broker.api(f"$JS.API.STREAM.INFO.{stream}")
        cluster: dict[str, Any] = info.get("cluster") or {}
        return cluster

    async def wait_stream_leaders(
        self, broker: Broker, streams: list[str], timeout: float = 60.0
    ) -> None:
        """Wait until every one of ``streams`` has a leader among the running nodes (after a
        node loss, the survivors elect one within a few seconds)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for stream in streams:
            while True:
                try:
                    if self.nodes[await self.stream_leader(broker, stream)].running:
                        break
                except _NOT_YET:
                    pass
                if loop.time() > deadline:
                    raise AssertionError(f"stream {stream} had no leader within {timeout}s")
                await asyncio.sleep(0.1)

    async def stream_leader(self, broker: Broker, stream: str) -> int:
        """The index of the node that leads ``stream`` now."""
        leader = (await self.stream_cluster(broker, stream)).get("leader")
        if not leader:
            raise AssertionError(f"stream {stream} has no leader")
        return self.node_named(str(leader)).index

    async def wait_caught_up(
        self, broker: Broker, streams: list[str], index: int, timeout: float = 60.0
    ) -> None:
        """Wait until node ``index`` holds every one of ``streams`` and is current with each
        leader (after ``restart``: until then, losing another node could stall writes while
        the survivors wait for it to catch up)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for stream in streams:
            while True:
                try:
                    if await self.replica_current(broker, stream, index):
                        break
                except BROKER_ERRORS:
                    pass
                if loop.time() > deadline:
                    name = self.nodes[index].name
                    raise AssertionError(f"{name} did not catch up on {stream} within {timeout}s")
                await asyncio.sleep(0.1)

    async def replica_current(self, broker: Broker, stream: str, index: int) -> bool:
        """Whether node ``index`` holds ``stream`` and is caught up with its leader."""
        cluster = await self.stream_cluster(broker, stream)
        name = self.nodes[index].name
        if cluster.get("leader") == name:
            return True
        for r in cluster.get("replicas") or []:
            if r.get("name") == name:
                return bool(r.get("current")) and not r.get("offline")
        return False
