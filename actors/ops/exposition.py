"""``/metrics`` (the Prometheus registry, ``ops/metrics.py``) and the health probes
``/healthz`` and ``/readyz`` (``ops/health.py``), served on one port in background threads."""

from __future__ import annotations

import socket
import threading
import weakref
from typing import Any
from wsgiref.simple_server import make_server

from prometheus_client import REGISTRY, make_wsgi_app

from sojourn.schemas.errors import SojournError

from .health import PROCESS_HEALTH, Health, ProbeApp, ProbeRequestHandler, ProbeServer

__all__ = ["serve_metrics", "stop_metrics"]


def serve_metrics(port: int, host: str = "127.0.0.1", health: Health = PROCESS_HEALTH) -> Any:
    """Serve ``/metrics``, and the probes ``/healthz`` and ``/readyz`` of ``health``
    (``actors/ops/health.py``), on ``host:port`` in background threads; returns the server.

    Called on the event loop (as the serving commands do), it starts ``health`` ticking there:
    the probes judge what that loop last recorded.

    Raises:
        SojournError: the port is taken or the address is not ours, said plainly.
    """

    class Server(ProbeServer):
        """A class per server: the address family is a class attribute."""

    try:
        Server.address_family, addr = _best_family(host, port)
        server = make_server(
            addr,
            port,
            ProbeApp(make_wsgi_app(REGISTRY), health),
            Server,
            handler_class=ProbeRequestHandler,
        )
    except OSError as e:
        raise SojournError(
            f"cannot serve metrics on {host}:{port}: {e.strerror or e}; choose another "
            "--metrics-port"
        ) from e
    health.start()
    _served[server] = health
    threading.Thread(target=server.serve_forever, name="sojourn-metrics", daemon=True).start()
    return server


def _best_family(host: str, port: int) -> tuple[socket.AddressFamily, str]:
    """The address family of ``host`` (an IPv6 address needs AF_INET6), as prometheus-client
    chooses it."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    return family, str(sockaddr[0])


_served: weakref.WeakKeyDictionary[Any, Health] = weakref.WeakKeyDictionary()


def stop_metrics(server: Any) -> None:
    """Stop serving, close the listening socket and stop the health ticks it started."""
    server.shutdown()
    server.server_close()
    health = _served.pop(server, None)
    if health is not None:
        health.stop()
